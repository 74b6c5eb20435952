"""``python -m pyfastensor data``: pack a dataset's files into chunks, and verify a pack.

It sits beside the :mod:`pyfastensor.data` package, as ``checkpoint_cli``
does beside its own: the parser is built without importing that package, so
``--help`` loads neither torch nor the Go library.
"""

from __future__ import annotations

import argparse
import json
import time


def _cmd_pack(args: argparse.Namespace) -> int:
    from .data.pack import pack, summary_line

    stats = pack(args.src, args.out, chunk_size=args.chunk_size, seed=args.seed, manifest=args.manifest,
                 progress=False if args.quiet else None)
    if args.json:
        print(json.dumps(stats, sort_keys=True))
    else:
        print(f"packed {args.out}: {summary_line(stats)}")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from .data.pack import size_text, verify
    from .errors import CorruptFileError

    start = time.perf_counter()
    try:
        s = verify(args.out, progress=False if args.quiet else None)
    except CorruptFileError as e:
        print(f"CORRUPT: {e}")
        return 1
    print(f"OK: {args.out}: {s['samples']} samples of {len(s['classes'])} classes in {s['chunks']} chunks "
          f"of {s['chunk_size']}, {size_text(s['data_bytes'])}, every CRC-32 matches "
          f"({time.perf_counter() - start:.2f} s)")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``data pack`` and ``data verify`` to the command line."""
    p = sub.add_parser("data", help="training data in chunks (Brand): pack a dataset, verify a pack",
                       description="Pack a dataset's files into chunk files that "
                       "pyfastensor.data.ChunkDataset reads whole (one sequential read per chunk), "
                       "and verify a pack's checksums.")
    acts = p.add_subparsers(dest="data", metavar="ACTION", required=True)

    pk = acts.add_parser(
        "pack", help="shuffle a dataset's files once and write them as chunk files plus an index",
        description="Pack SRC into OUT: the samples are shuffled with --seed and cut into chunks of "
        "--chunk-size samples, each chunk one file (chunk-<n>.bin), plus an index (index.pfi: each "
        "sample's chunk, offset, length, label and CRC-32), written last. Interrupted, the same "
        "command resumes (chunk files already written are kept); a pack never verifies before "
        "it is complete.")
    pk.add_argument("src", metavar="SRC",
                    help="the dataset: an ImageFolder-layout folder (SRC/<class>/<file>: classes are "
                    "the subfolders, sorted, and a label is its class's index; every file is a sample, "
                    "names starting with '.' are skipped), or, with --manifest, the folder the "
                    "manifest's relative paths are relative to")
    pk.add_argument("out", metavar="OUT",
                    help="the pack's directory: created if missing; it must be empty or hold a pack")
    pk.add_argument("--chunk-size", type=int, required=True, metavar="N",
                    help="samples per chunk file (the paper measured 64 best): larger chunks mean "
                    "fewer, longer reads and less randomness within a batch")
    pk.add_argument("--seed", type=int, default=0, metavar="S",
                    help="seed of the shuffle that decides which samples share a chunk (0 to 2**64-1; "
                    "default 0, as pyfastensor.data.pack's); the same SRC, N and S give the same pack")
    pk.add_argument("--manifest", metavar="FILE",
                    help="pack the files this file lists instead of SRC's subfolders: one 'path label' "
                    "per line (label last; '#' comments); integer labels are used as they are, "
                    "names become class indexes in sorted order")
    pk.add_argument("--json", action="store_true", help="print the stats as JSON instead of a summary")
    pk.add_argument("--quiet", action="store_true", help="no progress bar")
    pk.set_defaults(func=_cmd_pack)

    v = acts.add_parser(
        "verify", help="check the index and every chunk's and sample's CRC-32",
        description="Re-read every chunk file of OUT and check it against the index. Exits 0 with "
        "a one-line summary, or 1 naming the first damaged file (chunk order) and sample.")
    v.add_argument("out", metavar="OUT", help="the pack's directory")
    v.add_argument("--quiet", action="store_true", help="no progress bar")
    v.set_defaults(func=_cmd_verify)
