"""Byte transfers through each engine, as Python sees them."""

from __future__ import annotations

import ctypes
import errno
import os
import re

import numpy as np
import pytest
from conftest import aligned_bytes

import pyfastensor
from pyfastensor import _lib
from pyfastensor import engines as engines_mod
from pyfastensor.engines import ENGINES, EngineFile
from pyfastensor.errors import InvalidArgumentError

_ENGINE_INFO = pyfastensor.info(".")["engines"]
AVAILABLE = [n for n, e in _ENGINE_INFO.items() if e["available"]]
WRITERS = [n for n in AVAILABLE if n != "mmap"]


def served_by(f: EngineFile, engine: str) -> None:
    """Skip, with the reason, when ``engine`` hands the file to another engine here (tmpfs
    refuses O_DIRECT): the engine named would not be the one tested."""
    if f.engine != engine:
        assert f.fallback, f"{engine} served by {f.engine} without a reason"
        pytest.skip(f"{engine} falls back to {f.engine} here: {f.fallback}")


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("size", [1, 4095, 4096, 4097, (1 << 20) + 3])
@pytest.mark.parametrize("offset", [0, 1, 4096, 12289])
def test_round_trip_bytes(tmp_path, engine, size, offset):
    if not _ENGINE_INFO[engine]["available"]:
        pytest.skip(f"{engine} is unavailable here: {_ENGINE_INFO[engine]['reason']}")
    path = tmp_path / "f"
    canary = aligned_bytes(offset + size + 4096, seed=99)
    path.write_bytes(canary.tobytes())
    want = aligned_bytes(size, shift=3, seed=size + offset)
    writer = engine if engine != "mmap" else "posix"
    with EngineFile(path, "r+", engine=writer, task_size=64 << 10) as f:
        served_by(f, writer)
        assert f.write(want, offset) == size
        f.sync()
    got = aligned_bytes(size, shift=5, seed=1)
    with EngineFile(path, "r", engine=engine, task_size=64 << 10) as f:
        served_by(f, engine)
        assert f.read_into(got, offset) == size
    assert got.tobytes() == want.tobytes()
    disk = path.read_bytes()
    assert disk[:offset] == canary[:offset].tobytes()
    assert disk[offset + size :] == canary[offset + size :].tobytes()


def test_torch_tensor_round_trip(tmp_path):
    torch = pytest.importorskip("torch")
    t = torch.randn(1000, 37)
    with EngineFile(tmp_path / "t", "w", engine="direct") as f:
        f.write(t)
    back = torch.empty_like(t)
    with EngineFile(tmp_path / "t", "r", engine="direct") as f:
        f.read_into(back)
    assert torch.equal(t, back)


@pytest.mark.parametrize("engine", AVAILABLE)
def test_read_past_end_names_engine_path_offset(tmp_path, engine):
    path = tmp_path / "short"
    path.write_bytes(b"x" * 10000)
    buf = bytearray(4096)
    with EngineFile(path, "r", engine=engine) as f:
        with pytest.raises(pyfastensor.EndOfFileError) as ei:
            f.read_into(buf, 8000)
    msg = str(ei.value)
    assert f"{engine}: read {path} at 8000" in msg
    assert "end of file" in msg


def test_bad_arguments(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"abc")
    with EngineFile(path, "r") as f:
        with pytest.raises(pyfastensor.InvalidArgumentError, match="negative offset -1"):
            f.read_into(bytearray(2), -1)
        with pytest.raises(pyfastensor.InvalidArgumentError, match="overflows"):
            f.read_into(bytearray(16), (1 << 63) - 8)
        done = _lib.size_t()
        with pytest.raises(pyfastensor.InvalidArgumentError, match="null address with length 5"):
            _lib.call("pft_file_read", f._handle, None, 5, 0, ctypes.byref(done))
    with pytest.raises(ValueError, match="closed file"):
        f.read_into(bytearray(2))
    with pytest.raises(ValueError, match="read-only"):
        EngineFile(path, "r+").read_into(b"immutable")
    with pytest.raises(ValueError, match="engine 'floppy'"):
        EngineFile(path, engine="floppy")


def test_bad_handle_is_an_error_not_a_crash():
    with pytest.raises(pyfastensor.InvalidArgumentError, match="unknown or released handle"):
        _lib.call("pft_file_sync", 123456789)


def test_missing_file_is_file_not_found(tmp_path):
    missing = tmp_path / "nope" / "f"
    with pytest.raises(FileNotFoundError) as ei:
        EngineFile(missing, "r", engine="direct")
    assert ei.value.errno == errno.ENOENT
    assert str(missing) in str(ei.value)


@pytest.mark.parametrize("name", ["NoSpaceError", "NotFoundError", "PermissionDeniedError"])
def test_errno_errors_cross_processes_intact(name):
    # DCP gathers each rank's exception to every rank (pickled); a copy raised again is one too.
    import copy
    import pickle

    cls = getattr(pyfastensor.errors, name)
    e = cls("direct: write /ckpt/x at 4096: no space left on device")
    for back in (pickle.loads(pickle.dumps(e)), copy.copy(e)):
        assert type(back) is cls and back.errno == e.errno and str(back) == str(e)


def test_full_filesystem_raises_no_space(mount_fs):
    dir_ = mount_fs("tmpfs", "size=1m")
    data = np.zeros(4 << 20, dtype=np.uint8)
    for engine in WRITERS:
        path = dir_ / engine
        with EngineFile(path, "w", engine=engine) as f:
            with pytest.raises(OSError) as ei:
                f.write(data)
        assert isinstance(ei.value, pyfastensor.NoSpaceError)
        assert ei.value.errno == errno.ENOSPC
        assert str(path) in str(ei.value)
        path.unlink()


def assert_falls_back_to_posix(dir_) -> None:
    """info() says O_DIRECT does not work in ``dir_`` and why; the direct engine serves a file
    there through the page cache, says so, and keeps its bytes."""
    info = pyfastensor.info(dir_)
    assert info["dir"]["o_direct"] is False
    assert "O_DIRECT" in info["dir"]["o_direct_reason"]
    with EngineFile(dir_ / "f", "w", engine="direct") as f:
        assert f.engine == "posix"
        assert "does not support O_DIRECT" in f.fallback
        f.write(b"hello")
    assert (dir_ / "f").read_bytes() == b"hello"


def test_filesystem_without_o_direct_falls_back(mount_fs):
    dir_ = mount_fs("ramfs")  # ramfs refuses O_DIRECT
    assert_falls_back_to_posix(dir_)


def test_cufile_without_driver_is_unavailable_with_reason(tmp_path):
    info = pyfastensor.info(tmp_path)
    cufile = info["engines"]["cufile"]
    if cufile["available"]:
        pytest.skip("GPUDirect Storage works on this machine")
    assert cufile["reason"]
    with pytest.raises(pyfastensor.EngineUnavailableError) as ei:
        EngineFile(tmp_path / "f", "w", engine="cufile")
    assert str(ei.value) == cufile["reason"]


def test_no_handles_leak(tmp_path):
    before = _lib.handle_count()
    for engine in WRITERS:
        with EngineFile(tmp_path / engine, "w", engine=engine) as f:
            f.write(b"abc")
    assert _lib.handle_count() == before


def test_engine_list_is_complete():
    assert set(pyfastensor.info(".")["engines"]) == set(ENGINES)


def test_threads_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFASTENSOR_THREADS", "many")
    with pytest.raises(ValueError, match="PYFASTENSOR_THREADS='many'"):
        EngineFile(tmp_path / "f", "w")
    monkeypatch.setenv("PYFASTENSOR_THREADS", "3")
    monkeypatch.setenv("PYFASTENSOR_TASK_SIZE", "1M")
    with EngineFile(tmp_path / "f", "w") as f:
        assert f.write(os.urandom(5 << 20)) == 5 << 20
    for name, value, msg in (("PYFASTENSOR_THREADS", "100000", "expected an integer from 0 to 1024"),
                             ("PYFASTENSOR_TASK_SIZE", "1", "expected 0 (the default) or at least 4096 bytes"),
                             ("PYFASTENSOR_QUEUE_DEPTH", "-1", "expected an integer from 0 to 4096")):
        with monkeypatch.context() as m:
            m.setenv(name, value)
            with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}: {msg}")):
                EngineFile(tmp_path / "f", "w")


@pytest.mark.parametrize("option,value,msg", [
    ("threads", -1, "threads=-1: expected 0 (the default) to 1024"),
    ("task_size", 1, "task_size=1: expected 0 (the default) or at least 4096 bytes"),
    ("queue_depth", 10**6, "queue_depth=1000000: expected 0 (the default) to 4096"),
])
def test_tunings_out_of_bounds_name_the_option(tmp_path, option, value, msg):
    with pytest.raises(InvalidArgumentError, match=re.escape(msg)):
        EngineFile(tmp_path / "f", "w", **{option: value})
    assert not (tmp_path / "f").exists() or (tmp_path / "f").stat().st_size == 0


# The full-filesystem and no-O_DIRECT cases above on any machine, with the fault injected
# (the ``inject`` fixture, tests/conftest.py).


def test_full_filesystem_raises_no_space_injected(tmp_path, inject, monkeypatch):
    """test_full_filesystem_raises_no_space without a mount: each writer, wrapped so that
    its writes move half their bytes and fail with ENOSPC, as the 1 MiB tmpfs does with
    4 MiB. The wrapped engine is registered under a name of its own (``full-<engine>``),
    which EngineFile is let accept.

    What injection does not reach: ENOSPC arriving from the kernel inside an engine's own
    parallel pieces, and each engine classifying it (gds/mount_test.go has that, where
    mounting works). The wrapper fails the whole write and reports it as the engine that
    serves the file, through the same classification and the same C boundary.
    """
    data = np.zeros(4 << 20, dtype=np.uint8)
    for engine in WRITERS:
        name = f"full-{engine}"
        inject(engine={"name": name, "base": engine, "op": "write", "errno": errno.ENOSPC, "partial": True})
        monkeypatch.setattr(engines_mod, "ENGINES", (*ENGINES, name))
        path = tmp_path / engine
        with EngineFile(path, "w", engine=name) as f:
            with pytest.raises(OSError) as ei:
                f.write(data)
        assert isinstance(ei.value, pyfastensor.NoSpaceError)
        assert ei.value.errno == errno.ENOSPC
        assert str(path) in str(ei.value)
        assert "partial write" in str(ei.value)
        path.unlink()


def test_filesystem_without_o_direct_falls_back_injected(tmp_path, inject):
    """test_filesystem_without_o_direct_falls_back without a mount: every open with
    O_DIRECT fails with EINVAL, as on ramfs (and tmpfs before Linux 6.6).

    The directory is one this process has not probed yet: the probe is cached per
    directory, so the injection shows in new directories only. What injection does not
    reach: whatever else such a filesystem does differently (ramfs has no blocks at all);
    the probe, the fallback and its reason are the same code.
    """
    inject(direct_open={"errno": errno.EINVAL})
    dir_ = tmp_path / "no-o-direct"
    dir_.mkdir()
    assert_falls_back_to_posix(dir_)


def test_inject_names_what_it_cannot_install(tmp_path, inject, monkeypatch):
    """The test helper itself: a misspelt key, op or taken name is an error naming it, and a
    failed call leaves nothing installed (not even what an earlier call installed)."""
    with pytest.raises(pyfastensor.InvalidArgumentError, match='unknown field "comit"'):
        inject(comit={"op": "reserve"})
    with pytest.raises(pyfastensor.InvalidArgumentError, match='commit.op "fsync": expected one of create'):
        inject(commit={"op": "fsync"})
    with pytest.raises(pyfastensor.InvalidArgumentError, match='engine.op "pwrite"'):
        inject(engine={"name": "x", "op": "pwrite"})
    with pytest.raises(pyfastensor.InvalidArgumentError, match='engine "posix".*already registered'):
        inject(engine={"name": "posix", "op": "write"})
    monkeypatch.setattr(engines_mod, "ENGINES", (*ENGINES, "eio-posix"))
    inject(engine={"name": "eio-posix", "op": "write", "after": 1})
    with EngineFile(tmp_path / "f", "w", engine="eio-posix") as f:
        f.write(b"first")
        with pytest.raises(pyfastensor.FastensorError, match="injected: input/output error"):
            f.write(b"second")
    with pytest.raises(pyfastensor.InvalidArgumentError, match="direct_open.after -1"):
        inject(direct_open={"after": -1})
    with pytest.raises(pyfastensor.InvalidArgumentError, match="eio-posix"):
        EngineFile(tmp_path / "f", "w", engine="eio-posix")
