"""Real frameworks' checkpoints through pyfastensor.route(), their code unchanged: Hugging Face
transformers.Trainer killed and resumed, accelerate's save_state / load_state."""

from __future__ import annotations

import struct
import subprocess
import sys
from pathlib import Path

import pytest
import safetensors.torch
import torch

import pyfastensor
from pyfastensor import _torch

RUN = Path(__file__).with_name("hf_trainer_run.py")
transformers = pytest.importorskip("transformers", reason="transformers is a test requirement (tests/requirements.txt)")


def _run(out: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(RUN), str(out), *args], capture_output=True, text=True, timeout=300)


def _ours_zip(path: Path) -> bool:
    """Whether a torch zip was written by pyfastensor (its end record's comment)."""
    return b"pyfastensor cdcrc32=" in path.read_bytes()[-64:]


def _ours_safetensors(path: Path) -> bool:
    """Whether a safetensors file of a tensor of 1 MiB or more was written by pyfastensor (its
    data starts on 4 KiB; the safetensors package pads to 8 bytes)."""
    n = struct.unpack("<Q", path.read_bytes()[:8])[0]
    return (8 + n) % 4096 == 0


@pytest.mark.skipif(_torch.VERSION < (2, 6), reason="transformers resumes a Trainer's optimizer only on torch 2.6 "
                    "and later (its check_torch_load_is_safe refuses torch.load before: CVE-2025-32434)")
def test_a_trainer_killed_and_resumed_routed_ends_with_the_uninterrupted_runs_weights(tmp_path):
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    done = _run(whole, "--routed")
    assert done.returncode == 0, done.stderr[-3000:]
    killed = _run(broken, "--routed", "--kill-at", "10")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert sorted(p.name for p in broken.iterdir()) == ["checkpoint-4", "checkpoint-8"]
    resumed = _run(broken, "--routed", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    want = _torch.torch_load(whole / "final.pt")
    got = _torch.torch_load(broken / "final.pt")
    assert list(got) == list(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k  # bit for bit

    # Every file the Trainer wrote is pyfastensor's, and stock torch and safetensors read it.
    for run in (whole, broken):
        for ckpt in sorted(run.glob("checkpoint-*")):
            model = ckpt / "model.safetensors"
            assert _ours_safetensors(model), model
            assert safetensors.torch.load_file(model).keys()
            torch_files = [p for p in ckpt.iterdir() if p.suffix in (".pt", ".pth", ".bin")]
            assert {p.name for p in torch_files} >= {"optimizer.pt", "rng_state.pth", "scheduler.pt"}
            for p in torch_files:
                assert _ours_zip(p), p
                _torch.torch_load(p, weights_only=False)


def test_the_same_trainer_unrouted_writes_the_packages_files(tmp_path):
    """The check above can tell: without routing, the files are torch's and safetensors'."""
    done = _run(tmp_path / "stock", "--steps", "4", "--save-steps", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    ckpt = tmp_path / "stock" / "checkpoint-4"
    assert not _ours_safetensors(ckpt / "model.safetensors")
    assert not _ours_zip(ckpt / "optimizer.pt")


def test_accelerate_save_state_and_load_state_routed(tmp_path):
    accelerate = pytest.importorskip("accelerate", reason="accelerate is a test requirement")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.Dropout(0.1), torch.nn.Linear(1024, 4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = [torch.randn(8, 256) for _ in range(5)]

    def step(m: torch.nn.Module, o: torch.optim.Optimizer, x: torch.Tensor) -> None:
        o.zero_grad()
        m(x).square().mean().backward()
        o.step()

    with pyfastensor.route():
        acc = accelerate.Accelerator(cpu=True)
        model, opt = acc.prepare(model, opt)
        for x in data[:3]:
            step(model, opt, x)
        acc.save_state(tmp_path / "state")
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        for x in data[3:]:
            step(model, opt, x)
        uninterrupted = {k: v.clone() for k, v in model.state_dict().items()}
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1.0)  # spoil the model: the load must put back the saved weights
        acc.load_state(tmp_path / "state")
        assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)
        for x in data[3:]:
            step(model, opt, x)
    for k, v in uninterrupted.items():
        assert torch.equal(model.state_dict()[k], v), k  # optimizer and RNG states restored too
    state = tmp_path / "state"
    assert _ours_safetensors(state / "model.safetensors")
    assert safetensors.torch.load_file(state / "model.safetensors").keys() == saved.keys()
    for p in state.iterdir():
        if p.suffix in (".bin", ".pkl", ".pt"):
            assert _ours_zip(p), p
            _torch.torch_load(p, weights_only=False)
