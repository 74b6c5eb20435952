"""The adaptive dictionaries that choose an I/O engine per transfer size.

Fastensor's three dictionaries live in the Go core (``gds/dict.go``): the
write dictionary (WDic), the read dictionary (RDic) and the write+read
dictionary (WRDic, for data written once and read back once). Each maps a
size bucket (powers of two, 4 KiB and below in one bucket) to the time each
candidate engine takes for a transfer of the bucket's size, and the best
engine. They are kept as JSON in the user cache directory
(:func:`pyfastensor.config.cache_dir`), one file per machine and
filesystem; :func:`dictionary_path` says which.

This module reads, prints and removes those files, and opens dictionaries
for code that picks engines itself (:class:`Dictionaries`).
``python -m pyfastensor dict show`` prints them.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
from pathlib import Path
from types import TracebackType
from typing import Any

from . import _lib, config

_OPS = {"write": 0, "read": 1}
_USES = {"separate": 0, "write_read": 1, "write": 2, "read": 3}
_TABLES = (("write", "write (WDic)"), ("read", "read (RDic)"), ("write_read", "write+read (WRDic)"))
_ORDER = ("posix", "direct", "uring", "mmap", "cufile")

PathLike = str | os.PathLike[str]


def locate(directory: PathLike = ".") -> dict[str, Any]:
    """Return the dictionary file of the filesystem holding ``directory``.

    Args:
        directory: a directory on the filesystem whose transfers the
            dictionaries describe. Default ``"."``.

    Returns:
        ``{"path": ..., "key": {...}}``: the file under
        :func:`pyfastensor.config.cache_dir` and the machine key it is named
        after (host, CPU brand, filesystem type, mount source and point,
        device number).

    Example::

        >>> import pyfastensor.dictionary as pd
        >>> pd.locate("/tmp")["key"]["fs_type"]
        'ext4'
    """
    return _lib.call_json("pft_dict_path", _lib.cstr(config.cache_dir()), _lib.cstr(directory))


def dictionary_path(directory: PathLike = ".") -> Path:
    """Return the path of the dictionary file for ``directory``'s filesystem (see :func:`locate`)."""
    return Path(locate(directory)["path"])


def _resolve(path: PathLike | None, directory: PathLike) -> Path:
    return Path(path) if path is not None else dictionary_path(directory)


def load(path: PathLike | None = None, *, directory: PathLike = ".") -> dict[str, Any]:
    """Read a dictionary file.

    Reading is tolerant, as training is: a corrupt file or one of another
    schema version yields empty dictionaries and a warning; entries naming
    engines this library does not know are dropped with a warning.

    Args:
        path: the file; None means this machine's file for ``directory``.
        directory: used when ``path`` is None. Default ``"."``.

    Returns:
        ``{"path": ..., "dictionaries": {...}, "warnings": [...]}`` where
        ``dictionaries`` holds ``key``, ``settings`` and the ``write``,
        ``read`` and ``write_read`` entries (``bucket``, ``size``,
        ``engines`` with ``seconds`` and ``samples``, ``best``).

    Raises:
        NotFoundError: when the file does not exist (no dictionary was saved
            for this machine and filesystem yet).
    """
    p = _resolve(path, directory)
    result: dict[str, Any] = _lib.call_json("pft_dict_load", _lib.cstr(p))
    result["path"] = str(p)
    return result


def reset(path: PathLike | None = None, *, directory: PathLike = ".") -> Path | None:
    """Remove a dictionary file, so the next run explores afresh.

    Args:
        path: the file; None means this machine's file for ``directory``.
        directory: used when ``path`` is None. Default ``"."``.

    Returns:
        The path removed, or None when there was none.
    """
    p = _resolve(path, directory)
    try:
        p.unlink()
    except FileNotFoundError:
        return None
    return p


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.3f} s"


def _size(n: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= scale:
            v = n / scale
            return f"{v:.0f}{unit}" if v == int(v) else f"{v:.1f}{unit}"
    return str(n)


def format_table(doc: dict[str, Any]) -> str:
    """Format dictionaries (``load(...)["dictionaries"]``) as text tables.

    One table per dictionary: a row per bucket with its size, each engine's
    time for a transfer of that size and its sample count, and the best
    engine.
    """
    lines: list[str] = []
    key = doc.get("key") or {}
    if key.get("host"):
        lines.append(f"machine  {key['host']} ({key.get('cpu', '')}), {key.get('fs_type', '')} "
                     f"on {key.get('source', '')} at {key.get('mount', '')}")
    s = doc.get("settings") or {}
    if s.get("mode"):
        lines.append(f"settings mode {s.get('mode', '')}, explore {s.get('explore', 0)}, "
                     f"refresh {s.get('refresh', 0) or 'never'}, updated {doc.get('updated', '')}")
    for field, title in _TABLES:
        entries = doc.get(field) or []
        lines.append("")
        lines.append(title)
        if not entries:
            lines.append("  (empty)")
            continue
        names = sorted({n for e in entries for n in (e.get("engines") or {})},
                       key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))
        header = ["bucket", *names, "best"]
        rows = []
        for e in entries:
            engines = e.get("engines") or {}
            cells = [_size(int(e["size"]))]
            for n in names:
                st = engines.get(n)
                cells.append(f"{_seconds(st['seconds'])} ({st['samples']})" if st else "-")
            cells.append(e.get("best") or "-")
            rows.append(cells)
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
        for r in [header, *rows]:
            lines.append("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    lines.append("")
    lines.append("times: a transfer of the bucket's size (samples in brackets)")
    return "\n".join(lines)


class Dictionaries:
    """Adaptive dictionaries opened in the native library.

    Engine choice and observation are cheap native calls and safe from many
    threads. Changed dictionaries (aware mode) are saved in the background
    at most every ``save_interval`` seconds and at :meth:`close`.

    Args:
        path: the JSON file; None means this machine's file for
            ``directory``, and ``""`` keeps the dictionaries in memory.
        directory: the filesystem served: its candidate engines and the
            machine key. Default ``"."``.
        mode: ``"aware"`` (explore, then exploit; the default), ``"dict"``
            (use the file as it is) or ``"tool"`` (one engine for all sizes).
        tool: the engine of ``"tool"`` mode.
        write, read: candidate engines per direction, the first the
            fallback; None means the engines that work in ``directory``.
        explore: samples of every candidate per bucket before exploiting.
            Default 1.
        refresh: every ``refresh``-th transfer of a bucket re-explores one
            non-best engine; 0 (default) never.
        save_interval: seconds between background saves; negative saves
            only at :meth:`save` and :meth:`close`. Default 30.

    Example::

        >>> with Dictionaries(directory="/tmp", path="") as d:
        ...     e = d.engine("write", 1 << 20)
        ...     d.observe("write", 1 << 20, e, 0.001)
    """

    def __init__(
        self,
        path: PathLike | None = None,
        *,
        directory: PathLike = ".",
        mode: str = "aware",
        tool: str = "",
        write: list[str] | None = None,
        read: list[str] | None = None,
        explore: int = 0,
        refresh: int = 0,
        save_interval: float = 30.0,
    ) -> None:
        if mode not in ("aware", "dict", "tool"):
            raise ValueError(f"mode={mode!r}: expected 'aware', 'dict' or 'tool'")
        if mode == "tool" and not tool:
            raise ValueError("mode='tool' needs tool=, e.g. tool='direct'")
        p = "" if path == "" else str(_resolve(path, directory))
        cfg = {
            "mode": mode, "tool": tool, "path": p, "dir": os.fspath(directory),
            "write": write, "read": read, "explore": explore, "refresh": refresh,
            "save_interval_ms": int(save_interval * 1000) if save_interval >= 0 else -1,
        }
        h = _lib.u64()
        _lib.call("pft_dict_open", json.dumps(cfg).encode(), ctypes.byref(h))
        self._handle: int | None = h.value
        self.path = p
        _lib.close_at_exit(self)  # what was observed since the last save is saved at exit too

    def _live(self) -> int:
        if self._handle is None:
            raise ValueError("the dictionaries are closed")
        return self._handle

    def decide(self, op: str, size: int, *, use: str = "separate") -> dict[str, Any]:
        """Choose the engine for a transfer, with the reason.

        Args:
            op: ``"write"`` or ``"read"``.
            size: bytes.
            use: ``"separate"`` (WDic for writes, RDic for reads; default),
                ``"write_read"`` (WRDic for both), ``"write"`` (WDic for both)
                or ``"read"`` (RDic for both).

        Returns:
            ``{"engine", "bucket", "exploring", "reason"}``.
        """
        if op not in _OPS or use not in _USES:
            raise ValueError(f"op={op!r}, use={use!r}: expected op in {list(_OPS)}, use in {list(_USES)}")
        return _lib.call_json("pft_dict_decide", self._live(), _USES[use], _OPS[op], size)

    def engine(self, op: str, size: int, *, use: str = "separate") -> str:
        """The engine name of :meth:`decide`."""
        return str(self.decide(op, size, use=use)["engine"])

    def _view(self, use: str) -> dict[str, int]:
        """The native options that hand this view to a spill store: the handle and the use, as integers."""
        if use not in _USES:
            raise ValueError(f"use={use!r}: expected one of {list(_USES)}")
        return {"dict": self._live(), "dict_use": _USES[use]}

    def observe(self, op: str, size: int, engine: str, seconds: float) -> None:
        """Report that a transfer of ``size`` bytes took ``seconds`` with ``engine``."""
        if op not in _OPS:
            raise ValueError(f"op={op!r}: expected 'write' or 'read'")
        _lib.call("pft_dict_observe", self._live(), _OPS[op], size, engine.encode(), int(seconds * 1e9))

    def describe(self) -> dict[str, Any]:
        """The dictionaries (file layout), load warnings, candidates and excluded engines."""
        return _lib.call_json("pft_dict_describe", self._live())

    def save(self) -> None:
        """Save now (aware mode with a path; otherwise nothing to do)."""
        _lib.call("pft_dict_save", self._live())

    def close(self) -> None:
        """Save changed dictionaries and release them. Idempotent."""
        if self._handle is not None:
            h, self._handle = self._handle, None
            _lib.call("pft_dict_close", h)

    def __enter__(self) -> Dictionaries:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``dict show|path|reset`` to the command line."""
    p = sub.add_parser(
        "dict", help="the adaptive engine dictionaries (WDic, RDic, WRDic)",
        description="The dictionaries that choose an I/O engine per transfer size, learned on this machine "
        "and kept in one file per filesystem (under ~/.cache/pyfastensor). Example: "
        "python -m pyfastensor dict show --dir /data/ckpt")
    dsub = p.add_subparsers(dest="dict_command", metavar="ACTION", required=True)
    for name, help_text in (("show", "print the dictionaries as tables: per size bucket, each engine's "
                                     "time and samples, and the engine chosen"),
                            ("path", "print this machine's dictionary file for DIR's filesystem"),
                            ("reset", "remove the dictionary file (the next run explores afresh)")):
        q = dsub.add_parser(name, help=help_text, description=help_text[0].upper() + help_text[1:] + ".")
        q.add_argument("--dir", default=".", help="a directory on the filesystem (default: .)")
        if name != "path":
            q.add_argument("--path", default=None, help="a dictionary file (default: this machine's)")
        if name == "show":
            q.add_argument("--json", action="store_true", help="print the raw JSON")
        q.set_defaults(func=_cmd_dict)


def _cmd_dict(args: argparse.Namespace) -> int:
    if args.dict_command == "path":
        print(dictionary_path(args.dir))
        return 0
    if args.dict_command == "reset":
        removed = reset(args.path, directory=args.dir)
        print(f"removed {removed}" if removed else "no dictionary file to remove")
        return 0
    p = _resolve(args.path, args.dir)
    if args.path is None and not p.exists():  # this machine's file, not written yet: nothing wrong
        if args.json:
            print(json.dumps({"path": str(p), "exists": False, "dictionaries": None, "warnings": []}, indent=2))
        else:
            print(f"no dictionary file yet: {p} (the first save or load on this filesystem that chooses "
                  "an engine by size writes it)")
        return 0
    result = load(p)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"dictionary {result['path']}")
    for w in result["warnings"]:
        print(f"warning: {w}")
    print(format_table(result["dictionaries"]))
    return 0
