"""pyfastensor against its peers and the disk's own limit: ``python -m benchmarks --help``.

Run from the repository root. Every benchmark prints pyfastensor's figure
beside its peers' and, where the disk is what is measured, the disk's own
limit measured in the same run (O_DIRECT sequential bandwidth), as ratios.
They use pyfastensor's public API only; what they share (the disk's limit,
cold caches, cgroups, paired rounds, output) is :mod:`benchmarks.harness`,
the models they build are :mod:`benchmarks.workloads`. Their peers and plot
library: ``pip install -r benchmarks/requirements.txt``.

The measurement of one machine's engines against its disk ships with the
library: ``python -m pyfastensor bench io``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add every benchmark's subcommand to ``sub`` (imports no torch)."""
    from . import checkpoint, data_nodes, dcp, gpu, offload, plan, trace, trainer
    from . import data as data_bench
    from . import dict as dict_bench

    checkpoint.add_parser(sub)
    trainer.add_parser(sub)
    gpu.add_parser(sub)
    dcp.add_parser(sub)
    offload.add_parser(sub)
    plan.add_parser(sub)
    data_bench.add_parser(sub)
    data_nodes.add_parser(sub)
    dict_bench.add_parser(sub)
    trace.add_parser(sub)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``python -m benchmarks``; each subcommand's namespace carries its handler as ``func``."""
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="pyfastensor against its peers and the disk's own limit (run from the repository root).",
    )
    add_parsers(parser.add_subparsers(dest="command", metavar="BENCHMARK", required=True))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one benchmark.

    Args:
        argv: the arguments after the program name. Default: ``sys.argv[1:]``.

    Returns:
        The exit status: 0 on success, 1 on an error (printed to stderr), 130 on Ctrl-C.
    """
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except ImportError as e:
        print(f"benchmarks: error: `{args.command}` needs a module that does not import here: {e} "
              "(pip install -r benchmarks/requirements.txt installs the peers)", file=sys.stderr)
        return 1
    except (OSError, ValueError, RuntimeError) as e:
        print(f"benchmarks: error: {e}", file=sys.stderr)
        return 1
