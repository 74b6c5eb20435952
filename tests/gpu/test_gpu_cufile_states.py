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
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, os, sys, warnings
import torch
import pyfastensor
from pyfastensor.checkpoint import last_cuda_route

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

    def loaded(**kw):
        got = pyfastensor.load(f"{d}/s.pt", map_location="cuda", **kw)
        return ({k: [got[k].device.type, bytes(got[k].cpu().view(torch.uint8).numpy()) ==
                     bytes(v.view(torch.uint8).numpy())] for k, v in state.items()},
                last_cuda_route())

    out["load"], out["route"] = loaded()
    out["nvfs"] = os.path.exists("/proc/driver/nvidia-fs")
    if out["info"]["available"]:  # cuFile asked for: its route, or the error saying why not
        try:
            out["cufile_load"], out["cufile_route"] = loaded(engine="cufile")
        except Exception as e:
            out["cufile_load"], out["cufile_route"] = None, {"error": repr(e)}

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
    if out["info"]["available"]:  # the spill file through cuFile (engines: bytes by the engine that moved them)
        off = pyfastensor.offload(spill_dir=d, min_size=16 << 10, module=model, tier="ssd", engine="cufile")
        out["cufile_spill"] = [grads(off) == want for _ in range(2)]
        out["cufile_spill_engines"] = off.summary().engines
        off.close()
out["warnings"] = [str(w.message) for w in caught if "cufile" in str(w.message).lower()]
print(json.dumps(out))
"""


STATES = ("installed", "no libcufile")
CHILD_TIMEOUT_S = 120  # both children, side by side: ~15 s on an H200


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
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        for state, p in procs.items():
            try:
                stdout, stderr = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pytest.fail(f"{state}: the child ran past {CHILD_TIMEOUT_S} s")
            assert p.returncode == 0, f"{state}: {stderr[-3000:]}"
            out[state] = json.loads(stdout.strip().splitlines()[-1])
    finally:
        for p in procs.values():  # none left holding the GPU
            if p.poll() is None:
                p.kill()
                p.communicate()
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
    route = out["route"]
    if cufile["available"]:
        # The default load takes cuFile only with GPUDirect Storage's driver (else its compatibility
        # mode's bounce buffers, which the pinned ring outruns).
        assert route["route"] == ("cufile" if out["nvfs"] else "pinned"), route
        assert out["cufile_route"].get("route") == "cufile", (
            f"load(engine='cufile') did not read through cuFile: {out['cufile_route']}")
        assert out["cufile_load"] == {k: ["cuda", True] for k in ("w", "b", "i")}, out["cufile_load"]
        assert out["cufile_spill"] == [True, True], "gradients with the spill through cuFile differ"
        engines = out["cufile_spill_engines"]
        assert engines.get("cufile", 0) > 0, (
            f"a spill with engine='cufile' was not written through cuFile (bytes by engine: {engines})")
    else:
        assert cufile["reason"], "info() says cuFile is off without saying why"
        assert "cufile" not in out["spill_engines"], "a spill went through cuFile where info() says it is off"
        assert route["route"] == "pinned" and route["reason"], f"a load to CUDA without cuFile: {route}"
    if state == "no libcufile":
        assert not cufile["available"] and "libcufile not found" in cufile["reason"], cufile
