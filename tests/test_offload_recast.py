"""Saved casts of parameters (``torch.autocast``'s copies of the weights) are cast again in
backward instead of stored: gradients bit-identical, their bytes never offloaded, and a parameter
changed in place between forward and backward caught."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda, fake_offload
from offload_models import assert_same_grads, inputs, loss_of, train

import pyfastensor


def train_autocast(model: torch.nn.Module, batch_of: Any, steps: int, off: Any = None) -> list[list[torch.Tensor]]:
    """:func:`offload_models.train` with the forward under bf16 autocast, in ``off`` if given."""
    return train(model, batch_of, steps, ctx=(lambda: off) if off is not None else None,
                 forward_ctx=lambda: torch.autocast("cpu", dtype=torch.bfloat16))


@pytest.mark.parametrize("model_name", ["mlp", "transformer"])
@pytest.mark.parametrize("tier", ["ssd", "host"])
def test_casts_of_parameters_are_made_again_bit_for_bit(tmp_path: Path, model_name: str, tier: str) -> None:
    model, batch_of = inputs(model_name)
    want = train_autocast(model, batch_of, 3)
    on = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4 << 10, tier=tier)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4 << 10, tier=tier, recast=False)
    assert_same_grads(want, train_autocast(model, batch_of, 3, on))
    assert_same_grads(want, train_autocast(model, batch_of, 3, off))
    s_on, s_off = on.summary(), off.summary()
    assert s_on.recast_tensors > 0 and s_off.recast_tensors == 0
    assert s_on.offloaded_tensors > 0, "the activations still go to the store"
    assert s_off.raw_bytes_offloaded == s_on.raw_bytes_offloaded + s_on.recast_bytes, \
        "recast=False offloads the casts' bytes; recast=True none of them"
    if model_name == "mlp":  # the first layer's input needs no gradient: its weight is not saved
        mlp = model.net
        assert s_on.recast_bytes == 2 * (mlp[2].weight.numel() + mlp[4].weight.numel())
    on.close()
    off.close()


def test_a_parameter_changed_between_forward_and_backward_is_caught(tmp_path: Path) -> None:
    model, batch_of = inputs("mlp")
    x, y = batch_of(0)
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4 << 10)
    with off:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = loss_of(model, x, y)
        with torch.no_grad():
            model.net[2].weight.add_(1.0)
        with pytest.raises(RuntimeError, match=r"parameter of shape \(512, 512\) \(torch.float32\) changed in place "
                                               r"between the forward that saved its torch.bfloat16 cast"):
            loss.backward()
    off.close()


def autocast_cache_grads(off: Any = None) -> torch.Tensor:
    """Two micro-steps in one autocast region with an optimizer step between: autocast's weight
    cache gives the second forward the weight's cast made before the step, which torch saves."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(512, 512, bias=False)
    x = torch.randn(64, 512, requires_grad=True)
    opt = torch.optim.SGD(lin.parameters(), lr=0.5)
    with off if off is not None else torch.enable_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        lin(x).float().sum().backward()
        opt.step()
        x.grad = None
        y = lin(x).float().square().sum()
    y.backward()
    return x.grad


def test_a_cast_older_than_its_parameter_is_stored_not_made_again(tmp_path: Path) -> None:
    want = autocast_cache_grads()
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4 << 10)
    assert torch.equal(autocast_cache_grads(off), want)
    s = off.summary()
    assert s.recast_tensors == 1, "the first forward's cast, saved at the parameter's version it was made from"
    assert s.offloaded_tensors >= 1, "the second forward's (cached, stale) cast is stored"
    off.close()


def leaf_grads(off: Any = None) -> list[torch.Tensor]:
    """Gradients of a plain leaf's cast, of a parameter's cast changed after the cast, and of a
    parameter's cast as it is."""
    g = torch.Generator().manual_seed(2)
    w = torch.randn(256, 256, generator=g, requires_grad=True)  # not a parameter: its owner may drop it
    p = torch.nn.Parameter(torch.randn(256, 256, generator=g))
    q = torch.nn.Parameter(torch.randn(256, 256, generator=g))
    ctx = off if off is not None else torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t)
    with ctx:
        a = w.to(torch.bfloat16)
        b = p.to(torch.bfloat16)
        b.mul_(3)  # its bytes are no longer the parameter's cast
        c = q.to(torch.bfloat16)
        ((a ** 2).sum() + (b ** 2).sum() + (c ** 2).sum()).backward()  # each saved once
    return [w.grad, p.grad, q.grad]


def test_only_an_unchanged_cast_of_a_parameter_is_recast(tmp_path: Path) -> None:
    want = leaf_grads()
    off = pyfastensor.offload(spill_dir=str(tmp_path), min_size=4 << 10)
    got = leaf_grads(off)
    assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True))
    s = off.summary()
    assert s.recast_tensors == 1 and s.recast_bytes == 256 * 256 * 2, "only q's cast is the parameter's as it is"
    assert s.offloaded_tensors == 2
    off.close()


def test_recast_casts_skip_the_pinned_staging(tmp_path: Path) -> None:
    model, batch_of = inputs("mlp")
    moved = {}
    for recast in (True, False):
        fake = FakeCuda()
        off = fake_offload(fake, tmp_path, model, tier="host", recast=recast)
        train_autocast(model, batch_of, 2, off)
        moved[recast] = sum(n for _, n in fake.copies), off.summary()
        off.close()
    (on, s_on), (off_bytes, _) = moved[True], moved[False]
    assert s_on.recast_tensors > 0
    assert off_bytes - on >= s_on.recast_bytes, "a parameter's cast went through the pinned staging"
