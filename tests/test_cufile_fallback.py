"""cuFile only where it works: where libcufile loads and its driver opens but cuFile does
not move bytes (pip's libcufile on a GPU machine without GPUDirect Storage, played by the
fake libcufile of gds/testdata in a child process), a load to CUDA and a spill succeed
through the CPU path with identical bytes, the reason is recorded, one warning is issued
per process, and info() reports cuFile unavailable with that reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import fake_cufile_env, run_child

import pyfastensor

# (environment of the fake, text the reason must hold)
MODES = {
    "driver open prints an error and succeeds": ({"FAKECUFILE_DRIVER_OPEN": "noinit"},
                                                 "CU_FILE_HANDLE_NOT_REGISTERED (5027)"),
    "registration fails": ({"FAKECUFILE_HANDLE_REGISTER": "5027"}, "CU_FILE_HANDLE_NOT_REGISTERED (5027)"),
    "reads fail": ({"FAKECUFILE_READ": "5011"}, "cuFileRead of 65536 bytes from device memory failed"),
    "writes fail": ({"FAKECUFILE_WRITE": "5044"}, "CU_FILE_IO_ERROR (5044)"),
}


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {f"w{i}": torch.randn(1000 + 37 * i, generator=g) for i in range(12)}


def assert_cufile_refused(info: dict[str, Any], want: str) -> None:
    assert info["cufile_driver"], info
    assert not info["cufile"], info
    assert want in info["cufile_reason"], info


@pytest.mark.parametrize("mode", list(MODES))
def test_a_cuda_load_where_cufile_fails_goes_through_the_pinned_ring(
    tmp_path: Path, fake_cufile: Path, mode: str
) -> None:
    env_extra, want = MODES[mode]
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile, **env_extra), twice=True)
    assert out.get("error") is None, out
    assert out["equal"] and out["route"] == "pinned", out
    assert want in out["reason"], out
    cufile_warnings = [w for w in out["warnings"] if "cuFile does not work here" in w]
    assert len(cufile_warnings) == 1, out["warnings"]
    assert want in cufile_warnings[0]
    assert_cufile_refused(out["info"], want)
    assert out["info"]["cufile_verdict"] == "probe"


def test_a_cufile_read_failing_mid_load_warns_once_and_turns_the_verdict(tmp_path: Path, fake_cufile: Path) -> None:
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    out = run_child(path, "cuda", fake_cufile_env(fake_cufile), fail_read=True, twice=True)
    assert out.get("error") is None, out
    assert out["equal"] and out["route"] == "pinned", out
    assert "CU_FILE_INTERNAL_ERROR" in out["reason"], "the second load says why it skipped cuFile"
    cufile_warnings = [w for w in out["warnings"] if "cuFile does not work here" in w]
    assert len(cufile_warnings) == 1, out["warnings"]
    assert "CU_FILE_INTERNAL_ERROR (5030)" in cufile_warnings[0]
    assert_cufile_refused(out["info"], "CU_FILE_INTERNAL_ERROR (5030)")
    assert out["info"]["cufile_verdict"] == "failure"


SPILL = r"""
import json, sys, warnings
import torch
import pyfastensor
from pyfastensor.offload._store import SpillStore

spill_dir = sys.argv[1]
t = torch.arange(300_000, dtype=torch.float32)  # a device tensor's bytes, staged to host memory
out = {}
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    for name, open_store in (("cufile", lambda: SpillStore("ssd", spill_dir, "cufile")),
                             ("dictionaries", lambda: SpillStore.with_dictionaries(spill_dir, "write_read"))):
        store = open_store()
        slot = store.put(t.data_ptr(), t.numel() * 4)
        store.wait(slot)
        got = torch.empty_like(t)
        store.get(slot, got.data_ptr(), got.numel() * 4)
        st = store.stats()
        out[name] = {"equal": bool(torch.equal(got, t)), "fallback": st.get("fallback", ""),
                     "engines": st["engine_bytes"]}
        store.free(slot)
        store.close()
out["warnings"] = [str(w.message) for w in caught]
d = pyfastensor.info(spill_dir)["dir"]
out["info"] = {k: v for k, v in d.items() if k.startswith("cufile")}
print(json.dumps(out))
"""


def test_a_spill_where_cufile_fails_goes_through_the_cpu_engines(tmp_path: Path, fake_cufile: Path) -> None:
    env_extra, want = MODES["driver open prints an error and succeeds"]
    r = subprocess.run([sys.executable, "-c", SPILL, str(tmp_path)], env=fake_cufile_env(fake_cufile, **env_extra),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    # Asked for cufile: the store opens, a CPU engine serves it, and the store says why.
    assert out["cufile"]["equal"], out
    assert want in out["cufile"]["fallback"], out
    assert not out["cufile"]["engines"].get("cufile"), out
    # Through the dictionaries: cufile is not a candidate on this filesystem.
    assert out["dictionaries"]["equal"], out
    assert not out["dictionaries"]["engines"].get("cufile"), out
    cufile_warnings = [w for w in out["warnings"] if "cuFile does not work here" in w]
    assert len(cufile_warnings) == 1, out["warnings"]
    assert want in cufile_warnings[0]
    assert_cufile_refused(out["info"], want)
