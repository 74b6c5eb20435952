"""``python -m benchmarks dict``: the Go hit-rate program's report, run and printed."""

from __future__ import annotations

import shutil

import pytest

from benchmarks import dict as bench
from benchmarks import main

pytestmark = pytest.mark.skipif(shutil.which("go") is None, reason="benchmarks dict runs `go run`")

TINY = ["--sizes", "3", "--max-size", "64K", "--iterations", "3", "--repeat", "1"]


def test_run_returns_the_go_report(tmp_path):
    r = bench.run(tmp_path, sizes=3, max_size=64 << 10, iterations=3, repeat=1, write="posix,direct",
                  read="posix,mmap")
    assert r["transfers"] == 9 and r["write_engines"] == ["posix", "direct"]
    assert {"aware", "tool:mmap"} <= {x["strategy"] for x in r["results"]}
    text = bench.format_report(r)
    assert "hit rate (aware dictionaries):" in text and "per bucket (aware)" in text
    assert list(tmp_path.iterdir()) == []  # the workload file is removed


def test_cli_prints_the_table_and_the_json(tmp_path, capsys):
    assert main(["dict", str(tmp_path), *TINY]) == 0
    assert "hit rate (aware dictionaries):" in capsys.readouterr().out
    assert main(["dict", str(tmp_path), *TINY, "--json"]) == 0
    assert '"hit_rate"' in capsys.readouterr().out


def test_a_failure_is_the_programs_message(tmp_path, capsys):
    assert main(["dict", str(tmp_path / "missing"), *TINY]) == 1
    err = capsys.readouterr().err
    assert "benchmarks: error: go run ./cmd/dicthitrate: " in err
