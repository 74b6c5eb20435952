"""The README's first command: the built-in demo runs and its checks hold."""

from __future__ import annotations

import subprocess
import sys


def test_demo_runs_and_round_trips(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pyfastensor", "demo", "--dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "round trip identical: True; stock torch.load reads our file: True" in out.stdout
    assert "gradients bit-identical: True" in out.stdout
    assert "disk limit" in out.stdout
    assert list(tmp_path.iterdir()) == [], "the demo leaves nothing behind"
