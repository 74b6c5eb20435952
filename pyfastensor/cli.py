"""The ``pyfastensor`` command line: ``python -m pyfastensor --help``.

Each subcommand lives in the module that owns its subject and adds itself
here through a ``add_parser(subparsers)`` function, so this file stays a
table of contents.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence


def _cmd_info(args: argparse.Namespace) -> int:
    from .info import info

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
    print("  engines")
    for name, e in sorted(r["engines"].items()):
        state = "available" if e["available"] else f"unavailable: {e.get('reason', '')}"
        print(f"    {name:<7} {state}")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pyfastensor",
        description="Fast, durable tensor I/O for PyTorch: tools and benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("info", help="what works on this machine and filesystem, and why not")
    p.add_argument("path", nargs="?", default=".", help="directory to examine (default: .)")
    p.add_argument("--json", action="store_true", help="print the raw JSON")
    p.set_defaults(func=_cmd_info)

    from .demo import add_parser as add_demo

    add_demo(sub)

    bench = sub.add_parser("bench", help="benchmarks against peers and the disk's own limit")
    bench_sub = bench.add_subparsers(dest="bench", metavar="BENCH", required=True)
    from .bench import add_parsers as add_bench

    add_bench(bench_sub)
    from .checkpoint.cli import add_parser as add_ckpt

    add_ckpt(sub)
    from .dictionary import add_parser as add_dict

    add_dict(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except (OSError, ValueError, RuntimeError) as e:
        print(f"pyfastensor: error: {e}", file=sys.stderr)
        return 1
