"""Smoke test of ``python -m benchmarks checkpoint`` on tiny state dicts (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import checkpoint as bench
from benchmarks import workloads
from benchmarks.workloads import StateDictWorkload as Workload
from pyfastensor.bench import disk

ROOT = Path(__file__).resolve().parents[1]  # where `python -m benchmarks` runs


def _tiny() -> list[Workload]:
    return [
        Workload("gpt2", workloads.gpt2_state_dict(layers=1, vocab=64, d=16, n_ctx=8)),
        Workload("resnet50", workloads.resnet50_state_dict(width=4, classes=10)),
        Workload("small", workloads.small_state_dict(20)),
        Workload("small6k", workloads.small_state_dict(12, seed=1)),
        Workload("lora", workloads.lora_state_dict(layers=1, rank=2)),
    ]


def test_tables_have_every_row_and_key(tmp_path):
    result = bench.run(str(tmp_path), workloads=_tiny(), limit=False)
    assert list(result["workloads"]) == list(bench.WORKLOADS)
    for m in result["workloads"].values():
        assert tuple(m["rows"]) == bench.TOOLS
        for tool, r in m["rows"].items():
            assert set(bench.KEYS) <= set(r)
            assert r["cold_gbps"] > 0 and r["warm_gbps"] > 0
            timed = tool in ("pyfastensor", "torch", "safetensors", "tensorizer", "numpy")
            assert (r["save_gbps"] is not None) == timed, tool
            assert r["ratio"]["cold_gbps"] is None if tool in bench.OURS else r["ratio"]["cold_gbps"] > 0
        assert m["rows"]["pyfastensor"]["newmem_gbps"] > 0 and m["rows"]["torch"]["newmem_gbps"] is None
    whats = {(t["workload"], t["what"]) for t in result["targets"]}
    for small in bench.SMALL:
        assert (small, "durable save >= 1.5x torch") in whats
        assert (small, "warm load no slower than torch") in whats
        for what in ("durable save", "cold load"):
            assert ((small, f"{what} >= {bench.SMALL_TARGET:g}x torch") in whats) == (small in bench.SMALL_2X)
    for model in bench.MODELS:
        assert (model, "warm load, every CRC checked, within 10% of verify=False") in whats
        assert (model, "warm load >= 1.5x torch.load") in whats
        assert (model, "warm mmap=True load, every CRC checked, no slower than torch.load(mmap=True)") in whats
        assert (model, "warm mmap=True load within 2x of safetensors' load_file") in whats
    text = bench.format_report(result)
    for tool in bench.TOOLS:
        assert tool in text
    assert "targets" in text and "CRC-32 per core" in text and "owned" in text and "mapped" in text
    assert list(tmp_path.iterdir()) == []

    png = bench.plot(result, tmp_path / "out" / "checkpoint.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_limit_targets_are_reported(tmp_path):
    result = bench.run(str(tmp_path), workloads=[Workload("resnet50", workloads.resnet50_state_dict(width=4))],
                       tools=("pyfastensor", "torch"), limit=True, limit_size=4 << 20)
    assert "limit" in result
    r = result["workloads"]["resnet50"]["rows"]["pyfastensor"]
    assert r["save_frac"] > 0 and r["cold_frac"] > 0
    saves = [t for t in result["targets"] if "write limit" in t["what"]]
    assert saves and "of the limit for a file of its size" in saves[0]["figures"]
    assert result["workloads"]["resnet50"]["rows"]["pyfastensor"]["rounds"][0]["sized_write_mbps"] > 0
    assert "MET" in bench.format_report(result) or "MISSED" in bench.format_report(result)
    assert list(tmp_path.iterdir()) == []


def test_wrong_load_is_caught():
    sd = {"a": torch.arange(4.0)}
    bench.check_equal("ok", sd, {"a": torch.arange(4.0)})
    for bad in ({"a": torch.zeros(4)}, {"b": torch.arange(4.0)}, {"a": torch.arange(4, dtype=torch.float64)}):
        try:
            bench.check_equal("bad", sd, bad)
        except AssertionError:
            continue
        raise AssertionError(f"{bad} passed")


def test_help_explains_the_benchmark():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "checkpoint", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "--quick" in out and "drop_caches" in out and "torch.equal" in out


def test_mapped_rows_compare_with_the_mapped_load():
    # Ratios and "every peer" stay within a group: the mapped peers against
    # pyfastensor's mapped load, the owned ones against its default load.
    rounds = {
        "pyfastensor": [{"save_s": 1.0, "cold_s": 1.0, "warm_s": 1.0, "newmem_s": 1.0}],
        "torch": [{"save_s": 2.0, "cold_s": 2.0, "warm_s": 3.0}],
        "pyfastensor-mmap": [{"save_s": 1.0, "cold_s": 1.0, "warm_s": 0.1}],
        "torch-mmap": [{"save_s": 2.0, "cold_s": 0.5, "warm_s": 0.2}],
    }
    rows = bench.summarize(10**9, rounds)
    assert rows["torch"]["ratio"]["warm_gbps"] == 3.0
    assert rows["torch-mmap"]["ratio"]["warm_gbps"] == 2.0
    assert bench.slowest_peer(rows, "pyfastensor", "cold") == ("torch", 2.0)  # not torch-mmap's 0.5
    got = {t["what"]: t for t in bench.targets({"workloads": {"gpt2": {"rows": rows}}})}
    assert got["warm load >= 1.5x torch.load"]["met"]
    assert got["warm mmap=True load, every CRC checked, no slower than torch.load(mmap=True)"]["met"]
    assert got["cold load faster than every peer"]["met"]


def test_ratios_and_fractions_pair_rounds():
    # Round 1 is a slow minute for everyone, round 2 a fast one: pyfastensor is
    # twice as fast as torch within each round, which the per-round pairing
    # reports (2.0), where the ratio of the medians would not.
    nbytes = 10**9
    rounds = {
        "pyfastensor": [{"save_s": 2.0, "cold_s": 2.0, "warm_s": 1.0, "newmem_s": 1.0},
                        {"save_s": 0.5, "cold_s": 0.5, "warm_s": 0.25, "newmem_s": 0.25},
                        {"save_s": 1.0, "cold_s": 1.0, "warm_s": 0.5, "newmem_s": 0.5}],
        "torch": [{"save_s": 4.0, "cold_s": 4.0, "warm_s": 2.0},
                  {"save_s": 1.0, "cold_s": 1.0, "warm_s": 0.5},
                  {"save_s": 8.0, "cold_s": 8.0, "warm_s": 4.0}],
    }
    limits = [disk.DiskLimit(500, 500, "t", "", ""), disk.DiskLimit(2000, 2000, "t", "", ""),
              disk.DiskLimit(1000, 1000, "t", "", "")]
    rows = bench.summarize(nbytes, rounds, limits)
    assert rows["pyfastensor"]["save_gbps"] == 1.0  # median of 0.5, 2, 1 GB/s
    assert rows["torch"]["ratio"]["save_gbps"] == 2.0  # 2, 2, 8: median 2 (medians alone: 1.0 / 0.25 = 4)
    assert rows["pyfastensor"]["save_frac"] == 1.0  # each round exactly at its own limit
    assert bench.paired(rows, "pyfastensor", "torch", "warm") == 2.0
    assert bench.slowest_peer(rows, "pyfastensor", "cold") == ("torch", 2.0)
    result = {"workloads": {"gpt2": {"rows": rows}}, "limit": {"write_mbps": 1000, "read_mbps": 1000}}
    got = {t["what"]: t for t in bench.targets(result)}
    assert got["durable save >= 85% of the disk's write limit"]["met"]
    assert "1.00 GB/s = 50% of 2.00 GB/s" in got["cold load >= 90% of the read into new memory"]["figures"]
    assert not got["cold load >= 90% of the read into new memory"]["met"]
    assert got["cold load faster than every peer"]["met"]


def test_verify_bound_adds_the_crc_spread_over_the_cores_to_the_unverified_load():
    # 1 GB summed at 10 GB/s on each of 2 cores: 50 ms beside each unverified load.
    rounds = {
        "pyfastensor": [{"save_s": 1.0, "cold_s": 1.0, "warm_s": w} for w in (0.3, 0.3, 0.3)],
        "pyfastensor-noverify": [{"warm_s": w} for w in (0.2, 0.45, 0.95)],
    }
    rows = bench.summarize(10**9, rounds, [])
    m = {"rows": rows, "nbytes": 10**9}
    crc = {"cached_gbps": 10.0, "memory_gbps": 5.0}
    assert bench.verify_bound(m, crc, cores=2) == pytest.approx(0.45 / 0.5)  # rounds 0.8, 0.9, 0.95
    assert bench.verify_bound(m, None, 2) is None
    assert bench.verify_bound({"rows": {"pyfastensor": rows["pyfastensor"]}, "nbytes": 10**9}, crc, 2) is None
    got = {t["what"]: t for t in bench.targets({"workloads": {"gpt2": m}, "crc": crc})}
    figures = got["warm load, every CRC checked, within 10% of verify=False"]["figures"]
    assert "; at most " in figures and "at 10.0 GB/s on each of" in figures


def test_each_round_starts_with_another_tool(tmp_path, monkeypatch):
    calls = []

    def fake_round(tool, w, directory, *, check=False, sized_limit=False):
        calls.append(tool)
        return {"save_s": 1.0, "cold_s": 1.0, "warm_s": 1.0} | ({"newmem_s": 1.0} if tool == "pyfastensor" else {})

    monkeypatch.setattr(bench, "measure_round", fake_round)
    monkeypatch.setattr(disk, "prime_memory", lambda n: None)
    tools = ("pyfastensor", "torch", "safetensors")
    bench.run(str(tmp_path), workloads=_tiny()[:1], tools=tools, repeat=4, limit=False)
    assert calls == ["pyfastensor", "torch", "safetensors", "torch", "safetensors", "pyfastensor",
                     "safetensors", "pyfastensor", "torch", "pyfastensor", "torch", "safetensors"]


def test_a_peer_that_fails_a_workload_is_reported_and_the_run_goes_on(tmp_path, monkeypatch):
    def refuse(sd, path):
        raise ValueError("Metadata overflow")

    _, load, name, timed = bench._TOOLS["tensorizer"]
    monkeypatch.setitem(bench._TOOLS, "tensorizer", (refuse, load, name, timed))
    result = bench.run(str(tmp_path), workloads=_tiny()[:1], limit=False, repeat=2)
    rows = next(iter(result["workloads"].values()))["rows"]
    assert rows["tensorizer"]["error"] == "ValueError: Metadata overflow"
    assert rows["tensorizer"]["save_gbps"] is None and rows["tensorizer"]["ratio"]["cold_gbps"] is None
    assert rows["torch"]["cold_gbps"] > 0 and len(rows["torch"]["rounds"]) == 2
    line = next(x for x in bench.format_report(result).splitlines() if x.strip().startswith("tensorizer"))
    assert line.split() == ["tensorizer", "failed:", "ValueError:", "Metadata", "overflow"]
    assert list(tmp_path.iterdir()) == []
