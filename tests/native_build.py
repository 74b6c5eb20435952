"""Native libraries the tests build for themselves from the Go source.

The shipped library has no test-only exports; tests that need them
(``pft_debug_inject``, ``pft_debug_panic``: ``gofastensor/debug.go``, built
with ``-tags pftdebug``) run against a library built here, and
``tests/test_abi_sync.py`` compares the prototype table with the header of a
fresh build. Each build goes to a directory under the system's temporary one
named after a hash of the Go source, the tags and the Go version, so a
second pytest run with the same source reuses it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Why the library the tests load lacks the test-only exports, once known (conftest.py's
# pytest_configure sets it).
why_no_debug: str | None = None


def go_missing() -> str | None:
    """Why no library can be built here, or None when Go (and a C compiler for cgo) are on PATH."""
    if shutil.which("go") is None:
        return "the Go toolchain is not on PATH (needed to build the library these tests use)"
    if shutil.which(os.environ.get("CC", "gcc")) is None and shutil.which("cc") is None:
        return "no C compiler on PATH (cgo needs one to build the library)"
    return None


def _source_hash(tags: tuple[str, ...]) -> str:
    h = hashlib.sha256()
    h.update(" ".join(tags).encode())
    h.update((ROOT / "pyfastensor" / "_version.py").read_bytes())
    h.update(subprocess.run(["go", "env", "GOVERSION"], capture_output=True, text=True).stdout.encode())
    files = [ROOT / "go.mod", ROOT / "go.sum"]
    go = [p for p in ROOT.rglob("*.go") if not p.name.endswith("_test.go") and "testdata" not in p.parts]
    cgo = [p for d in {p.parent for p in go} for ext in ("*.c", "*.h", "*.s", "*.S") for p in d.glob(ext)]
    files += sorted(p for p in go + cgo if p.name != "_native.h")  # what cgo compiles; not its own output
    for p in files:
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode())
            h.update(p.read_bytes())
    return h.hexdigest()[:16]


def build(tags: tuple[str, ...] = ()) -> Path:
    """Build ``./gofastensor`` with ``tags``; return the library (``.so``, cgo's ``.h`` beside it).

    Raises:
        RuntimeError: when go build fails (its output in the message).
    """
    out = Path(tempfile.gettempdir()) / f"pyfastensor-lib-{'-'.join(tags) or 'plain'}-{_source_hash(tags)}"
    lib = out / "_native.so"
    if lib.is_file() and lib.with_suffix(".h").is_file():
        return lib
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out))
    version = re.search(r'__version__ = "([^"]+)"', (ROOT / "pyfastensor" / "_version.py").read_text()).group(1)
    cmd = ["go", "build", "-buildmode=c-shared", "-trimpath", *([f"-tags={','.join(tags)}"] if tags else []),
           "-ldflags", f"-X main.version={version}", "-o", str(tmp / "_native.so"), "./gofastensor"]
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, CGO_ENABLED="1"))
    if r.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{r.stdout}{r.stderr}")
    # The header first: a library found is one whose header is there too.
    os.replace(tmp / "_native.h", lib.with_suffix(".h"))
    os.replace(tmp / "_native.so", lib)
    shutil.rmtree(tmp, ignore_errors=True)
    return lib


def debug_exports() -> None:
    """Skip the calling test unless the library loaded has the test-only exports."""
    import pytest

    from pyfastensor import _lib

    if not hasattr(_lib.lib(), "pft_debug_inject"):
        pytest.skip("needs the test-only exports (go build -tags pftdebug): "
                    f"{why_no_debug or 'PYFASTENSOR_LIB names a library without them'}")
