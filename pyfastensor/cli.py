"""The ``pyfastensor`` command line: ``python -m pyfastensor --help``.

Each subcommand lives in the module that owns its subject and adds itself
here through a ``add_parser(subparsers)`` function, so this file stays a
table of contents. Those modules import torch (and load the Go library) only
in the functions a subcommand runs, never at import: ``--help``, ``info``
and every subcommand's ``--help`` work, fast, where torch is missing or
broken (``tests/test_cli.py`` checks it).
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import sys
from collections.abc import Sequence

from .bench import add_parsers as add_bench
from .checkpoint_cli import add_parser as add_ckpt
from .data_cli import add_parser as add_data
from .demo import add_parser as add_demo
from .dictionary import add_parser as add_dict
from .errors import FastensorError


def _cmd_info(args: argparse.Namespace) -> int:
    from .info import info

    if not os.path.exists(args.path):  # its filesystem cannot be examined: say so, not "no O_DIRECT"
        raise FileNotFoundError(errno.ENOENT, "no such file or directory (the directory whose filesystem to describe)",
                                args.path)
    result = info(args.path)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    _print_info(result)
    return 0


def _print_info(r: dict) -> None:
    print(f"pyfastensor {r['version']} ({r['go_version']}, {r['goos']}/{r['goarch']})")
    print(f"  library   {r['python']['library']}")
    print(f"  torch     {r['python']['torch'] or 'not installed'}")
    cpu = r["cpu"]
    print(f"  cpu       {cpu['brand']} ({cpu['cores']} cores, {cpu['threads']} threads)")
    print(f"  features  {' '.join(cpu['features']) or '-'}")
    d = r.get("dir")
    if d:
        print(f"  dir       {d['dir']} ({d['fs_type']})")
        if d["o_direct"]:
            print(f"  O_DIRECT  yes: memory align {d['dio_mem_align']}, offset align "
                  f"{d['dio_offset_align']} (from {d['dio_align_source']})")
        else:
            print(f"  O_DIRECT  no: {d.get('o_direct_reason', '')}")
            print(f"  fallback  {d.get('fallback', '')}")
        print(f"  io_uring  {'yes' if d['io_uring'] else 'no: ' + d.get('io_uring_reason', '')}")
        print(f"  libcufile {d['cufile_library']} ({d['cufile_library_source']}): "
              f"{'works' if d['cufile'] else d.get('cufile_reason', '')}")
    print("  engines")
    for name, e in sorted(r["engines"].items()):
        state = "available" if e["available"] else f"unavailable: {e.get('reason', '')}"
        print(f"    {name:<7} {state}")


def build_parser() -> argparse.ArgumentParser:
    """Build the parser of every subcommand, importing no torch and loading no Go library.

    Returns:
        The parser; each subcommand's parsed namespace carries its handler as ``func``.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pyfastensor",
        description="Fast, durable tensor I/O for PyTorch: tools, and measurements of this machine.",
        epilog="Examples: python -m pyfastensor demo --quick; python -m pyfastensor info /data; "
        "python -m pyfastensor ckpt verify model.pt. `python -m pyfastensor COMMAND --help` tells more of "
        "each; the library itself is documented in docs/index.md of the project.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("info", help="what works on this machine and filesystem, and why not",
                       description="What works on this machine and on PATH's filesystem: the CPU's features, "
                       "O_DIRECT and its alignment, io_uring, libcufile (cuFile), and each I/O engine, with "
                       "the reason where one does not. Example: python -m pyfastensor info /data/ckpt --json")
    p.add_argument("path", nargs="?", default=".", help="directory to examine (default: .)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=_cmd_info)

    add_demo(sub)
    bench = sub.add_parser("bench", help="measure this machine: every I/O engine against the disk's own limit",
                           description="Measure this machine: every I/O engine against the disk's own limit. "
                           "Example: python -m pyfastensor bench io --dir /data")
    add_bench(bench.add_subparsers(dest="bench", metavar="BENCH", required=True))
    add_ckpt(sub)
    add_data(sub)
    add_dict(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments after the program name. Default: ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 on an error (printed to stderr, naming
        the missing module when torch is not importable), 130 on Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ImportError as e:  # torch missing or broken: say so instead of a traceback
        print(f"pyfastensor: error: `{args.command}` needs a module that does not import here: {e} "
              "(pip install pyfastensor installs its dependencies, torch among them)", file=sys.stderr)
        return 1
    except (FastensorError, OSError, ValueError, RuntimeError) as e:
        print(f"pyfastensor: error: {e}", file=sys.stderr)
        return 1
