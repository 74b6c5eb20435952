"""``python -m benchmarks trace MODEL --batch B OUT``: record a workload model's training step as a G10 trace.

Imports neither torch nor the Go library until the command runs.
"""

from __future__ import annotations

import argparse

from .harness import add_command
from .workloads import MODEL_NAMES

_DESCRIPTION = """\
Record one training step (forward, backward, Adam step) of a workload model on
CPU as a G10 trace (JSON, schema version 1; docs/planning.md, "Traces"): every aten op
with its measured time and the tensors it reads and writes. Models: bert
(BERT-like encoder classifier), vit (ViT-like), resnet (ResNet-like, three
stages). Simulate it with pyfastensor.plan.simulate, or run `python -m benchmarks plan`.
Your own model's trace: pyfastensor.plan.record_trace(model, batch, loss_fn).
"""


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``trace`` to the benchmarks' subcommands."""
    p = add_command(sub, "trace", help="record a workload model's training step as a G10 trace",
                    description=_DESCRIPTION, func=_cmd_trace, json_help=None)
    p.add_argument("model", choices=MODEL_NAMES, help="the model (benchmarks.workloads)")
    p.add_argument("out", help="the trace file to write (JSON)")
    p.add_argument("--batch", type=int, default=8, help="batch size (default 8)")
    p.add_argument("--layers", type=int, default=None,
                   help="encoder layers (bert, vit; default 2) or blocks per stage (resnet; default 2)")
    p.add_argument("--width", type=int, default=None,
                   help="hidden width (bert, vit; default 64) or first stage's channels (resnet; default 16)")


def _cmd_trace(args: argparse.Namespace) -> int:
    from .workloads import record

    trace = record(args.model, args.batch, layers=args.layers, width=args.width)
    trace.save(args.out)
    print(f"{args.out}: {trace}")
    return 0
