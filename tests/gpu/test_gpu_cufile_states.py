"""Every save, load and spill from and to CUDA works whatever state cuFile is in on this GPU
machine: as installed here (GPUDirect Storage working, or pip's libcufile without it) and with no
libcufile at all; ``info()`` says why cuFile is off where it is.

Each state runs in a child process: the library reads ``PYFASTENSOR_CUFILE_LIB`` and probes
cuFile once per process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys, warnings
import torch
import pyfastensor

d = sys.argv[1]
torch.use_deterministic_algorithms(True)
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out["info"] = pyfastensor.info(d)["engines"]["cufile"]

    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(1024, 1024, generator=g), "b": torch.randn(333, generator=g).bfloat16(),
             "i": torch.randint(0, 1 << 30, (4097,), generator=g)}
    cuda = {k: v.cuda() for k, v in state.items()}
    pyfastensor.save(cuda, f"{d}/s.pt")
    got = pyfastensor.load(f"{d}/s.pt", map_location="cuda")
    out["load"] = {k: [got[k].device.type, bytes(got[k].cpu().view(torch.uint8).numpy()) ==
                       bytes(v.view(torch.uint8).numpy())] for k, v in state.items()}

    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512)).cuda()
    x = torch.randn(256, 512, generator=g).cuda()

    def grads(ctx=None):
        model.zero_grad()
        if ctx is None:
            model(x).square().sum().backward()
        else:
            with ctx:
                model(x).square().sum().backward()
        return [bytes(p.grad.cpu().view(torch.uint8).numpy()) for p in model.parameters()]

    want = grads()
    off = pyfastensor.offload(spill_dir=d, min_size=16 << 10, module=model, tier="ssd")
    out["spill"] = [grads(off) == want for _ in range(3)]
    summary = off.summary()
    out["spilled"], out["spill_engines"] = summary.offloaded_tensors, sorted(summary.engines)
    off.close()
out["warnings"] = [str(w.message) for w in caught if "cufile" in str(w.message).lower()]
print(json.dumps(out))
"""


STATES = ("installed", "no libcufile")


@pytest.fixture(scope="module")
def children(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """What each state's child printed (the children run side by side)."""
    procs = {}
    for state in STATES:
        d = tmp_path_factory.mktemp(state.replace(" ", "-"))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
               "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        if state == "no libcufile":
            env["PYFASTENSOR_CUFILE_LIB"] = str(d / "nowhere" / "libcufile.so.0")
        procs[state] = subprocess.Popen([sys.executable, "-c", CHILD, str(d)], env=env, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out = {}
    for state, p in procs.items():
        stdout, stderr = p.communicate(timeout=240)
        assert p.returncode == 0, f"{state}: {stderr[-3000:]}"
        out[state] = json.loads(stdout.strip().splitlines()[-1])
    return out


def assert_all_round_trips(out: dict[str, Any]) -> None:
    assert out["load"] == {k: ["cuda", True] for k in ("w", "b", "i")}, out["load"]
    assert out["spill"] == [True, True, True], "gradients with the spill differ from those without"
    assert out["spilled"] > 0
    assert len(out["warnings"]) <= 1, f"a cuFile warning more than once per process: {out['warnings']}"


@pytest.mark.parametrize("state", STATES)
def test_save_load_and_spill_work_whatever_cufile_is(children: dict[str, Any], state: str) -> None:
    out = children[state]
    cufile = out["info"]
    print(f"cuFile {state}: {json.dumps(cufile)}; spill engines {out['spill_engines']}")
    assert_all_round_trips(out)
    if not cufile["available"]:
        assert cufile["reason"], "info() says cuFile is off without saying why"
        assert "cufile" not in out["spill_engines"], "a spill went through cuFile where info() says it is off"
    if state == "no libcufile":
        assert not cufile["available"] and "libcufile not found" in cufile["reason"], cufile
