"""Shared fixtures for the Python tests."""

from __future__ import annotations

import json
import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import native_build
import pytest
from cuda_fakes import build_fake_cufile


def _mount(fstype: str, options: str, where: Path) -> None:
    subprocess.run(
        ["mount", "-t", fstype, "-o", options, fstype, str(where)],
        check=True, capture_output=True, text=True,
    )


@pytest.fixture
def mount_fs(tmp_path: Path) -> Iterator:
    """Mount a fresh filesystem for a test: ``mount_fs("tmpfs", "size=1m")``.

    Skips the test (with the reason) where this process may not mount.
    """
    mounted: list[Path] = []

    def mount(fstype: str, options: str = "") -> Path:
        where = tmp_path / f"mnt-{fstype}-{uuid.uuid4().hex[:6]}"
        where.mkdir()
        try:
            _mount(fstype, options or "defaults", where)
        except (subprocess.CalledProcessError, FileNotFoundError) as e:
            msg = getattr(e, "stderr", "") or str(e)
            pytest.skip(f"cannot mount {fstype} here (needs root and mount rights): {msg.strip()}")
        mounted.append(where)
        return where

    yield mount
    for where in mounted:
        subprocess.run(["umount", "-l", str(where)], check=False, capture_output=True)


def pytest_configure(config: pytest.Config) -> None:
    """Run the tests against the library built with the test-only exports
    (``go build -tags pftdebug``: gofastensor/debug.go), which the shipped one lacks.

    Built once per Go source (tests/native_build.py caches it) before the tests
    are collected (collection already calls the library: which engines work
    here) and named by ``PYFASTENSOR_LIB``, so that subprocesses the tests
    start load it too; its cgo header beside it declares the extra exports
    (``_lib._prototypes``). A ``PYFASTENSOR_LIB`` set
    before the tests is kept. Without Go the tests run against the package's
    library and those needing the exports skip, with the reason.
    """
    from pyfastensor import _lib

    if os.environ.get("PYFASTENSOR_LIB"):
        return
    if _lib.loaded():
        native_build.why_no_debug = "the native library was loaded before the test session could choose it"
        return
    native_build.why_no_debug = native_build.go_missing()
    if native_build.why_no_debug is None:
        os.environ["PYFASTENSOR_LIB"] = str(native_build.build(("pftdebug",)))


@pytest.fixture
def inject() -> Iterator:
    """Inject faults into the Go core for one test, on any machine (no mount needed)::

        inject(commit={"op": "reserve", "errno": errno.ENOSPC})  # saves find the disk full
        inject(commit={"op": "create", "errno": errno.EROFS})    # ... the directory read-only
        inject(direct_open={"errno": errno.EINVAL})              # no O_DIRECT (unprobed dirs)
        inject(engine={"name": "full-posix", "op": "write", "errno": errno.ENOSPC, "after": 2})

    Goes through the test-only native call ``pft_debug_inject``, whose Go doc comment
    (gofastensor/debug.go) is the spec; skips where the library lacks it (see
    :func:`pytest_configure`). Each call replaces what the previous one installed;
    everything is removed when the test ends, whether it passed or not.
    """
    from pyfastensor import _lib

    native_build.debug_exports()
    used = False

    def install(**spec: object) -> None:
        nonlocal used
        used = True
        _lib.call("pft_debug_inject", json.dumps(spec).encode())

    yield install
    if used:
        _lib.call("pft_debug_inject", b"{}")


def aligned_bytes(n: int, *, shift: int = 0, seed: int = 0):  # noqa: ANN201
    """``n`` random bytes as a numpy array whose address is ``shift`` past 4 KiB."""
    import numpy as np

    raw = np.empty(n + 8192, dtype=np.uint8)
    start = (-raw.ctypes.data) % 4096 + shift
    out = raw[start : start + n]
    out[:] = np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)
    return out


@pytest.fixture
def no_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("PYFASTENSOR_") and k != "PYFASTENSOR_LIB":
            monkeypatch.delenv(k)


@pytest.fixture(autouse=True, scope="session")
def _private_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Dictionaries the tests learn go to a temporary cache, not the user's."""
    if "PYFASTENSOR_CACHE_DIR" not in os.environ:
        os.environ["PYFASTENSOR_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))


@pytest.fixture
def go_settings() -> Iterator:
    """Override the Go core's overridable thresholds for a test: ``go_settings(whole_min=0)``;
    the previous values come back after it."""
    from pyfastensor import _lib

    saved: dict[str, int] = {}

    def override(**values: int) -> dict:
        for k in values:
            saved.setdefault(k, _lib.settings()[k])
        return _lib.settings(**values)

    yield override
    if saved:
        _lib.settings(**saved)


@pytest.fixture(scope="module")
def source(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[bytes, tuple[str, int]]]:
    """A small class-sorted ImageFolder (``data_helpers.make_folder``), one per test module:
    its root, and each file's bytes -> (path relative to the root, label)."""
    from data_helpers import make_folder

    root = tmp_path_factory.mktemp("src")
    return root, make_folder(root)


@pytest.fixture(scope="module")
def packed(source: tuple[Path, dict[bytes, tuple[str, int]]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``source`` packed in chunks of ``data_helpers.CHUNK`` samples (seed 7), one per test module."""
    from data_helpers import CHUNK

    from pyfastensor.data import pack

    out = tmp_path_factory.mktemp("pack") / "p"
    pack(source[0], out, chunk_size=CHUNK, seed=7, progress=False)
    return out


@pytest.fixture(scope="module")
def fake_cufile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake libcufile (gds/testdata/fakecufile), built once per test module."""
    lib = build_fake_cufile(tmp_path_factory.mktemp("fakecufile"))
    if lib is None:
        pytest.skip("no C compiler to build the fake libcufile")
    return lib
