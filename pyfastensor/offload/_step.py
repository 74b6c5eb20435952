"""One step of an offload object: what it saved, and what it counted."""

from __future__ import annotations

import time
import weakref
from typing import Any

from ._recast import Casts
from ._saved import Entry

#: The saved tensors a step counts, by what became of them.
COUNTS = ("saved", "offloaded", "staged", "resident", "skipped", "dedup", "recast", "recomputed")


class Step:
    """The state of one step (one entry of the context), made anew at each entry.

    Attributes:
        live: the entries by storage key (address, size, version, device):
            the same storage saved twice is stored once.
        entries: every entry of the step, by pack index (weakly: autograd
            owns them).
        unpack_log: pack indices in the order backward first unpacked them.
        counts: saved tensors by what became of them (:data:`COUNTS`).
        raw_bytes: bytes of the tensors stored, before any codec.
        staged_bytes: bytes of the tensors staged to the host tier.
        recast_bytes: bytes of the parameters' casts made again in backward instead of stored.
        codec_bytes: by codec: [bytes before, bytes stored].
        pack_seconds, unpack_seconds: time spent in the hooks.
        stash_hits, stash_bytes: unpacks served from the forward stash, and their bytes.
        casts: which saved casts of parameters are made again in backward (:class:`Casts`).
        sources: ``policy="auto"``: entries later recipes read, by pack index, with their saved
            tensors' versions (held until those recipes are bound: each bound recipe holds what
            it reads, and the step lets go of what no recipe still to come reads).
        kept_sources: ``policy="auto"``: small saved tensors later recipes read, by pack call number.
        reads_left: how many reads of each of those (``("entry", index)``, ``("kept", seq)``) the
            recipes still to be bound make.
        recompute_bytes: bytes of the storages made again instead of kept or stored.
        started: when the step began (``time.perf_counter``).
    """

    def __init__(self) -> None:
        self.live: weakref.WeakValueDictionary[Any, Entry] = weakref.WeakValueDictionary()
        self.entries: list[weakref.ref[Entry]] = []
        self.unpack_log: list[int] = []
        self.counts = dict.fromkeys(COUNTS, 0)
        self.raw_bytes = 0
        self.staged_bytes = 0
        self.recast_bytes = 0
        self.codec_bytes: dict[str, list[int]] = {}
        self.pack_seconds = 0.0
        self.unpack_seconds = 0.0
        self.stash_hits = 0
        self.stash_bytes = 0
        self.casts = Casts()
        self.sources: dict[int, tuple[Any, Any]] = {}
        self.kept_sources: dict[int, Any] = {}
        self.reads_left: dict[tuple[str, int], int] = {}
        self.recompute_bytes = 0
        self.recompute_seconds = 0.0
        self.started = time.perf_counter()
        self.ended: float | None = None

    def hold_source(self, kind: str, key: int, value: Any, reads: int) -> None:
        """Hold ``value`` (``kind`` "entry": ``(entry, version)``; "kept": a small saved tensor)
        for the ``reads`` reads the recipes still to be bound make of it."""
        (self.sources if kind == "entry" else self.kept_sources)[key] = value
        self.reads_left[(kind, key)] = reads

    def read_by(self, recipe: Any) -> None:
        """``recipe`` (a :class:`~._graph.Recipe`) was bound, or could not be: the sources it reads
        are held for that many reads fewer, and let go once none is left (a bound recipe holds
        what it reads itself, until its own storage is made again)."""
        for lf in recipe.leaves.values():
            key = (lf.kind, lf.key)
            left = self.reads_left.get(key)
            if left is None:
                continue
            if left > 1:
                self.reads_left[key] = left - 1
                continue
            del self.reads_left[key]
            (self.sources if lf.kind == "entry" else self.kept_sources).pop(lf.key, None)
