"""Which engine moves a rank's bytes: one shared dictionary on homogeneous nodes.

``engine="dictionaries"`` asks for Fastensor's adaptive dictionaries (WDic for
writes, RDic for reads: :class:`pyfastensor.dictionary.Dictionaries`). With a
process group, the ranks first compare what :func:`pyfastensor.info` says of
their machine and of the checkpoint's filesystem (CPU, filesystem type,
O_DIRECT and its alignment, io_uring, GDS, the engines available). Where all
agree, rank 0's dictionary file is the one used, broadcast to every rank (the
Fastensor paper, section 4.3: one node measures, all use it); rank 0 goes on
learning into its file, the others use its figures as they are. Where nodes
differ, each rank uses its own machine's dictionaries.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from .. import info
from ..dictionary import Dictionaries

#: The engine argument that asks for the shared adaptive dictionaries.
DICTIONARIES = "dictionaries"


def fingerprint(directory: str | os.PathLike[str]) -> str:
    """What must agree between nodes for one dictionary to serve them all, from
    :func:`pyfastensor.info`: CPU brand and features, the directory's probe (filesystem
    type, O_DIRECT and its alignment, io_uring, GDS) and the engines available. The
    host name is left out: identical nodes are homogeneous."""
    i = info(directory)
    d = i.get("dir") or {}
    probe = {k: d.get(k) for k in ("fs_type", "o_direct", "dio_mem_align", "dio_offset_align", "io_uring", "cufile")}
    cpu = i.get("cpu") or {}
    engines = {k: bool(v.get("available")) for k, v in (i.get("engines") or {}).items()}
    return json.dumps({"cpu": [cpu.get("brand"), sorted(cpu.get("features") or [])], "dir": probe,
                       "engines": engines}, sort_keys=True)


class Shared:
    """The engine argument of one save or load, and what must be closed after it.

    Attributes:
        engine: what the native calls take (None, an engine name, or Dictionaries).
        mode: how it was chosen, in words (``"default"``, ``"tool"``, ``"given"``,
            ``"broadcast from rank 0"``, ``"per rank (nodes differ)"``, ``"own"``).
    """

    def __init__(self, engine: Any, mode: str, owned: Dictionaries | None = None,
                 tmp: Path | None = None) -> None:
        self.engine = engine
        self.mode = mode
        self._owned = owned
        self._tmp = tmp

    def close(self) -> None:
        """Save what the owned dictionaries learned (aware mode) and release them."""
        if self._owned is not None:
            self._owned.close()
            self._owned = None
        if self._tmp is not None:
            self._tmp.unlink(missing_ok=True)
            self._tmp = None


def check(engine: Any) -> None:
    """Refuse an ``engine`` argument :func:`resolve` would not take, before any save or load."""
    if engine is not None and not isinstance(engine, str | Dictionaries):
        raise TypeError(f"engine={engine!r}: expected None, an engine name, "
                        f"{DICTIONARIES!r} or pyfastensor.dictionary.Dictionaries")


def resolve(engine: Any, directory: str | os.PathLike[str], rank: int | None) -> Shared:
    """Turn a Writer's or Reader's ``engine`` into the engine of this rank.

    ``rank`` is the rank DCP gave the storage layer (None without a process group).
    With ``engine="dictionaries"`` and an initialized default process group whose
    rank is ``rank``, every rank must call this at the same point (it runs
    collectives).
    """
    if engine is None:
        return Shared(None, "default")
    if isinstance(engine, Dictionaries):
        return Shared(engine, "given")
    check(engine)
    if engine != DICTIONARIES:
        return Shared(engine, "tool")
    dist = _group(rank)
    if dist is None:
        d = Dictionaries(directory=directory)
        return Shared(d, "own", d)
    prints: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(prints, fingerprint(directory))
    if len(set(prints)) > 1:
        d = Dictionaries(directory=directory)
        return Shared(d, "per rank (nodes differ)", d)
    doc: list[Any] = [None]
    if dist.get_rank() == 0:
        d = Dictionaries(directory=directory)
        p = Path(d.path)
        doc[0] = p.read_bytes() if d.path and p.exists() else None
        dist.broadcast_object_list(doc, src=0)
        return Shared(d, "broadcast from rank 0", d)
    dist.broadcast_object_list(doc, src=0)
    if doc[0] is None:  # rank 0 has measured nothing yet: learn in memory meanwhile
        d = Dictionaries(path="", directory=directory)
        return Shared(d, "broadcast from rank 0 (empty)", d)
    fd, name = tempfile.mkstemp(prefix="pyfastensor-dcp-dict-", suffix=".json")
    with os.fdopen(fd, "wb") as f:
        f.write(doc[0])
    d = Dictionaries(name, directory=directory, mode="dict")
    return Shared(d, "broadcast from rank 0", d, Path(name))


def _group(rank: int | None) -> Any:
    """torch.distributed when the default group is up, has several ranks, and is the
    group DCP runs on (its rank is ``rank``); else None."""
    import torch.distributed as dist

    if rank is None or not dist.is_available() or not dist.is_initialized():
        return None
    if dist.get_world_size() < 2 or dist.get_rank() != rank:
        return None
    return dist
