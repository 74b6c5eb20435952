"""``python -m pyfastensor ckpt``: list and verify checkpoint files.

It sits beside the :mod:`pyfastensor.checkpoint` package, not in it: importing
that package imports torch, and the command line's ``--help`` must not.
"""

from __future__ import annotations

import argparse
import ctypes
import time

from .errors import CorruptFileError


def _cmd_ls(args: argparse.Namespace) -> int:
    from .checkpoint._native import Archive

    with Archive(args.path) as a:
        print(f"{args.path}: {a.size} bytes, {len(a.entries)} records")
        for e in a.entries:
            print(f"  {e.offset:>12}  {e.size:>12}  {e.crc32:08x}  {e.name}")
    if args.keys:
        from .checkpoint.lazy import open as open_ckpt

        with open_ckpt(args.path, weights_only=not args.unsafe) as ck:
            for k, v in ck.skeleton.items() if isinstance(ck.skeleton, dict) else []:
                shape = f"{tuple(v.shape)} {v.dtype}" if hasattr(v, "shape") else type(v).__name__
                print(f"  {k}: {shape}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .checkpoint._native import Archive

    start = time.perf_counter()
    try:
        with Archive(args.path) as a:
            bufs = [ctypes.create_string_buffer(max(e.size, 1)) for e in a.entries]
            a.read([(i, ctypes.addressof(b), e.size) for i, (e, b) in enumerate(zip(a.entries, bufs, strict=True))])
            total = sum(e.size for e in a.entries)
    except CorruptFileError as e:
        print(f"CORRUPT: {e}")
        return 1
    print(f"OK: {args.path}: {len(a.entries)} records, {total} bytes, every CRC-32 matches "
          f"({time.perf_counter() - start:.2f} s)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``ckpt ls`` and ``ckpt verify`` to the command line."""
    p = sub.add_parser("ckpt", help="list and verify checkpoint files (torch zip format)")
    ck = p.add_subparsers(dest="ckpt", metavar="ACTION", required=True)
    ls = ck.add_parser("ls", help="records (offset, size, CRC-32, name); --keys for tensors")
    ls.add_argument("path")
    ls.add_argument("--keys", action="store_true", help="also unpickle the skeleton and list keys")
    ls.add_argument("--unsafe", action="store_true", help="with --keys: full unpickler (trusted files only)")
    ls.set_defaults(func=_cmd_ls)
    v = ck.add_parser("verify", help="check the zip structure and every record's CRC-32")
    v.add_argument("path")
    v.set_defaults(func=_cmd_verify)
