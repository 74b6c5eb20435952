"""``python -m benchmarks data``: the metrics on hand-made orders, and tiny runs end to end.

No timing is asserted here: figures belong to benchmarks, not tests. The
runs check behaviour: every loader delivers every sample exactly once (read
back from the index each sample carries), what cannot run here is printed
as skipped with the reason.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks import data as bd
from benchmarks import data_loaders as dlm
from benchmarks import main

TINY = ["--files", "300", "--file-size", "2K", "--classes", "6", "--batch-size", "32",
        "--chunk-size", "16", "--shard-size", "64K", "--rounds", "1"]


# ---------------------------------------------------------------- metrics


def test_label_entropy_sorted_vs_shuffled():
    labels = np.repeat(np.arange(4), 64)  # class-sorted, 4 classes
    sorted_h = bd.label_entropy(labels, [32] * 8)
    assert np.allclose(sorted_h, 0.0)  # each batch one class
    balanced = np.tile(np.arange(4), 64)  # each batch 8 of every class
    assert np.allclose(bd.label_entropy(balanced, [32] * 8), 2.0)
    shuffled = np.random.default_rng(0).permutation(labels)
    h = bd.label_entropy(shuffled, [32] * 8)
    assert np.all((h > 1.5) & (h <= 2.0))
    assert bd.label_entropy(np.array([0, 1, 1]), [1, 2]).tolist() == [0.0, 0.0]


def test_spearman():
    x = np.arange(100)
    assert bd.spearman(x, x) == pytest.approx(1.0)
    assert bd.spearman(x, x[::-1]) == pytest.approx(-1.0)
    assert bd.spearman(x, x ** 3) == pytest.approx(1.0)  # ranks, not values
    assert abs(bd.spearman(x, np.random.default_rng(1).permutation(100))) < 0.3
    assert bd.spearman(x, np.zeros(100)) == 0.0
    # ties averaged, as scipy.stats.spearmanr: [1, 2, 2, 3] vs [1, 2, 3, 4]
    assert bd.spearman(np.array([1, 2, 2, 3]), np.arange(4)) == pytest.approx(0.9486832980505138)
    with pytest.raises(ValueError):
        bd.spearman(x, x[:5])


def test_diff_entropy_is_streamings_metric():
    assert bd.diff_entropy(np.arange(1000)) == 0.0  # every difference 1
    assert bd.diff_entropy(np.array([0, 2, 1, 3])) == pytest.approx(0.9182958340544896)  # |d| = 2, 1, 2
    full = bd.diff_entropy(np.random.default_rng(0).permutation(10_000))
    assert full > 11.0  # about log2(n) minus a bit


def test_distinct_per_batch():
    groups = np.array([0, 0, 1, 1, 2, 3, 3, 3])
    assert bd.distinct_per_batch(groups, [4, 4]).tolist() == [2, 2]
    assert bd.distinct_per_batch(groups, [3, 5]).tolist() == [2, 3]


def test_order_metrics_exactly_once():
    n = 64
    idx = np.arange(n)
    m = bd.order_metrics(idx, idx * 4 // n, idx, idx // 8, [16] * 4, n)
    assert m["exactly_once"] and m["missing"] == 0 and m["duplicated"] == 0
    assert m["spearman_disk"] == pytest.approx(1.0) and m["distinct_groups"] == 2.0
    dup = idx.copy()
    dup[5] = 6
    m = bd.order_metrics(dup, dup * 4 // n, dup, None, [16] * 4, n)
    assert not m["exactly_once"] and m["missing"] == 1 and m["duplicated"] == 1
    assert m["distinct_groups"] is None
    full = bd.full_shuffle_metrics(1000, 10, 100, 10)
    assert full["exactly_once"] and full["label_entropy"] > 3.0 and abs(full["spearman_disk"]) < 0.2


def test_block_device_and_diskstats(tmp_path):
    dev, name = bd.block_device(tmp_path)
    if not dev:
        assert "no block device" in name or "cannot read" in name
        return
    assert ":" in dev and name
    assert bd.diskstats_read_bytes(dev) is None or bd.diskstats_read_bytes(dev) >= 0


def test_cgroups_refused_without_root(monkeypatch):
    monkeypatch.setattr(bd.os, "geteuid", lambda: 1000)
    why = bd.cgroup_support("8:0")
    assert all("not root" in v for v in why.values())


# ---------------------------------------------------------------- formats and loaders


def test_every_format_and_loader_delivers_each_sample_once(tmp_path):
    """In-process, no cgroups: each loader's epoch holds every sample once, labels and indices agree."""
    layout = dlm.write_datasets(tmp_path, files=200, file_size=1024, classes=5, shard_bytes=32 * 1024,
                                chunk_size=16)
    assert layout["dataset_bytes"] == 200 * 1024 and layout["per_shard"] == 32
    for name in dlm.LOADERS:
        if dlm.peer_missing(name):
            continue
        workers = 0 if name == "chunk" else 2
        r = dlm.read_epoch(name, tmp_path, layout, batch_size=16, workers=workers, seed=0,
                           budget=64 * 1024)
        assert sorted(r["index"].tolist()) == list(range(200)), name
        assert r["mismatch"] == 0, name
        assert r["batch_sizes"].sum() == 200
        assert (r["label"] == dlm.label_of(r["index"], 200, 5)).all()
        if name == "chunk":
            assert sorted(r["position"].tolist()) == list(range(200))
            assert r["chunk_stats"]["served"] == 200
        else:
            assert (r["position"] == r["index"]).all()


def test_write_datasets_refuses_other_parameters(tmp_path):
    dlm.write_datasets(tmp_path, files=20, file_size=64, classes=2, shard_bytes=640, chunk_size=4,
                       formats=("dataloader",))
    with pytest.raises(ValueError, match="other parameters"):
        dlm.write_datasets(tmp_path, files=21, file_size=64, classes=2, shard_bytes=640, chunk_size=4)


# ---------------------------------------------------------------- the command line


def test_cli_tiny_run(tmp_path, capsys):
    """Every loader in a child (in the cgroups as root), on the plain disk (the throttle's cgroup
    is checked by test_reader_cgroups_hold_a_child_and_go, its skip by the next test)."""
    out_json = tmp_path / "data.json"
    argv = ["data", "--dir", str(tmp_path / "d"), *TINY, "--settings", "plain", "--no-plot",
            "--json", str(out_json)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    doc = json.loads(out_json.read_text())
    ran = doc["settings"]["loaders"]
    assert "dataloader" in ran and "chunk" in ran
    for name in dlm.LOADERS:
        if name in ran:
            m = doc["order"][name]
            assert m["exactly_once"], (name, m["missing"], m["duplicated"])
        else:
            assert f"skipped {dlm.LOADER_NAMES[name]}:" in text and "pip install" in text
    for run in doc["runs"]:
        assert run["error"] == "", run
        assert run["mismatch"] == 0 and run["samples"] == 300
    assert doc["settings"]["settings"] == ["plain"] and len(doc["runs"]) == len(ran)
    if doc["settings"]["chunk_workers"] == 0:
        assert "ChunkDataset ran with num_workers=0, not 2" in text
    assert "randomness of the order" in text and "targets:" in text
    assert "disk limit (" in text and doc["settings"]["limit_read_mbps"] > 0  # measured in the same run
    assert {t["met"] for t in doc["targets"]} <= {True, False, None}
    assert not list((tmp_path / "d").glob(".pyfastensor-bench-data-*"))  # work files removed


def test_cli_missing_peers_and_no_throttle(tmp_path, capsys, monkeypatch):
    """A peer that is not installed, and a throttle that cannot be set, are printed as skipped."""
    monkeypatch.setattr(dlm, "peer_missing", lambda name: "" if name in ("dataloader", "chunk")
                        else f"{name} is not installed (pip install {name})")
    real = bd.cgroup_support
    monkeypatch.setattr(bd, "cgroup_support",
                        lambda dev: {**real(dev), "throttle": "no blkio.throttle.read_iops_device"})
    argv = ["data", "--dir", str(tmp_path), *TINY, "--loaders", "dataloader,streaming,webdataset",
            "--no-plot"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "skipped Streaming (MDS): streaming is not installed" in text
    assert "skipped WebDataset (tar): webdataset is not installed" in text
    assert "skipped setting throttled: IOPS throttle not applied: no blkio.throttle.read_iops_device" in text
    assert "DataLoader (files)" in text
    assert "not measured" in text  # ChunkDataset's targets, not run


def test_convergence_tiny(tmp_path):
    conv = bd.run_convergence(tmp_path, files=120, classes=3, epochs=1, batch_size=16, chunk_size=8)
    for name, r in conv["loaders"].items():
        assert len(r["loss"]) >= 120 // 16 and len(r["accuracy"]) == 1, name
        assert all(np.isfinite(r["loss"]))
    assert "chunk" in conv["loaders"] and "dataloader" in conv["loaders"]
    lines = bd.format_convergence(conv)
    assert lines[0].startswith("convergence: small CNN")


def test_plot(tmp_path):
    pytest.importorskip("matplotlib")
    full = bd.full_shuffle_metrics(100, 4, 10, 10)
    summ = {"plain": {"dataloader": {"samples_per_s": 10.0, "min": 9.0, "max": 11.0}}}
    result = {"settings": {"loaders": ["dataloader"], "settings": ["plain"], "iops": 1000, "files": 100,
                           "file_size": 1024, "batch_size": 10, "classes": 4},
              "summary": summ, "order": {"dataloader": full}, "full_shuffle": full,
              "convergence": {"settings": {"epochs": 1}, "loaders": {"chunk": {"loss": [2.0, 1.0],
                                                                               "accuracy": [0.5]}}}}
    png = bd.plot(result, tmp_path / "p.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["data", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for word in ("RandomSampler", "Streaming", "WebDataset", "ChunkDataset", "drop_caches",
                 "memory.limit_in_bytes", "read_iops_device", "Spearman", "--convergence", "root"):
        assert word in text, word


def test_cli_unknown_loader(tmp_path, capsys):
    assert main(["data", "--dir", str(tmp_path), "--loaders", "floppy", "--no-plot"]) == 1
    assert "unknown loader or setting floppy" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_reader_cgroups_hold_a_child_and_go(tmp_path):
    """As root with cgroup v1: the child joins both cgroups, the counters read, the cgroups are removed."""
    import subprocess
    import sys

    dev, _ = bd.block_device(tmp_path)
    support = bd.cgroup_support(dev)
    if support["memory"] or support["blkio"]:
        pytest.skip(f"cgroups not usable here: {support['memory'] or support['blkio']}")
    groups = bd.ReaderCgroups(f"pyfastensor-test-{tmp_path.name}", support, memory_limit=512 << 20,
                              device=dev, iops=0 if support["throttle"] else 1000)
    dirs = dict(groups.dirs)
    try:
        assert set(dirs) == {"memory", "blkio"}
        assert int((dirs["memory"] / "memory.limit_in_bytes").read_text()) == 512 << 20
        if not support["throttle"]:
            assert f"{dev} 1000" in (dirs["blkio"] / "blkio.throttle.read_iops_device").read_text()
        out = subprocess.run([sys.executable, "-c", "print(open('/proc/self/cgroup').read())"],
                             capture_output=True, text=True, preexec_fn=groups.join, check=True).stdout
        assert all(f"/{d.name}" in out for d in dirs.values()), out
        assert groups.read_bytes() is not None and groups.peak_memory() > 0
        assert groups.oom_kills() == 0
    finally:
        groups.remove()
    assert not any(d.exists() for d in dirs.values())
