"""The adaptive dictionaries from Python: files written by the Go side, ``dict show|path|reset``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pyfastensor.dictionary as pd
from pyfastensor.cli import main

MS = 1e-3

# Injected timings: direct writes faster, posix reads faster, mmap slowest.
TIMES = {
    "write": {"posix": 2 * MS, "direct": 1 * MS},
    "read": {"posix": 1 * MS, "direct": 3 * MS, "mmap": 4 * MS},
}


def _build(path: Path, directory: Path) -> None:
    """Write a dictionary file through the native library with the injected timings."""
    with pd.Dictionaries(path, directory=directory, write=["posix", "direct"],
                         read=["posix", "direct", "mmap"], save_interval=-1) as d:
        for size in (1 << 20, 4096):
            for op, n in (("write", 3), ("read", 4)):
                for _ in range(n):
                    e = d.engine(op, size)
                    d.observe(op, size, e, TIMES[op][e])
        assert d.engine("write", 1 << 20, use="write_read") == "posix"  # 2+1 < 1+3


def _rows(out: str, title: str) -> list[list[str]]:
    """The rows of one table of ``dict show``, split on runs of two spaces."""
    lines = out.splitlines()
    start = lines.index(title) + 1
    rows = []
    for line in lines[start:]:
        if not line.startswith("  "):
            break
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


def test_show_prints_the_rows_of_a_file_written_by_go(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    _build(path, tmp_path)
    doc = json.loads(path.read_text())
    assert doc["schema"] == 1 and doc["key"]["fs_type"]

    assert main(["dict", "show", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert f"dictionary {path}" in out
    assert "warning" not in out
    assert _rows(out, "write (WDic)") == [
        ["bucket", "posix", "direct", "best"],
        ["4K", "2.00 ms (1)", "1.00 ms (2)", "direct"],
        ["1M", "2.00 ms (1)", "1.00 ms (2)", "direct"],
    ]
    assert _rows(out, "read (RDic)") == [
        ["bucket", "posix", "direct", "mmap", "best"],
        ["4K", "1.00 ms (2)", "3.00 ms (1)", "4.00 ms (1)", "posix"],
        ["1M", "1.00 ms (2)", "3.00 ms (1)", "4.00 ms (1)", "posix"],
    ]
    # WRDic: the best sum of write and read over engines that do both.
    assert _rows(out, "write+read (WRDic)") == [
        ["bucket", "posix", "direct", "best"],
        ["4K", "3.00 ms (1)", "4.00 ms (1)", "posix"],
        ["1M", "3.00 ms (1)", "4.00 ms (1)", "posix"],
    ]


def test_show_json_and_load(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    _build(path, tmp_path)
    assert main(["dict", "show", "--path", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown == pd.load(path)
    assert [e["best"] for e in shown["dictionaries"]["write"]] == ["direct", "direct"]


def test_path_is_per_machine_under_the_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    cache = tmp_path / "cache"
    monkeypatch.setenv("PYFASTENSOR_CACHE_DIR", str(cache))
    assert main(["dict", "path", "--dir", str(tmp_path)]) == 0
    printed = Path(capsys.readouterr().out.strip())
    assert printed.parent == cache
    assert re.fullmatch(r"dict-[\w.-]+-[\w.-]+-[0-9a-f]{12}\.json", printed.name)
    assert printed == pd.dictionary_path(tmp_path)
    assert pd.locate(tmp_path)["key"]["device"]


def test_default_path_round_trip_and_reset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("PYFASTENSOR_CACHE_DIR", str(tmp_path / "cache"))
    _build(pd.dictionary_path(tmp_path), tmp_path)  # the per-machine file
    assert main(["dict", "show", "--dir", str(tmp_path)]) == 0
    assert "1M" in capsys.readouterr().out
    assert main(["dict", "reset", "--dir", str(tmp_path)]) == 0
    assert "removed" in capsys.readouterr().out
    assert not pd.dictionary_path(tmp_path).exists()
    assert main(["dict", "reset", "--dir", str(tmp_path)]) == 0
    assert "no dictionary file" in capsys.readouterr().out
    assert main(["dict", "show", "--dir", str(tmp_path)]) == 0  # nothing saved yet on this machine: said, no error
    out = capsys.readouterr()
    assert out.out.startswith(f"no dictionary file yet: {pd.dictionary_path(tmp_path)}") and out.err == ""
    assert main(["dict", "show", "--dir", str(tmp_path), "--json"]) == 0  # JSON still, for scripts
    assert json.loads(capsys.readouterr().out) == {"path": str(pd.dictionary_path(tmp_path)), "exists": False,
                                                   "dictionaries": None, "warnings": []}
    assert main(["dict", "show", "--path", str(tmp_path / "named.json")]) == 1  # a file named: it must exist
    assert "no such file" in capsys.readouterr().err


def test_corrupt_file_is_shown_with_a_warning(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.json"
    path.write_text('{"schema": 1, "write": [{"bucket": 20, "engi')
    assert main(["dict", "show", "--path", str(path)]) == 0
    out = capsys.readouterr().out
    assert "warning: ignoring dictionary file" in out
    assert "(empty)" in out
    # Opening it for use starts fresh with the same warning, and replaces it at close.
    with pd.Dictionaries(path, directory=tmp_path, save_interval=-1) as d:
        assert any("starting with empty dictionaries" in w for w in d.describe()["warnings"])
        d.observe("write", 1 << 20, d.engine("write", 1 << 20), 0.001)
    assert json.loads(path.read_text())["schema"] == 1


def test_unknown_engine_in_a_file_is_dropped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"schema": 1, "write": [{"bucket": 20, "best": "warp9", "engines": {
        "warp9": {"seconds": 0.001, "samples": 1}, "posix": {"seconds": 0.002, "samples": 1}}}]}))
    r = pd.load(path)
    assert any('unknown engine "warp9"' in w for w in r["warnings"])
    assert r["dictionaries"]["write"][0]["best"] == "posix"


def test_specific_modes(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    _build(path, tmp_path)
    with pd.Dictionaries(path, directory=tmp_path, mode="dict", write=["posix", "direct"],
                         read=["posix", "direct"]) as d:
        for _ in range(5):
            dec = d.decide("write", 1 << 20)
            assert dec["engine"] == "direct" and not dec["exploring"]
    with pd.Dictionaries("", directory=tmp_path, mode="tool", tool="mmap") as d:
        assert d.engine("read", 123) == "mmap"
        dec = d.decide("write", 123)
        assert dec["engine"] != "mmap" and "cannot write" in dec["reason"]
    with pytest.raises(ValueError, match="tool="):
        pd.Dictionaries("", mode="tool")


def test_observations_left_unsaved_are_saved_at_exit(tmp_path: Path) -> None:
    path = tmp_path / "dict.json"
    child = ("import sys, pyfastensor.dictionary as pd\n"
             "d = pd.Dictionaries(sys.argv[1], directory=sys.argv[2])  # saves every 30 s at most\n"
             "d.observe('write', 1 << 20, 'posix', 0.001)\n")
    r = subprocess.run([sys.executable, "-c", child, str(path), str(tmp_path)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert path.exists(), "the observation made since the last save was lost at exit"
    with pd.Dictionaries(path, directory=tmp_path, mode="dict") as d:
        rows = d.describe()["dictionaries"]["write"]
    assert [(r["size"], r["engines"]["posix"]["samples"]) for r in rows] == [(1 << 20, 1)]
