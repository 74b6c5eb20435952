"""examples/train_lightning.py end to end at a tiny size: killed with SIGKILL mid-epoch, resumed, exact.

The example trains a small transformer with Lightning on a packed token
dataset (ChunkDataset, StatefulDataLoader with 2 workers, activation offload,
pyfastensor checkpoints), kills a run at the step given here, resumes it
from its last checkpoint, and reports whether it ended with the
uninterrupted run's weights (every parameter's bytes) and consumed every
sample once per epoch; then the same run with stock torch for the figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("lightning.pytorch", reason="needs lightning (tests/requirements.txt)")
pytest.importorskip("torchdata.stateful_dataloader", reason="needs torchdata (tests/requirements.txt)")

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "train_lightning.py"
TINY = ["--samples", "64", "--seq-len", "16", "--vocab", "64", "--d-model", "32", "--layers", "1", "--heads", "2",
        "--batch-size", "8", "--epochs", "2", "--chunk-size", "8", "--checkpoint-every", "3", "--workers", "2",
        "--threads", "1"]


def run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return subprocess.run([sys.executable, str(EXAMPLE), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def test_help_lists_the_size_knobs(tmp_path):
    out = run(["--help"], tmp_path)
    assert out.returncode == 0, out.stderr
    for knob in ("--samples", "--seq-len", "--d-model", "--layers", "--batch-size", "--epochs",
                 "--checkpoint-every", "--kill-at-step", "--workers"):
        assert knob in out.stdout
    assert "--role" not in out.stdout  # the training processes' own options stay hidden


def test_killed_and_resumed_run_ends_as_the_uninterrupted_one(tmp_path):
    """SIGKILL at step 11 of 16 (mid second epoch, the last checkpoint at step 9): the resumed run ends
    with the uninterrupted run's weights bit for bit, every sample once per epoch, the same batches."""
    result_file = tmp_path / "result.json"
    out = run([*TINY, "--kill-at-step", "11", "--workdir", str(tmp_path / "work"), "--json", str(result_file)],
              tmp_path)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["kill_status"] == -9 and result["killed_at"] == 11 and result["resumed_from"] == 9
    assert result["bit_identical"] and result["tensors"] > 0
    assert result["exactly_once"] == [True, True]
    assert result["complete"] and result["same_batches"]
    assert result["pyfastensor"]["checkpoints"] == 5 and result["stock"]["checkpoints"] == 5
    assert result["pyfastensor"]["offloaded_bytes"] > 0 and result["stock"]["offloaded_bytes"] == 0
    assert result["resumed"]["steps"] == 16 - 9
    text = out.stdout
    assert "killed run: SIGKILL at step 11 (exit -9); its last checkpoint is of step 9" in text
    assert "vs uninterrupted: bit-identical" in text
    assert "epoch 0: yes, epoch 1: yes; the same batches as uninterrupted: yes" in text
    for row in ("time per step (median)", "checkpoint stall (mean)", "peak memory (RSS)",
                "saved activations in memory (peak)"):
        assert row in text
    # The killed process's checkpoints are pyfastensor's (its CheckpointIO), readable by torch.load.
    import torch

    ckpt = torch.load(tmp_path / "work" / "killed" / "checkpoints" / "latest.ckpt", weights_only=False)
    loader_state = ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]
    assert loader_state["_snapshot"]["_worker_snapshots"]["worker_0"]["dataset_state"]["kind"] == "worker"


def test_accelerator_cuda_without_a_gpu_says_so():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU (tests/gpu runs the example there)")
    out = subprocess.run([sys.executable, str(EXAMPLE), "--accelerator", "cuda"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 2
    assert "--accelerator cuda: no CUDA device here (torch.cuda.is_available() is False)" in out.stderr
