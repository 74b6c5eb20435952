"""Multi-rank workers for tests/test_dcp.py: spawned processes on gloo over 127.0.0.1.

Each worker joins a process group, does its part and writes what it saw to
``<out>/rank<r>.json``; the test reads those files.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from benchmarks.dcp import exit_without_finalizing


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(fn: Callable[..., None], world: int, *args: Any) -> None:
    """Run ``fn(rank, world, port, *args)`` in ``world`` spawned processes."""
    import torch.multiprocessing as mp

    mp.spawn(_entry, args=(fn, world, free_port(), args), nprocs=world, join=True)


def _entry(rank: int, fn: Callable[..., None], world: int, port: int, args: tuple[Any, ...]) -> None:
    import torch.distributed as dist

    os.environ.setdefault("PYFASTENSOR_THREADS", "2")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    exit_without_finalizing()


def full_state() -> dict[str, torch.Tensor]:
    """The full tensors every test saves (deterministic): float32, bfloat16, int64, int8."""
    g = torch.Generator().manual_seed(17)
    return {
        "w": torch.randn(48, 40, generator=g),
        "bf": torch.randn(16, 24, generator=g).to(torch.bfloat16),
        "i": torch.randint(-(2**40), 2**40, (36,), generator=g, dtype=torch.int64),
        "q": torch.randint(-128, 127, (8, 1024), generator=g, dtype=torch.int8),
        "r": torch.randn(3, 5, generator=g),
    }


def _dtensor() -> tuple[Any, Any, Any]:
    """DTensor's ``Replicate``, ``Shard`` and ``distribute_tensor``: public from torch 2.5, under
    ``torch.distributed._tensor`` in 2.4."""
    try:
        from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    except ImportError:
        from torch.distributed._tensor import Replicate, Shard, distribute_tensor
    return Replicate, Shard, distribute_tensor


def save_sharded(rank: int, world: int, path: str, out: str, engine: Any) -> None:
    """Save full_state() with every tensor Shard(0) over ``world`` ranks ("r" replicated)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    Replicate, Shard, distribute_tensor = _dtensor()

    from pyfastensor.dcp import Writer

    mesh = init_device_mesh("cpu", (world,))
    sd: dict[str, Any] = {k: distribute_tensor(v, mesh, [Replicate() if k == "r" else Shard(0)])
                          for k, v in full_state().items()}
    sd["step"] = 7
    sd["names"] = ["a", "b"]
    w = Writer(path, engine=engine)
    dcp.save(sd, storage_writer=w)
    Path(out, f"rank{rank}.json").write_text(json.dumps({"engine_mode": w.engine_mode}))


def load_resharded(rank: int, world: int, path: str, out: str, engine: Any) -> None:
    """Load into Shard(1) ("w", "bf", "q"), Replicate ("i") and Shard(0) ("r"); compare with full_state()."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    Replicate, Shard, distribute_tensor = _dtensor()

    from pyfastensor.dcp import Reader

    mesh = init_device_mesh("cpu", (world,))
    place = {"w": Shard(1), "bf": Shard(1), "q": Shard(1), "i": Replicate(), "r": Shard(0)}
    full = full_state()
    sd: dict[str, Any] = {k: distribute_tensor(torch.zeros_like(v), mesh, [place[k]]) for k, v in full.items()}
    sd["step"] = 0
    sd["names"] = []
    r = Reader(path, engine=engine)
    dcp.load(sd, storage_reader=r)
    same = {k: bool(torch.equal(sd[k].full_tensor(), v)) for k, v in full.items()}
    local = {k: bool(torch.equal(sd[k].to_local(), distribute_tensor(v, mesh, [place[k]]).to_local()))
             for k, v in full.items()}
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "same": same, "local": local, "step": sd["step"], "names": sd["names"], "stats": r.last_stats,
        "engine_mode": r.engine_mode}))


def async_and_optimizer(rank: int, world: int, path: str, out: str) -> None:
    """async_save of a model and its Adam state (state_dict helpers), then a load into a fresh pair."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from pyfastensor.dcp import Reader, Writer

    def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(3)
        m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
        return m, torch.optim.Adam(m.parameters(), lr=0.01)

    model, opt = make()
    for _ in range(2):
        model(torch.randn(8, 16)).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
    msd, osd = get_state_dict(model, opt)
    dcp.async_save({"model": msd, "optim": osd}, storage_writer=Writer(path)).result()

    model2, opt2 = make()
    msd2, osd2 = get_state_dict(model2, opt2)
    sd2 = {"model": msd2, "optim": osd2}
    dcp.load(sd2, storage_reader=Reader(path))
    set_state_dict(model2, opt2, model_state_dict=sd2["model"], optim_state_dict=sd2["optim"])
    same_model = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), model2.state_dict().values(),
                                                         strict=True))
    s1, s2 = opt.state_dict(), opt2.state_dict()
    same_optim = s1["param_groups"] == s2["param_groups"] and all(
        all(torch.equal(torch.as_tensor(s1["state"][p][k]), torch.as_tensor(s2["state"][p][k])) for k in s1["state"][p])
        for p in s1["state"])
    Path(out, f"rank{rank}.json").write_text(json.dumps({
        "model": same_model, "optim": same_optim, "steps": [float(s2["state"][p]["step"]) for p in s2["state"]]}))


def dictionaries(rank: int, world: int, path: str, out: str, differ: bool) -> None:
    """engine="dictionaries": the mode each rank ends up in (nodes alike, or made to differ)."""
    from pyfastensor.dcp import _engines

    if differ and rank == 1:
        real = _engines.fingerprint
        _engines.fingerprint = lambda d: real(d) + "-other-node"  # type: ignore[assignment]
    save_sharded(rank, world, path, out, "dictionaries")
