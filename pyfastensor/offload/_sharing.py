"""The process's spill stores, shared by the offload objects that ask for the same one."""

from __future__ import annotations

import os
import tempfile
from typing import Any

from ._options import DICTIONARY_USE
from ._store import SpillStore, shared

#: Filesystems that are memory: ``tier="auto"`` uses the host tier on them.
MEMORY_FS = ("tmpfs", "ramfs")


def join(user: Any, *, tier: str, spill_dir: str | None, engine: str | None, dictionary: str) -> tuple[SpillStore, int]:
    """The process's store for ``user``'s tier, directory and engine choice, ``user`` now among its users.

    One store per (tier, real directory, engine, dictionary use): a new one
    when none is open. With ``tier="auto"``, a spill directory on memory
    (tmpfs) gets the host tier instead.

    Returns:
        The store, and ``user``'s account in it (its figures, apart from
        other users').
    """
    kind = "host" if tier == "host" else "ssd"
    directory = os.path.realpath(spill_dir or tempfile.gettempdir()) if kind == "ssd" else ""
    key = (tier, directory, engine, dictionary if engine is None else "")

    def open_store() -> SpillStore:
        if engine is None and kind == "ssd":
            store = SpillStore.with_dictionaries(spill_dir, DICTIONARY_USE[dictionary])
        else:
            store = SpillStore(kind, spill_dir, engine)
        if tier == "auto" and store.description.get("fs_type") in MEMORY_FS:
            store.close()
            store = SpillStore("host", None)
        return store

    store = shared(key, open_store)
    store.users.add(user)
    return store, store.account()


def leave(user: Any, store: SpillStore) -> None:
    """``user`` stops using ``store``, which closes when no other user is left."""
    store.users.discard(user)
    if not store.users:
        store.close()
