"""Smoke test of ``python -m benchmarks offload`` on tiny models (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import offload as bench
from benchmarks.workloads import TrainWorkload as Workload
from benchmarks.workloads import conv_net, deep_mlp

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks` runs


def test_tables_have_every_row_and_key(tmp_path):
    models = [(Workload("mlp", deep_mlp(64, 3), (64,)), 256), (Workload("cnn", conv_net(4, 2), (3, 32, 32)), 8)]
    result = bench.run(str(tmp_path), quick=True, min_size=16 << 10, steps=1, limit=False, models=models)
    assert set(result["models"]) == {"mlp", "cnn"}
    for m in result["models"].values():
        assert tuple(m["rows"]) == bench.ROWS
        for r in m["rows"].values():
            assert set(bench.KEYS) <= set(r)
            assert r["peak_bytes"] >= 0
        assert m["rows"]["none"]["peak_ratio"] == 1.0
        assert m["fit"]["offload"] >= m["fit"]["none"]
    text = bench.format_report(result)
    for row in bench.ROWS:
        assert row in text
    assert "dictionary" in text
    assert list(tmp_path.iterdir()) == []


def test_help_explains_the_benchmark():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "offload", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "--quick" in out and "torch.save" in out
