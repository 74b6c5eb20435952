"""examples/train_lightning.py on a GPU: trained on CUDA with offload on and a pyfastensor checkpoint
every few steps, killed with SIGKILL mid-epoch, resumed, and ending with the uninterrupted run's
weights bit for bit (deterministic algorithms on)."""

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
SMALL = ["--samples", "256", "--seq-len", "64", "--vocab", "256", "--d-model", "256", "--layers", "2",
         "--heads", "4", "--batch-size", "16", "--epochs", "2", "--chunk-size", "16", "--checkpoint-every", "4",
         "--workers", "2", "--threads", "2", "--no-stock"]


def test_killed_and_resumed_on_cuda_ends_as_the_uninterrupted_one(tmp_path):
    result_file = tmp_path / "result.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, str(EXAMPLE), *SMALL, "--accelerator", "cuda", "--kill-at-step", "22",
                          "--workdir", str(tmp_path / "work"), "--json", str(result_file)],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["kill_status"] == -9 and result["killed_at"] == 22 and result["resumed_from"] == 20
    assert result["bit_identical"] and result["tensors"] > 0
    assert result["exactly_once"] == [True, True] and result["same_batches"]
    assert result["pyfastensor"]["offloaded_bytes"] > 0
