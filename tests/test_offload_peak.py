"""Peak resident saved-tensor bytes under policy "all" with a tight budget, against no offload.

Both runs use the same accounting (the offload layer's meter, per storage):
``policy="none"`` counts each saved tensor from pack until autograd drops it;
``policy="all"`` counts pending writes, prefetched buffers and unpacked
copies until their storage is freed.
"""

from __future__ import annotations

import gc

import pytest
import torch
from offload_models import open_handles
from torch import nn

import pyfastensor
from benchmarks.workloads import conv_net, deep_mlp

MIN_SIZE = 64 << 10


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, ctx: pyfastensor.offload.Offload) -> None:
    with ctx:
        nn.functional.cross_entropy(model(x), y).backward()


@pytest.mark.parametrize("model_name", ["mlp", "cnn"])
def test_peak_under_all_is_at_most_a_quarter_of_no_offload(tmp_path, model_name):
    torch.manual_seed(0)
    if model_name == "mlp":
        model, x = deep_mlp(256, 8), torch.randn(256, 256)
    else:
        model, x = conv_net(8, 4), torch.randn(16, 3, 32, 32)
    y = torch.randint(0, 10, (x.shape[0],))
    none = pyfastensor.offload(policy="none", min_size=MIN_SIZE, module=model)
    _step(model, x, y, none)
    base = none.summary().resident_peak_bytes
    assert base > 0
    off = pyfastensor.offload(policy="all", budget=base // 5, min_size=MIN_SIZE, module=model,
                              spill_dir=str(tmp_path))
    for _ in range(3):  # profiling step, then steps that prefetch
        _step(model, x, y, off)
        s = off.summary()
        assert s.offloaded_tensors > 0
        assert s.resident_peak_bytes <= base // 4, (s.resident_peak_bytes, base)
    off.close()
    none.close()
    assert open_handles() == 0


def test_meter_counts_a_storage_once_and_until_it_is_freed():
    from pyfastensor.offload._saved import Meter

    m = Meter()
    t = torch.empty(1 << 20, dtype=torch.uint8)
    m.track(t)
    alias = t.view(torch.uint8)  # not a tracked view: same storage
    m.track(alias)
    m.track(t[10:].view(torch.int8))
    assert m.now == 1 << 20
    del t
    gc.collect()
    assert m.now == 1 << 20  # the alias keeps the storage alive
    del alias
    gc.collect()
    assert m.now == 0
    assert m.peak == 1 << 20


def test_meter_lets_a_pooled_read_back_go_when_its_tensor_does():
    # The pool watches its buffers' storages; that must not keep the meter's finalizer from
    # running when the buffer's last tensor goes (torch 2.4's StorageWeakRef did).
    from pyfastensor.offload._pool import POOL_MIN, BufferPool
    from pyfastensor.offload._saved import Meter

    pool, m = BufferPool(), Meter()
    buf = pool.take(POOL_MIN)
    m.track(buf)
    view = buf[16:].view(torch.float32)
    del buf
    assert m.now == POOL_MIN
    del view
    assert m.now == 0, "the read-back is freed: no longer in memory because of us"
    again = pool.take(POOL_MIN)
    m.track(again)  # the same mapping, handed out again: counted again
    assert m.now == POOL_MIN and pool.reserved == POOL_MIN
    del again
    assert m.now == 0


def test_unpacked_copies_are_not_kept_alive_by_the_layer(tmp_path):
    torch.manual_seed(0)
    model = deep_mlp(256, 4)
    x, y = torch.randn(256, 256), torch.randint(0, 10, (256,))
    off = pyfastensor.offload(policy="all", budget=0, min_size=MIN_SIZE, module=model, spill_dir=str(tmp_path))
    for _ in range(2):
        _step(model, x, y, off)
    gc.collect()
    assert off._meter.now == 0
