"""Durable saves: crash safety under SIGKILL, full disks, unwritable directories, stale temp files."""

from __future__ import annotations

import errno
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from checkpoint_helpers import assert_same, evict

import pyfastensor
from pyfastensor import NoSpaceError

CHILD = r"""
import sys, torch, pyfastensor
target, v = sys.argv[1], int(sys.argv[2])
def make(v):
    return {"w": torch.full((1_500_000,), float(v)), "b": torch.full((3000,), float(v), dtype=torch.float64),
            "small": [torch.full((10,), v) for _ in range(20)], "v": v}
print("ready", flush=True)
while True:
    v += 1
    pyfastensor.save(make(v), target)
    print("saved", v, flush=True)
"""

#: Rounds of the SIGKILL test: each starts a saving process per target and kills them all.
ROUNDS = 4


def check_whole(path: Path) -> int:
    """Load a checkpoint and check it is one complete version; return the version."""
    got = pyfastensor.load(path)
    v = got["v"]
    assert torch.equal(got["w"], torch.full((1_500_000,), float(v)))
    assert torch.equal(got["b"], torch.full((3000,), float(v), dtype=torch.float64))
    assert all(torch.equal(t, torch.full((10,), v)) for t in got["small"])
    return v


def temp_files(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if ".pyfastensor-tmp-" in p.name)


def test_sigkill_during_saves_leaves_old_or_new(tmp_path):
    """Kill saving processes at random points: the target always loads as one whole version.

    A killed process cannot remove its temporary file; what it leaves is a
    ``.<name>.pyfastensor-tmp-<pid>@<pidns>-<random>`` file, which loads never look at
    and the next save to the same target removes (its pid is dead).
    """
    rng = random.Random(1234)
    targets = [tmp_path / f"t{i}" / "ck.pt" for i in range(3)]
    versions = {}
    for t in targets:
        t.parent.mkdir()
        pyfastensor.save({"w": torch.full((1_500_000,), 0.0), "b": torch.full((3000,), 0.0, dtype=torch.float64),
                          "small": [torch.full((10,), 0) for _ in range(20)], "v": 0}, t)
        versions[t] = 0
    trials = left = 0
    for _ in range(ROUNDS):
        procs = []
        for t in targets:
            p = subprocess.Popen([sys.executable, "-c", CHILD, str(t), str(versions[t])],
                                 stdout=subprocess.PIPE, text=True)
            procs.append((t, p))
        for _, p in procs:
            assert p.stdout.readline().strip() == "ready"
        # The first process is killed only after a save of its own completed, so some save
        # always completes; the kills land at random points of the saves in progress.
        assert procs[0][1].stdout.readline().startswith("saved")
        for _, p in procs:
            time.sleep(rng.uniform(0.0, 0.4))  # a random point of the save loop; nothing waits on it
            p.send_signal(signal.SIGKILL)
        for t, p in procs:
            p.wait()
            p.stdout.close()
            v = check_whole(t)
            assert v >= versions[t]
            versions[t] = v
            trials += 1
            left = max(left, len(temp_files(t.parent)))
    assert trials == ROUNDS * len(targets)
    assert any(v > 0 for v in versions.values()), "no save ever completed"
    print(f"{trials} kills; versions reached {sorted(versions.values())}; at most {left} temp files left at once")
    for t in targets:
        # Whatever temp files the kills left, the next save removes them.
        pyfastensor.save({"v": -1}, t)
        assert temp_files(t.parent) == []
        assert pyfastensor.load(t) == {"v": -1}


def test_durable_false_and_temp_names(tmp_path):
    target = tmp_path / "ck.pt"
    pyfastensor.save({"x": torch.ones(3)}, target, durable=False)
    assert torch.equal(pyfastensor.load(target)["x"], torch.ones(3))
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".ck.pt.pyfastensor-tmp-{dead.pid}-abcdef"
    stale.write_bytes(b"half a checkpoint")
    live = tmp_path / f".ck.pt.pyfastensor-tmp-{os.getpid()}-abcdef"
    live.write_bytes(b"someone else's save in progress")
    pyfastensor.save({"x": torch.zeros(3)}, target)
    assert not stale.exists() and live.exists()


def test_full_disk_keeps_previous_checkpoint(mount_fs):
    d = mount_fs("tmpfs", "size=2m")
    target = d / "ck.pt"
    old = {"w": torch.arange(25_000, dtype=torch.float32)}
    pyfastensor.save(old, target)
    with pytest.raises(NoSpaceError) as e:
        pyfastensor.save({"w": torch.zeros(1_000_000)}, target)
    assert str(target) in str(e.value)
    assert isinstance(e.value, OSError)
    assert torch.equal(pyfastensor.load(target)["w"], old["w"])
    assert temp_files(d) == []


def test_unwritable_directory_is_a_permission_error(mount_fs):
    d = mount_fs("tmpfs", "size=4m")
    target = d / "ck.pt"
    pyfastensor.save({"w": torch.ones(4)}, target)
    subprocess.run(["mount", "-o", "remount,ro", str(d)], check=True)
    with pytest.raises(PermissionError) as e:
        pyfastensor.save({"w": torch.zeros(4)}, target)
    assert str(d) in str(e.value)
    assert torch.equal(pyfastensor.load(target)["w"], torch.ones(4))


def test_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError):
        pyfastensor.save({"w": torch.ones(1)}, tmp_path / "nope" / "ck.pt")


def old_and_new() -> tuple[dict, dict]:
    """Two checkpoints of different layouts (the new file's records lie elsewhere)."""
    old = {"w": torch.full((1_500_000,), 1.0), "b": torch.arange(3000, dtype=torch.float64),
           "small": [torch.full((10,), i) for i in range(20)]}
    return old, {"other": torch.arange(1000.0), "w": torch.full((700_000,), 2.0)}


def _replacing(monkeypatch, owner, name, path: Path, new: dict) -> list[int]:
    """Make ``owner.name`` save ``new`` over ``path`` (a rename, as every save of ours) on its
    first call, before doing its work: a save landing in the middle of a load."""
    real, calls = getattr(owner, name), []

    def replace_then(*args, **kwargs):
        if not calls:
            pyfastensor.save(new, path)
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(owner, name, replace_then)
    return calls


@pytest.mark.parametrize("verify", [True, False])
def test_load_reads_the_file_it_opened_while_a_save_replaces_it(tmp_path, monkeypatch, verify):
    from pyfastensor.checkpoint import _native

    path = tmp_path / "ck.pt"
    old, new = old_and_new()
    pyfastensor.save(old, path)
    evict(path)
    calls = _replacing(monkeypatch, _native.Archive, "read", path, new)
    got = pyfastensor.load(path, verify=verify, progress=False)
    assert calls, "the save ran inside the load"
    assert_same(got, old)  # not a CorruptFileError, not the new file's bytes at the old offsets
    monkeypatch.undo()
    assert_same(pyfastensor.load(path), new)


@pytest.mark.parametrize("verify", [True, False])
def test_mapped_load_maps_the_file_it_opened_while_a_save_replaces_it(tmp_path, monkeypatch, verify):
    load_mod = sys.modules["pyfastensor.checkpoint.load"]
    path = tmp_path / "ck.pt"
    old, new = old_and_new()
    pyfastensor.save(old, path)
    calls = _replacing(monkeypatch, load_mod, "_map", path, new)
    got = pyfastensor.load(path, mmap=True, verify=verify)
    assert calls
    assert_same(got, old)


def test_whole_file_read_loads_the_file_it_opened(tmp_path, monkeypatch, go_settings):
    """The load's one native call opens the file once, then plans and reads it whole from
    that descriptor: a save landing right after the call (as its memory is handed over)
    leaves the load with the file it opened."""
    from pyfastensor._buffers import PageArena

    go_settings(whole_min=0, whole_average_min=0)
    path = tmp_path / "ck.pt"
    old, new = old_and_new()
    pyfastensor.save(old, path)
    evict(path)
    calls = _replacing(monkeypatch, PageArena, "adopt", path, new)  # read whole, then replaced
    assert_same(pyfastensor.load(path, progress=False), old)
    assert calls, "the file was read whole"
    evict(path)
    assert_same(pyfastensor.load(path, progress=False), new)


# The full-disk and read-only cases above on any machine: the same saves, with the fault
# injected where the kernel's would land (the ``inject`` fixture, tests/conftest.py).


def test_full_disk_keeps_previous_checkpoint_injected(tmp_path, inject):
    """test_full_disk_keeps_previous_checkpoint without a mount: the new file's reservation
    fails with ENOSPC.

    That is where the full tmpfs of the original fails too: a save reserves the whole file
    (fallocate) before writing a byte (transfer/commit.go createTemp), so the first
    ENOSPC is the reservation's. The injection fails that step in the commit FS, which a
    save goes through whatever engine writes the records.
    """
    target = tmp_path / "ck.pt"
    old = {"w": torch.arange(25_000, dtype=torch.float32)}
    pyfastensor.save(old, target)
    inject(commit={"op": "reserve", "errno": errno.ENOSPC})
    with pytest.raises(NoSpaceError) as e:
        pyfastensor.save({"w": torch.zeros(1_000_000)}, target)
    assert str(target) in str(e.value)
    assert isinstance(e.value, OSError)
    assert e.value.errno == errno.ENOSPC
    assert torch.equal(pyfastensor.load(target)["w"], old["w"])
    assert temp_files(tmp_path) == []


def test_disk_filling_up_during_the_writes_keeps_previous_checkpoint_injected(tmp_path, inject):
    """A disk that fills up during the record writes, not at the reservation.

    No mounted test reaches this path: tmpfs refuses the reservation first (the test
    above). It is what a filesystem without fallocate gives (the reservation falls back to
    a sparse length, transfer/commit.go reserve): the large record's write, through an
    engine that writes half of it and then fails with ENOSPC, fails the save, the
    temporary file is removed (transfer.Writer.Abort), the previous checkpoint stays.
    """
    target = tmp_path / "ck.pt"
    old = {"w": torch.arange(25_000, dtype=torch.float32)}
    pyfastensor.save(old, target)
    inject(engine={"name": "full-posix", "base": "posix", "op": "write", "errno": errno.ENOSPC,
                   "partial": True})
    with pytest.raises(NoSpaceError) as e:
        pyfastensor.save({"w": torch.zeros(1_000_000)}, target, engine="full-posix")
    assert str(target) in str(e.value)
    assert "partial write" in str(e.value), "the failing write moved bytes first"
    assert torch.equal(pyfastensor.load(target)["w"], old["w"])
    assert temp_files(tmp_path) == []


def test_unwritable_directory_is_a_permission_error_injected(tmp_path, inject):
    """test_unwritable_directory_is_a_permission_error without a mount: creating the
    temporary file fails with EROFS, as it does in the tmpfs remounted read-only there.

    Only saves see the injected fault (it is in the commit FS, the steps around a save's
    writes); the directory itself stays writable to everything else. Loads read the old
    file in both cases.
    """
    target = tmp_path / "ck.pt"
    pyfastensor.save({"w": torch.ones(4)}, target)
    inject(commit={"op": "create", "errno": errno.EROFS})
    with pytest.raises(PermissionError) as e:
        pyfastensor.save({"w": torch.zeros(4)}, target)
    assert str(tmp_path) in str(e.value)
    assert torch.equal(pyfastensor.load(target)["w"], torch.ones(4))
    assert temp_files(tmp_path) == []


def test_an_io_error_is_an_oserror_with_its_errno_injected(tmp_path, inject):
    """A disk's I/O error during the writes (EIO): an ``OSError`` with that errno, naming the
    file, the record and the engine; the previous checkpoint stays, nothing is left behind."""
    target = tmp_path / "ck.pt"
    old = {"w": torch.arange(25_000, dtype=torch.float32)}
    pyfastensor.save(old, target)
    inject(engine={"name": "eio-posix", "base": "posix", "op": "write", "errno": errno.EIO})
    with pytest.raises(OSError) as e:
        pyfastensor.save({"w": torch.zeros(1_000_000)}, target, engine="eio-posix")
    assert e.value.errno == errno.EIO
    assert isinstance(e.value, pyfastensor.FastensorError)
    assert str(target) in str(e.value) and "record \"archive/data/0\": posix: write" in str(e.value)
    assert torch.equal(pyfastensor.load(target)["w"], old["w"])
    assert temp_files(tmp_path) == []


def test_a_save_over_a_directory_is_refused_before_writing(tmp_path):
    target = tmp_path / "ck.pt"
    target.mkdir()
    with pytest.raises(IsADirectoryError) as e:
        pyfastensor.save({"w": torch.zeros(1_000_000)}, target)
    assert e.value.errno == errno.EISDIR and isinstance(e.value, pyfastensor.SystemCallError)
    again = pickle.loads(pickle.dumps(e.value))  # as DCP gathers a rank's exception
    assert (type(again), again.errno, str(again)) == (type(e.value), errno.EISDIR, str(e.value))
    assert f"cannot write {target}" in str(e.value)
    assert target.is_dir() and temp_files(tmp_path) == []
