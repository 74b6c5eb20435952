"""``python -m pyfastensor bench io``: the CLI end to end at tiny sizes, and fio JSON parsing.

No timing is asserted here: figures belong to benchmarks, not tests.
"""

from __future__ import annotations

import json

import pytest

import pyfastensor
from pyfastensor.bench import disk, io
from pyfastensor.cli import main
from pyfastensor.engines import ENGINES

# Trimmed from `fio --output-format=json` (fio-3.33), one read job, with the
# warning line fio may print before the JSON.
FIO_READ_JSON = """\
fio: this platform does not support process shared mutexes, forcing use of threads.
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {
      "jobname" : "limit-read",
      "groupid" : 0,
      "error" : 0,
      "read" : {"io_bytes" : 1073741824, "bw_bytes" : 1201053494, "bw" : 1172903,
                "iops" : 71.588367, "runtime" : 894},
      "write" : {"io_bytes" : 0, "bw_bytes" : 0, "bw" : 0, "iops" : 0.0, "runtime" : 0}
    }
  ]
}
"""

FIO_TWO_WRITE_JOBS = json.dumps({
    "fio version": "fio-3.33",
    "jobs": [
        {"jobname": "w", "error": 0, "write": {"bw_bytes": 1000}, "read": {"bw_bytes": 0}},
        {"jobname": "w", "error": 0, "write": {"bw_bytes": 500}, "read": {"bw_bytes": 0}},
    ],
})


def test_parse_fio_json_read():
    assert disk.parse_fio_json(FIO_READ_JSON, "read") == 1201053494.0


def test_parse_fio_json_sums_jobs():
    assert disk.parse_fio_json(FIO_TWO_WRITE_JOBS, "write") == 1500.0


@pytest.mark.parametrize(
    "text, rw, match",
    [
        (FIO_READ_JSON, "write", "no write bandwidth"),
        ("fio: engine libaio not loadable\n", "read", "no JSON"),
        ("{ not json", "read", "not valid JSON"),
        (json.dumps({"jobs": []}), "read", "no jobs"),
        (json.dumps({"jobs": [{"jobname": "r", "error": 5, "read": {"bw_bytes": 9}}]}), "read",
         "failed with error 5"),
        (FIO_READ_JSON, "trim", "expected 'read' or 'write'"),
    ],
)
def test_parse_fio_json_errors(text, rw, match):
    with pytest.raises(ValueError, match=match):
        disk.parse_fio_json(text, rw)


def test_parse_sizes():
    assert io.parse_sizes("4K,64k,1M,4K") == [4096, 65536, 1 << 20]
    assert io.parse_sizes("pow4")[0] == 4096 and io.parse_sizes("pow4")[-1] == 1 << 30
    assert len(io.parse_sizes("pow2")) == 19
    with pytest.raises(ValueError):
        io.parse_sizes("4K,0")
    with pytest.raises(ValueError):
        io.parse_sizes("lots")


def test_aligned_buffer():
    for n in (1, 4096, 5000):
        b = disk.aligned_buffer(n)
        assert b.nbytes == n and b.ctypes.data % 4096 == 0


def _available(directory) -> list[str]:
    engines = pyfastensor.info(directory)["engines"]
    return sorted(n for n, e in engines.items() if e["available"])


@pytest.mark.parametrize("limit_args", [["--limit-size", "8M"], ["--no-fio", "--limit-size", "64M"]])
def test_cli_smoke(tmp_path, capsys, limit_args):
    work = tmp_path / "work"
    work.mkdir()
    out_json = tmp_path / "io.json"
    argv = ["bench", "io", "--dir", str(work), "--sizes", "4K,64K", "--total", "1M",
            "--no-cold", "--no-plot", "--json", str(out_json), *limit_args]
    assert main(argv) == 0
    text = capsys.readouterr().out

    available = _available(work)
    assert available, "no engine available?"
    lines = text.splitlines()
    for name in available:
        # A row per engine in every table (header, limit, engine rows).
        assert sum(1 for ln in lines if ln.startswith(f"{name} ")) >= 2, (name, text)
        assert any(ln.strip().startswith(name) for ln in lines if "(>= 90%" in ln or "read only" in ln)
    assert any(ln.startswith("disk limit (") for ln in lines), text
    assert sum(1 for ln in lines if ln.startswith("disk limit ")) >= 2  # one per table
    if "--no-fio" in limit_args:
        assert "disk limit (engine:" in text and "--no-fio" in text
    for name in ("uring", "cufile"):
        if name not in available:
            assert f"skipped {name}:" in text

    doc = json.loads(out_json.read_text())
    assert {"settings", "dir", "engines", "measured", "skipped", "limit", "results", "summary",
            "elapsed_seconds"} <= doc.keys()
    assert {"write_mbps", "read_mbps", "source", "write_how", "read_how"} <= doc["limit"].keys()
    assert doc["limit"]["write_mbps"] > 0 and doc["limit"]["read_mbps"] > 0
    if "--no-fio" in limit_args or disk.fio_path() is None:
        assert doc["limit"]["source"].startswith("engine:")
    else:
        assert doc["limit"]["source"] == "fio", doc["limit"]["note"]
    assert sorted(doc["measured"]) == available
    assert set(doc["engines"]) == set(ENGINES)
    row_keys = {"engine", "op", "cache", "block", "nbytes", "seconds", "mbps", "served_by",
                "fallback", "runs"}
    assert doc["results"] and all(row_keys <= r.keys() for r in doc["results"])
    assert {r["cache"] for r in doc["results"] if r["op"] == "read"} == {"warm"}  # --no-cold
    for r in doc["results"]:
        assert r["nbytes"] == 1 << 20  # 1M total at 4K and 64K blocks
    for name in available:
        assert {(r["op"], r["block"]) for r in doc["results"] if r["engine"] == name} >= {
            ("read", 4096), ("read", 65536)}
    assert set(doc["summary"]) == set(available)

    assert sorted(int(b) for b in doc["crc_mbps"]) == [4096, 65536]
    assert all(v > 0 for v in doc["crc_mbps"].values())
    assert sum(1 for ln in lines if ln.startswith("crc32, 1 core ")) >= 2  # beside the engines in each table

    assert list(work.iterdir()) == []  # nothing left behind


def test_cli_cold_and_plot(tmp_path, capsys):
    """Cold reads (drop_caches as root, fadvise otherwise) and the PNG, one small size."""
    pytest.importorskip("matplotlib")
    work = tmp_path / "work"
    work.mkdir()
    png = tmp_path / "out" / "io.png"
    argv = ["bench", "io", "--dir", str(work), "--sizes", "64K", "--total", "256K",
            "--no-fio", "--limit-size", "64M", "--engines", "posix", "--plot", str(png)]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "read MB/s, cold" in text and "cold read 64K" in text
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert list(work.iterdir()) == []


def test_cli_unknown_engine(tmp_path, capsys):
    assert main(["bench", "io", "--dir", str(tmp_path), "--engines", "floppy", "--no-plot"]) == 1
    assert "unknown engine" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_help_explains(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "io", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "fio" in text and "O_DIRECT" in text and "drop_caches" in text and "root" in text


def test_drop_caches_without_root_uses_fadvise(tmp_path, monkeypatch):
    monkeypatch.setattr(disk.os, "geteuid", lambda: 1000)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 65536)
    assert not disk.can_drop_caches()
    assert "POSIX_FADV_DONTNEED" in disk.cold_cache_method()
    assert disk.drop_caches([f]) == "fadvise"


def test_timed_pass_moves_whole_blocks(tmp_path):
    buf = disk.aligned_buffer(8192)
    buf[:] = 7
    p = tmp_path / "f.bin"
    w = disk.timed_pass(p, buf, engine="posix", write=True, block=8192, total=20000)
    assert w.nbytes == 16384 and p.stat().st_size == 16384
    r = disk.timed_pass(p, buf, engine="posix", write=False, block=8192, total=1 << 20)
    assert r.nbytes == 16384 and r.engine == "posix" and r.fallback == ""
    one = disk.timed_pass(p, buf, engine="posix", write=True, block=8192, total=1)
    assert one.nbytes == 8192  # at least one block
