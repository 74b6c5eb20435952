"""Measure this machine: ``python -m pyfastensor bench io``, and the figures it is judged by.

- :mod:`pyfastensor.bench.disk`: the disk's own limit (sequential O_DIRECT
  bandwidth, by fio or our engines: :func:`~pyfastensor.bench.disk.measure_limit`),
  cold caches (:func:`~pyfastensor.bench.disk.drop_caches`) and timed passes.
- :func:`crc_speed`: how fast this CPU checks the CRC-32 every record carries.
- :mod:`pyfastensor.bench.io`: every engine against the disk, per block size.

The comparative benchmarks (checkpoints, offload, data loading against their
peers) are not part of the installed package: they are the ``benchmarks``
package of the source repository (``python -m benchmarks --help``).
"""

from __future__ import annotations

import argparse

from .cpu import crc_speed

__all__ = ["add_parsers", "crc_speed"]


def add_parsers(sub: argparse._SubParsersAction) -> None:
    """Add ``bench io`` to ``sub``."""
    from . import io

    io.add_parser(sub)
