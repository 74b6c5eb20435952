"""pyfastensor.offload under FSDP2 (``fully_shard``), on two gloo ranks: the gradients of the
same sharded model without offload, bit for bit.

FSDP2 gathers each block's parameters before its forward and frees them after; the weights
autograd saves are those gathered parameters, which the offload must leave alone, and the
activations are plain tensors it moves.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
import torch
from dcp_helpers import spawn
from torch import nn

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch < 2.6: FSDP2 only under a private name, and only on CUDA
    fully_shard = None

pytestmark = [
    pytest.mark.skipif(fully_shard is None,
                       reason=f"torch {torch.__version__} has no torch.distributed.fsdp.fully_shard (FSDP2)"),
    # torch 2.6's fully_shard records an event on its all-gather stream, which on CPU has no
    # record_event until 2.7: it fails without offload too.
    pytest.mark.skipif(not hasattr(torch.cpu.Stream, "record_event"),
                       reason=f"torch {torch.__version__}'s FSDP2 cannot run on CPU (its CPU stream has no "
                              "record_event; torch 2.7 and later)"),
]


def _grads(rank: int, tier: str | None) -> tuple[list[bytes], int]:
    import pyfastensor

    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 512), nn.GELU(), nn.Linear(512, 128)) for _ in range(3)])
    for block in model:
        fully_shard(block)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    off = (pyfastensor.offload(tier=tier, spill_dir=tempfile.mkdtemp(), min_size=1 << 10)
           if tier else None)
    got: list[bytes] = []
    for step in range(3):
        x = torch.randn(32, 128, generator=torch.Generator().manual_seed(100 * rank + step))
        opt.zero_grad()
        with off or contextlib.nullcontext():
            model(x).square().mean().backward()
        got += [p.grad.full_tensor().numpy().tobytes() for p in model.parameters()]
        opt.step()
    if off is None:
        return got, 0
    offloaded = off.summary().offloaded_tensors
    off.close()
    return got, offloaded


def _compare(rank: int, world: int, out: str) -> None:
    want, _ = _grads(rank, None)
    result = {}
    for tier in ("ssd", "host"):
        got, offloaded = _grads(rank, tier)
        result[tier] = {"same": got == want, "offloaded": offloaded}
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))


def test_fully_sharded_model_offloads_with_the_same_gradients(tmp_path):
    spawn(_compare, 2, str(tmp_path))
    for rank in range(2):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        for tier, r in result.items():
            assert r["same"], f"rank {rank}, tier {tier}: gradients differ"
            assert r["offloaded"] > 0, (rank, tier)
