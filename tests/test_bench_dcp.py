"""The dcp benchmark's arithmetic and report, from synthetic figures (nothing timed here)."""

from __future__ import annotations

import argparse

import pytest

from benchmarks import add_parsers
from benchmarks import dcp as bench


def _result() -> dict:
    rows = []
    for rnd, (ours, theirs) in enumerate([(1.0, 2.0), (1.0, 1.2), (2.0, 3.0)]):
        rows += [{"tool": "pyfastensor", "round": rnd, "save_s": ours, "load_s": ours / 2},
                 {"tool": "filesystem", "round": rnd, "save_s": theirs, "load_s": theirs}]

    def reshard(ours: int, theirs: int) -> list[dict]:
        return [{"rows": [{"tool": t, "round": 0, "read_bytes": b, "rchar": 2 * b, "needed": 500, "planned": 520 if t == "pyfastensor"
                           else None, "seconds": 0.5} for t, b in (("pyfastensor", ours), ("filesystem", theirs))],
                 "agree": True} for _ in range(2)]

    return {"size": "quick", "nbytes": 10**9, "rounds": 3, "cold": "fadvise", "worlds": {2: rows},
            "limit": {"write_mbps": 1000.0, "read_mbps": 2000.0, "how": "disk limit (fio): ..."},
            "reshard": {"Shard(1)x4->Shard(0)x2": reshard(520, 1000)}}


def test_ratios_are_paired_per_round_with_their_spread():
    s = bench.summarize(_result())
    save = s["worlds"][2]["save"]
    assert save["ratio"] == pytest.approx(1.5)  # median of 2.0, 1.2, 1.5
    assert save["spread"] == "1.20-2.00"
    assert save["pyfastensor"] == 1.0 and save["gbps"]["pyfastensor"] == pytest.approx(1.0)
    load = s["worlds"][2]["load"]
    assert load["ratio"] == pytest.approx(3.0)
    met = {t["what"]: t["met"] for t in s["targets"]}
    assert met["save with 2 rank(s) >= 1.5x FileSystemWriter"] is True
    r = s["reshard"]["Shard(1)x4->Shard(0)x2"]
    assert r["needed"] == 1000 and r["pyfastensor"]["ratio"] == pytest.approx(1.04)
    assert r["filesystem"]["ratio"] == pytest.approx(2.0)
    assert met["Shard(1)x4->Shard(0)x2: bytes read <= 1.1x needed"] is True


def test_report_prints_ours_theirs_limit_and_targets():
    text = bench.format_report(_result())
    assert "disk limit (fio)" in text
    assert "1.50x  1.20-2.00" in text
    assert "FileSystemReader 0.0 MB (2.00x" in text  # 1000 bytes read for 500 needed
    assert "[met] save with 2 rank(s)" in text
    assert "pyfastensor 2.08x needed, FileSystemReader 4.00x" in text


def test_bound_is_dcps_own_time_plus_the_bytes_at_the_limit():
    result = _result()
    # Round k: ours 1.5 s with 1.2 s in the backend (DCP's own 0.3 s), theirs
    # 2.0 s with 1.9 s (0.1 s): the smaller, 0.1 s, plus 1 GB at 1000 MB/s.
    result["worlds"][2] = [
        {"tool": t, "round": k, "save_s": total, "load_s": total, "save_storage_s": storage,
         "load_storage_s": storage}
        for k in range(3) for t, total, storage in (("pyfastensor", 1.5, 1.2), ("filesystem", 2.0 + k, 1.9 + k))]
    s = bench.summarize(result)
    save = s["worlds"][2]["save"]
    assert save["dcp_own_s"] == pytest.approx(0.1)
    assert save["bound_s"] == pytest.approx(1.1)
    assert save["best_ratio"] == pytest.approx(3.0 / 1.1)  # the median of 2/1.1, 3/1.1, 4/1.1
    assert save["best_spread"] == "1.82-3.64"
    assert s["worlds"][2]["load"]["bound_s"] == pytest.approx(0.6)  # read limit 2000 MB/s
    text = bench.format_report(result)
    assert "  100ms  1.10s  2.73x" in text
    assert "the most any backend could show: 2.73x (rounds 1.82-3.64)" in text


def test_rows_without_storage_times_have_no_bound():
    s = bench.summarize(_result())
    assert "bound_s" not in s["worlds"][2]["save"]
    assert "-      -      -" in bench.format_report(_result())


def test_registered_as_bench_dcp():
    p = argparse.ArgumentParser()
    add_parsers(p.add_subparsers(dest="cmd"))
    args = p.parse_args(["dcp", "--size", "quick", "--ranks", "1,2", "--repeat", "2"])
    assert args.func is bench._cmd_dcp and args.size == "quick" and args.ranks == "1,2"
