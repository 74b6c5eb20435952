"""examples/train_lightning.py on a GPU: trained on CUDA with offload on and a pyfastensor checkpoint
every few steps, killed with SIGKILL mid-epoch, resumed, and ending with the uninterrupted run's
weights bit for bit (deterministic algorithms on).

Small, as its time is mostly the three training processes' start: 2 epochs of 6 steps, a
checkpoint every 4; the killed run is killed at step 9, in the second epoch, after its step-8
checkpoint (itself mid-epoch: the loader's state restored two batches into epoch 1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch", reason="needs lightning (tests/requirements.txt)")
pytest.importorskip("torchdata.stateful_dataloader", reason="needs torchdata (tests/requirements.txt)")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_lightning.py"
SMALL = ["--samples", "96", "--seq-len", "64", "--vocab", "256", "--d-model", "128", "--layers", "2",
         "--heads", "4", "--batch-size", "16", "--epochs", "2", "--chunk-size", "16", "--checkpoint-every", "4",
         "--workers", "2", "--threads", "2", "--no-stock"]
KILL_AT, RESUMED_FROM = 9, 8  # steps 0-5 are epoch 0, 6-11 epoch 1
TIMEOUT_S = 150  # ~30 s expected; a hang fails this test, not the whole suite's time


def test_killed_and_resumed_on_cuda_ends_as_the_uninterrupted_one(tmp_path):
    result_file = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, "--accelerator", "cuda", "--kill-at-step",
                          str(KILL_AT), "--workdir", str(tmp_path / "work"), "--json", str(result_file)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["kill_status"] == -9 and result["killed_at"] == KILL_AT and result["resumed_from"] == RESUMED_FROM
    assert result["complete"] and result["steps"] == 12
    assert result["bit_identical"] and result["tensors"] > 0
    assert result["exactly_once"] == [True, True] and result["same_batches"]
    assert result["pyfastensor"]["offloaded_bytes"] > 0
