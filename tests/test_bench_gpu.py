"""``python -m benchmarks gpu`` where there is no GPU: a clear message and status 2; its help
and its targets' arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import benchmarks
from benchmarks import gpu


def test_without_cuda_it_says_so_and_exits_2(capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert benchmarks.main(["gpu", "--quick"]) == gpu.NO_CUDA == 2
    err = capsys.readouterr().err
    assert "no CUDA device here" in err and "GPU machine" in err


def test_help_says_what_it_measures(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        benchmarks.main(["gpu", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for what in ("device-to-host", "O_DIRECT", "cold load to CUDA", "async_save", "--quick", "offload"):
        assert what in out, what


def test_targets_use_paired_rounds_and_the_limits() -> None:
    # 1 GB saved in 1 s by pyfastensor and 2 s by torch, disk at 1.1 GB/s; async blocks 0.05 s.
    secs = {"save": {"pyfastensor": [1.0, 1.0], "torch": [2.0, 1.2]},
            "cold": {"pyfastensor": [1.0, 1.0], "safetensors": [1.0, 1.0]},
            "warm": {"pyfastensor": [0.5, 0.5], "safetensors": [0.5, 0.25]},
            "async": {"blocking": [0.05, 0.2], "total": [1.0, 1.0]}}
    result = {"seconds": secs, "state_bytes": 10**9, "limit": {"write_gbps": 1.1, "read_gbps": 1.0}}
    got = {t["target"]: (t["median"], t["met"]) for t in gpu.evaluate(result)}
    assert got["save from CUDA >= 85% of the disk's write limit"] == (pytest.approx(1 / 1.1), True)
    assert got["save from CUDA >= 1.5x torch.save + fsync"] == (pytest.approx(1.6), True)
    assert got["cold load to CUDA >= 1.2x safetensors"] == (1.0, False)
    assert got["warm load to CUDA >= safetensors"] == (pytest.approx(0.75), False)
    assert got["async_save blocks <= 10% of the save"] == (pytest.approx(0.125), False)
    del secs["cold"]["safetensors"], secs["warm"]["safetensors"]
    assert all(t["met"] is None for t in gpu.evaluate(result) if "safetensors" in t["target"])


def test_limit_ratios_pair_each_round_with_its_own_limit() -> None:
    # The disk wrote at 2.0 GB/s in round 1 and 1.0 in round 2; pyfastensor saved 1 GB in 0.5 s,
    # then 1.25 s: 1.0 and 0.8 of its round's limit (against one limit of 2.0: 1.0 and 0.4).
    secs = {"save": {"pyfastensor": [0.5, 1.25]}, "cold": {"pyfastensor": [1.0, 1.0]},
            "warm": {"pyfastensor": [0.5, 0.5]}, "async": {"blocking": [0.01, 0.01], "total": [1.0, 1.0]}}
    limit = {"write_gbps": 1.5, "read_gbps": 1.0,
             "rounds": {"write_gbps": [2.0, 1.0], "read_gbps": [1.0, 2.0]}, "describe": "disk limit (test)"}
    result = {"seconds": secs, "state_bytes": 10**9, "limit": limit}
    got = {t["target"]: t for t in gpu.evaluate(result)}
    save = got["save from CUDA >= 85% of the disk's write limit"]
    assert save["ratios"] == [pytest.approx(1.0), pytest.approx(0.8)] and save["met"] is True
    cold = got["cold load to CUDA >= 85% of the disk's read limit"]
    assert cold["ratios"] == [pytest.approx(1.0), pytest.approx(0.5)] and cold["met"] is False
    result.update(device="GPU", torch="x", pinned_gbps={"d2h": 50.0, "h2d": 50.0}, tensors=29, method="m",
                  routes=["pinned"], first_async_s=1.0, targets=gpu.evaluate(result))
    report = gpu.format_report(result)
    assert "disk limit per round: write 2.00, 1.00 GB/s; read 1.00, 2.00 GB/s" in report
    assert "0.90 (0.80-1.00)" in report, "the save row's paired ratios to its rounds' limits: median and spread"


def test_the_rounds_limits_summarised_and_their_median_bounds_the_offload_rows() -> None:
    from pyfastensor.bench.disk import DiskLimit

    limits = [DiskLimit(write_mbps=w, read_mbps=r, source="engine:direct", write_how="w", read_how="r", note="")
              for w, r in ((2000.0, 1900.0), (1400.0, 1800.0), (1800.0, 1000.0))]
    s = gpu.limit_summary(limits)
    assert s["rounds"] == {"write_gbps": [2.0, 1.4, 1.8], "read_gbps": [1.9, 1.8, 1.0]}
    assert (s["write_gbps"], s["read_gbps"]) == (1.8, 1.8)
    m = gpu.median_limit(limits)
    assert (m.write_mbps, m.read_mbps, m.source) == (1800.0, 1800.0, "engine:direct")


def test_round_order_puts_each_item_first_in_turn() -> None:
    from benchmarks.harness import round_order

    libs = ("pyfastensor", "torch", "safetensors")
    assert [round_order(libs, r) for r in range(4)] == [
        ["pyfastensor", "torch", "safetensors"], ["torch", "safetensors", "pyfastensor"],
        ["safetensors", "pyfastensor", "torch"], ["pyfastensor", "torch", "safetensors"]]
    assert round_order((), 3) == []


def fake_rounds(monkeypatch: pytest.MonkeyPatch, libraries: dict) -> None:
    """checkpoint_rows over ``libraries`` (name -> (save, load)) on a machine without a GPU: each
    timed call takes 1 s, the disk's limit is 1 GB/s, async_save writes an empty file at once."""
    from concurrent.futures import Future

    import pyfastensor
    from pyfastensor.bench import disk
    from pyfastensor.bench.disk import DiskLimit

    def async_save(state: object, path: str) -> Future:
        open(path, "wb").close()
        f: Future = Future()
        f.set_result(None)
        return f

    monkeypatch.setattr(gpu, "_libraries", lambda: libraries)
    monkeypatch.setattr(gpu, "_timed", lambda fn: (fn(), 1.0)[1])
    monkeypatch.setattr(gpu, "round_limit", lambda d, n: DiskLimit(write_mbps=1e3, read_mbps=1e3, source="s",
                                                                  write_how="w", read_how="r", note=""))
    monkeypatch.setattr(pyfastensor, "async_save", async_save)
    monkeypatch.setattr(disk, "drop_caches", lambda paths: None)
    monkeypatch.setattr(disk, "cache_files", lambda paths: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)


def test_checkpoint_rounds_start_with_each_library_in_turn(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No library always takes the first place of a round (right after the disk's limit or the
    async save's write): saves, cold loads and warm loads each rotate, round by round."""


    calls: list[tuple[str, str]] = []

    def lib(name: str) -> tuple:
        def save(state: object, path: str) -> None:
            calls.append(("save", name))
            open(path, "wb").close()

        def load(path: str) -> None:
            calls.append(("load", name))
        return save, load

    libs = ("pyfastensor", "torch", "safetensors")
    fake_rounds(monkeypatch, {n: lib(n) for n in libs})
    out = gpu.checkpoint_rows(str(tmp_path), {}, 3, progress=lambda line: None)
    assert all(len(v) == 3 for row in ("save", "cold", "warm") for v in out["seconds"][row].values())
    warmup, calls = calls[:6], calls[6:]
    assert warmup == [(op, n) for n in libs for op in ("save", "load")], "one untimed save and load each, first"
    per_round = [calls[9 * r:9 * (r + 1)] for r in range(3)]
    for r, got in enumerate(per_round):
        want = [libs[(r + i) % 3] for i in range(3)]
        assert got == [("save", n) for n in want] + [("load", n) for n in want] * 2, f"round {r}"
    assert [got[0][1] for got in per_round] == list(libs), "each library first once"
    assert list(tmp_path.iterdir()) == [], "the rounds' files are removed"


def test_a_peer_that_fails_is_left_out_and_said_the_rest_measured(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """safetensors' warm load fails in the first round: its figures go (rows are compared round by
    round), the report says why, and pyfastensor's and torch's rounds all stand."""


    loads = {"n": 0}

    def lib(name: str) -> tuple:
        def save(state: object, path: str) -> None:
            open(path, "wb").close()

        def load(path: str) -> None:
            if name == "safetensors":
                loads["n"] += 1
                if loads["n"] == 3:  # after the warm-up's and round 1's cold load: its warm one
                    raise RuntimeError("CUDA error: out of memory")
        return save, load

    fake_rounds(monkeypatch, {n: lib(n) for n in ("pyfastensor", "torch", "safetensors")})
    out = gpu.checkpoint_rows(str(tmp_path), {}, 3, progress=lambda line: None)
    assert out["failed"] == {"safetensors": "warm: RuntimeError: CUDA error: out of memory"}
    for row in ("save", "cold", "warm"):
        assert sorted(out["seconds"][row]) == ["pyfastensor", "torch"]
        assert all(len(v) == 3 for v in out["seconds"][row].values())
    out["limit"] = gpu.limit_summary(out.pop("limits"))
    out.update(device="d", torch="t", pinned_gbps={"d2h": 1.0, "h2d": 1.0}, state_bytes=10**9, tensors=1)
    out["targets"] = gpu.evaluate(out)
    text = gpu.format_report(out)
    assert "safetensors failed and is left out: warm: RuntimeError: CUDA error: out of memory" in text
    assert "not measured" in text and "cold load to CUDA >= 1.2x safetensors" in text
    assert list(tmp_path.iterdir()) == []

