"""Smoke test of ``python -m benchmarks offload`` on tiny models (no timing assertions)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

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


def test_cuda_table_reports_bounds_targets_and_a_missing_trl():
    from benchmarks import offload_cuda

    def row(step: float, peak: float, **extra: float) -> dict:
        return {"step_s": step, "peak_bytes": int(peak * 1e9), **extra}

    rows = {"none": row(0.040, 5.85), "checkpoint": row(0.049, 3.13), "save_on_cpu": row(0.348, 2.76),
            "trl": {"missing": "not installed"},
            "pft-host": row(0.180, 2.76, bytes=4_000_000_000, pinned_allocations=0, pinned_bytes=1, stash_hits=3,
                            stash_bytes=250_000_000),
            "pft-ssd": row(0.900, 2.76, bytes=4_000_000_000, pinned_allocations=0, pinned_bytes=1),
            "scheduled": row(0.050, 4.4, bytes=1, pinned_allocations=0, pinned_bytes=1, resident_peak=2, budget=3),
            "planned": row(0.060, 4.6, bytes=1, pinned_allocations=0, pinned_bytes=1, resident_peak=4, budget=3)}
    for name, r in rows.items():
        if name in offload_cuda.OFFLOAD_ROWS and "step_s" in r:
            r["bound_s"] = 0.160 if name.startswith("pft") else 0.045
            r["bound_ratio"] = r["step_s"] / r["bound_s"]
    bound = {"forward_s": 0.013, "backward_s": 0.027, "d2h_bps": 52e9, "h2d_bps": 50e9, "bytes": 4e9}
    text = offload_cuda.format_report({"model": offload_cuda.GPT_QUICK, "rows": rows, "bound": bound})
    assert "trl" in text and "not installed" in text
    assert "met          host offload step <= 1.25x its bound: 1.12\n" in text
    assert "met          host offload >= 1.5x save_on_cpu's speed: 1.93\n" in text
    assert ("not measured host offload at least as fast as TRL's OffloadActivations: - "
            "(trl: not installed)") in text
    assert "NOT MET      ssd offload step <= 1.25x its bound (link and disk): 5.62\n" in text
    assert "pft-host's forward stash: 3 tensors, 0.25 GB used in backward without a copy back" in text
    assert "met          scheduled: saved tensors' resident peak within its budget: 0.67\n" in text
    assert ("NOT MET      scheduled: no slower than checkpointing where its bound is below checkpointing's "
            "step: 1.02\n") in text
    assert "NOT MET      planned: saved tensors' resident peak within its budget: 1.33\n" in text
    rows["planned"]["bound_s"] = 0.050  # above checkpointing's step: that target does not apply
    text = offload_cuda.format_report({"model": offload_cuda.GPT_QUICK, "rows": rows, "bound": bound})
    assert ("not measured planned: no slower than checkpointing where its bound is below checkpointing's step: - "
            "(not applicable: its bound is 1.02x checkpointing's step)") in text


def test_cuda_bound_takes_the_disk_for_the_bytes_that_go_to_it():
    from benchmarks.offload_cuda import bound

    link, disk = (50e9, 40e9), (2e9, 1e9)
    # Host tier: the link alone (the compute is longer on the way down, the copies on the way up).
    assert bound(0.010, 0.030, int(1e9), 0, link, disk) == pytest.approx(0.020 + 0.030)
    # Half of it to the disk: that half at the disk's speed.
    assert bound(0.010, 0.030, int(1e9), int(5e8), link, disk) == pytest.approx(0.25 + 0.5)
    # The disk not measured: the link's bound.
    assert bound(0.010, 0.030, int(1e9), int(5e8), link, None) == pytest.approx(0.020 + 0.030)
    # A forward stash of 0.6 GB is used in backward where it is: only 0.4 GB come back.
    assert bound(0.001, 0.001, int(1e9), 0, link, None, back=int(4e8)) == pytest.approx(0.020 + 0.010)


def test_gpt_workload_needs_cuda():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "offload", "--workload", "gpt", "--quick"],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode != 0
    assert "offload --workload gpt trains on a GPU: add --device cuda" in out.stderr


def test_pareto_compares_each_auto_row_with_the_fastest_peer_that_fits_and_its_prediction():
    from benchmarks import pareto

    def row(ms, mib, **kw):
        return {"steps_s": [ms / 1e3, ms / 1e3 * 1.02], "peaks_bytes": [mib << 20], "step_s": ms / 1e3,
                "peak_bytes": mib << 20, **kw}

    result = {"model": pareto.CPU_QUICK, "device": "cpu", "rounds": 2, "min_budget": 8 << 20,
              "plan_48_layers_s": 0.2, "missing": {"trl": "TRL's OffloadActivations moves CUDA tensors only"},
              "rows": {"none": row(100, 100), "checkpoint": row(140, 40), "sac": row(120, 80),
                       "auto@1": row(101, 100, budget=100 << 20, predicted_step_s=0.102, warmup_s=[0.2, 0.15]),
                       "auto@0.5": row(115, 60, budget=60 << 20, predicted_step_s=0.14, warmup_s=[0.2, 0.2],
                                       planning_s=0.01),
                       "auto@0.25": row(130, 45, budget=45 << 20, predicted_step_s=0.11, warmup_s=[0.2, 0.2],
                                        consecutive_s=[0.105, 0.11, 0.2]),
                       "auto@0": row(150, 30, budget=30 << 20, predicted_step_s=0.15, warmup_s=[0.2, 0.25])}}
    targets = {t["target"].split(" (")[0]: t for t in pareto.evaluate(result)}
    peer = targets["auto@1 no slower than 1.05x the fastest peer that fits"]
    assert peer["met"] and peer["median"] == pytest.approx(1.01)  # none fits 100 MiB
    mid = targets["auto@0.5 no slower than 1.05x the fastest peer that fits"]
    assert "(checkpoint)" in mid["target"] and mid["median"] == pytest.approx(115 / 140)  # sac's 80 MiB does not fit
    assert targets["auto@0 against the peers that fit"]["met"] is None
    assert not targets["auto@0.5 prediction within 15% of its step repeated"]["met"]  # 140 against 115
    # Judged on its steps repeated (median 110 ms), the rounds' median (130 ms) shown beside it.
    repeated = targets["auto@0.25 prediction within 15% of its step repeated"]
    assert repeated["met"] and repeated["median"] == pytest.approx(0.0) and "(rounds' median: -15%)" in repeated["target"]
    assert targets["profiling step plus planning at most 2x one step"]["met"]
    text = pareto.format_report({"device": "cpu", "models": [dict(result, targets=list(targets.values()))]})
    for name in ("auto@0.5", "checkpoint", "not run: TRL's", "NOT MET", "budget MiB"):
        assert name in text


def test_pareto_front_sets_our_fastest_that_fits_against_the_peers_fastest_at_each_peer_peak():
    """At each peer's peak, the fastest of our rows (eager or compiled) that fits that budget
    against the fastest peer that fits it; a peak a hair above a budget (the high-water mark's
    jitter) still fits; a budget none of ours reaches is not met."""
    from benchmarks import pareto

    def row(ms, mib, **kw):
        return {"steps_s": [ms / 1e3, ms / 1e3 * 1.02], "peaks_bytes": [int(mib * 2**20)], "step_s": ms / 1e3,
                "peak_bytes": int(mib * 2**20), **kw}

    result = {"device": "cpu", "rows": {
        "none": row(100, 100), "compile@0.5": row(80, 70), "checkpoint": row(140, 40), "sac": row(150, 20),
        "auto@1": row(101, 100), "auto@0": row(130, 30),
        "auto-compiled-model@1": row(82, 70.2),  # 0.3% above compile's peak: fits
        "auto-compiled@0": row(90, 50)}}
    got = {t["target"].split(" the fastest")[0]: t for t in pareto.front(result)}
    top = got["at 100.0 MiB (none's peak)"]
    assert "(auto-compiled-model@1)" in top["target"] and "(compile@0.5)" in top["target"]
    assert top["met"] and top["median"] == pytest.approx(82 / 80)
    assert got["at 70.0 MiB (compile@0.5's peak)"]["median"] == pytest.approx(82 / 80)
    low = got["at 40.0 MiB (checkpoint's peak)"]
    assert "(auto@0)" in low["target"] and low["median"] == pytest.approx(130 / 140) and low["met"]
    assert got["at 20.0 MiB (sac's peak)"]["met"] is False  # none of ours reaches 20 MiB


def test_pareto_aims_a_row_of_ours_at_each_peers_peak_below_the_top():
    """A row of ours per peer's peak below the top of ours (peaks a hair apart aimed once): the
    budget that peak leaves once the step's memory beyond its saved tensors is taken off, less the
    margin; none below the smallest feasible budget."""
    from benchmarks import pareto

    mib = 1 << 20
    peaks = {"none": 138 * mib, "compile-blocks": 138 * mib, "sac": 109 * mib, "compile@0.8": int(108.6 * mib),
             "checkpoint": int(49.8 * mib), "tiny": 10 * mib}
    got = pareto._aims(peaks, 8 * mib, 18 * mib, 138 * mib)
    assert list(got) == ["sac", "checkpoint"]
    assert got["sac"] == int((109 - 8) * mib * (1 - pareto.AIM_MARGIN))
    assert got["checkpoint"] == int((int(49.8 * mib) - 8 * mib) * (1 - pareto.AIM_MARGIN))


def test_pareto_compiles_the_model_under_ours_at_the_fastest_compile_rows_memory_budget():
    """The whole model under ours is compiled at the budget of the compile@B row whose warm-up steps
    after the first (which compiles) have the lowest median; torch.compile's defaults where none ran."""
    from benchmarks import pareto

    warm = {"none": [0.1, 0.1, 0.1], "compile@0.8": [9.0, 0.26, 0.4, 0.25],
            "compile@0.5": [0.1, 0.29, 0.2, 0.29], "compile@0.2": [8.0, 0.31, 0.3, 0.3]}
    assert pareto.fastest_compile_budget(warm) == 0.8  # not 0.5's one fast step, nor its first
    assert pareto.fastest_compile_budget(dict(warm, **{"compile@0.5": [9.0, 0.2, 0.2, 0.3]})) == 0.5
    assert pareto.fastest_compile_budget({"none": [0.1, 0.1], "compile@0.8": [9.0]}) is None


def test_pareto_is_an_option_of_the_offload_benchmark():
    out = subprocess.run([sys.executable, "-m", "benchmarks", "offload", "--help"],
                         capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "--pareto" in out and "--rounds" in out and "torch.compile" in out
