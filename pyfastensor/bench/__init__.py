"""Benchmarks: ``python -m pyfastensor bench --help``.

Every benchmark prints our figure beside its peers' and the disk's own
limit measured in the same run (O_DIRECT sequential bandwidth), as ratios.
"""

from __future__ import annotations

import argparse


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add each benchmark's subcommand to ``sub``."""
    from . import checkpoint, data_nodes, dcp, io, offload, plan
    from . import data as data_bench
    from . import dict as dict_bench

    io.add_parser(sub)
    offload.add_parser(sub)
    dict_bench.add_parser(sub)
    checkpoint.add_parser(sub)
    plan.add_parser(sub)
    dcp.add_parser(sub)
    data_bench.add_parser(sub)
    data_nodes.add_parser(sub)
