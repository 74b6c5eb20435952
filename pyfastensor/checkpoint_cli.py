"""``python -m pyfastensor ckpt``: list and verify checkpoint files.

It sits beside the :mod:`pyfastensor.checkpoint` package, not in it: importing
that package imports torch, and the command line's ``--help`` must not.
"""

from __future__ import annotations

import argparse
import pickle
import time

from .errors import CorruptFileError

#: Exit status of ``ckpt verify`` for a file with nothing it can check (torch's legacy format).
UNCHECKED = 2


def _legacy(path: str) -> str:
    """Why ``path`` has no records to list or check, when it is in torch's legacy format (a
    pickle stream, not a zip archive); else ''."""
    try:
        with open(path, "rb") as f:
            head = f.read(2)
    except OSError:
        return ""
    if head[:1] != b"\x80":  # a pickle's PROTO opcode; a zip archive starts with "PK"
        return ""
    return (f"{path}: torch's legacy format (torch.save with _use_new_zipfile_serialization=False): a pickle "
            "stream, with no records or CRC-32s to list or check; torch.load and pyfastensor.load read it")


def _cmd_ls(args: argparse.Namespace) -> int:
    from .checkpoint._native import Archive

    if why := _legacy(args.path):
        print(why)
        return 0
    with Archive(args.path) as a:
        print(f"{args.path}: {a.size} bytes, {len(a.entries)} records")
        for e in a.entries:
            print(f"  {e.offset:>12}  {e.size:>12}  {e.crc32:08x}  {e.name}")
    if args.keys:
        from .checkpoint.lazy import open as open_ckpt

        try:
            ck = open_ckpt(args.path, weights_only=not args.unsafe)
        except pickle.UnpicklingError as e:
            raise ValueError(f"{args.path}: the weights-only unpickler refuses it ({e}); "
                             "--unsafe lists it with the full unpickler (trusted files only)") from None
        with ck:
            for k, v in ck.skeleton.items() if isinstance(ck.skeleton, dict) else []:
                shape = f"{tuple(v.shape)} {v.dtype}" if hasattr(v, "shape") else type(v).__name__
                print(f"  {k}: {shape}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .checkpoint import _progress
    from .checkpoint._native import Archive
    from .checkpoint.load import _map

    if why := _legacy(args.path):
        print(f"UNCHECKED: {why}")
        return UNCHECKED
    start = time.perf_counter()
    try:
        with Archive(args.path) as a:
            # The records are summed where the file is mapped (the file the archive opened, as a
            # mapped load maps it): the page cache holds them, not this process, so a checkpoint
            # of any size is checked in bounded memory.
            mapped = _map(a.source, a.size)  # kept alive, mapped, until the sums are done
            records = [(i, mapped.data_ptr() + e.offset, e.size) for i, e in enumerate(a.entries) if e.size]
            total = sum(r[2] for r in records)
            _progress.run(lambda counter: a.verify(records, counter=counter), total, "verifying", None)
    except CorruptFileError as e:
        print(f"CORRUPT: {e}")
        return 1
    print(f"OK: {args.path}: {len(a.entries)} records, {total} bytes, every CRC-32 matches "
          f"({time.perf_counter() - start:.2f} s)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``ckpt ls`` and ``ckpt verify`` to the command line."""
    p = sub.add_parser("ckpt", help="list and verify checkpoint files (torch zip format)",
                       description="List and verify checkpoint files in torch's zip format, written by "
                       "pyfastensor.save or torch.save. Example: python -m pyfastensor ckpt verify model.pt")
    ck = p.add_subparsers(dest="ckpt", metavar="ACTION", required=True)
    ls = ck.add_parser("ls", help="records (offset, size, CRC-32, name); --keys for tensors",
                       description="List the file's records (offset, size, CRC-32, name); with --keys, also "
                       "each top-level key with its tensor's shape and dtype (or its type). Exit status: 0, or 1 when the file cannot "
                       "be read (its error printed).")
    ls.add_argument("path", help="the checkpoint file")
    ls.add_argument("--keys", action="store_true", help="also unpickle the skeleton and list keys")
    ls.add_argument("--unsafe", action="store_true", help="with --keys: full unpickler (trusted files only)")
    ls.set_defaults(func=_cmd_ls)
    v = ck.add_parser("verify", help="check the zip structure and every record's CRC-32",
                      description="Check the zip structure and every record's CRC-32. Exit status: 0 every "
                      f"record matches, 1 corrupt, {UNCHECKED} nothing to check (torch's legacy format).")
    v.add_argument("path", help="the checkpoint file")
    v.set_defaults(func=_cmd_verify)
