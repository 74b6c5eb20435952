"""Run the peers' own test suites stock and with pyfastensor routed in, and compare.

    python tests/peers/run.py --fetch                 # fetch the pinned test files, run both suites
    python tests/peers/run.py --torch-tests FILE      # torch's test_serialization.py from elsewhere

The suites are the peers' files at a pinned version, fetched into a cache
(``~/.cache/pyfastensor/peers``, ``--dir``), never copied into this
repository:

- **torch**: PyTorch's ``test/test_serialization.py`` at commit
  :data:`TORCH_COMMIT` (from GitHub; where GitHub is out of reach, give the
  file with ``--torch-tests``; a file whose sha256 differs is run and said so);
- **safetensors**: safetensors :data:`SAFETENSORS_VERSION`'s torch tests,
  from its source distribution on PyPI (``pip download``).

Each suite runs twice with pytest: stock, then with :func:`pyfastensor.route`
in force before its files are imported (tests/peers/plugin.py), so that
every ``torch.save``, ``torch.load``, ``safetensors.torch.*`` and
``safe_open`` they call is pyfastensor's. The table gives, per suite, the
tests that pass stock and how many of them pass routed; each one that
passes stock and fails routed is listed with the reason documented for it
(:data:`DOCUMENTED`, docs/testing.md) or as not documented.

Exit status: 0 when every suite that ran keeps at least 97% of its stock
passes routed and every loss is documented; 1 otherwise; 2 when no suite
could run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: PyTorch's test/test_serialization.py, pinned: its commit and the file's sha256.
TORCH_COMMIT = "dbccb5ae3bc2294e7f66583105619fd5a1647109"
TORCH_SHA256 = "f78e19a96c87bbc2b297f87682bdcb0ebd76483baa3ad3a36aafc2d40e0e0555"
TORCH_URL = f"https://raw.githubusercontent.com/pytorch/pytorch/{TORCH_COMMIT}/test/test_serialization.py"

#: safetensors' release whose tests run (its sdist carries them), and the sdist's sha256.
SAFETENSORS_VERSION = "0.8.0"
SAFETENSORS_SHA256 = "fabaf3e0f18a6618d9b36560682562157f77c2b71fcffc7b432be2baed9d753d"
#: safetensors' test files that test torch (the others test numpy, TensorFlow, Flax, MLX, Paddle).
SAFETENSORS_FILES = ("tests/test_pt_comparison.py", "tests/test_pt_model.py", "tests/test_simple.py",
                     "tests/test_pread_backend.py")

#: The share of a suite's stock passes that must pass routed.
TARGET = 0.97

#: Tests that pass stock and fail routed, by suite and test id, with the reason: what they check
#: that a drop-in cannot keep, or keeps differently on purpose. docs/testing.md lists them.
DOCUMENTED: dict[str, dict[str, str]] = {
    "torch": {
        "TestSerialization::test_filewriter_metadata_writing_filename_False":
            "overwrites a saved file's storage records in place and loads it: their bytes no longer match "
            "the CRC-32s the save computed, and pyfastensor refuses such a record (verify=False loads it)",
        "TestSerialization::test_filewriter_metadata_writing_filename_True":
            "the same, the file given by name",
        "TestSerialization::test_storage_alignment":
            "the exact layout of the file: torch aligns storage records to 64 bytes "
            "(torch.utils.serialization.config.save.storage_alignment), pyfastensor to 4 KiB, for O_DIRECT",
    },
    "safetensors": {},
}


@dataclass(frozen=True)
class Suite:
    """A peer's suite as fetched: pytest runs ``files`` from ``cwd``."""

    name: str
    title: str
    cwd: Path
    files: tuple[str, ...]
    note: str = ""


def default_dir() -> Path:
    """Where fetched files live unless ``--dir`` says: ``$XDG_CACHE_HOME/pyfastensor/peers``."""
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pyfastensor" / "peers"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def torch_suite(cache: Path, given: Path | None, fetch: bool) -> Suite | str:
    """torch's suite, from ``given``, the cache, or (``fetch``) GitHub; or why it cannot run."""
    where = cache / f"pytorch-{TORCH_COMMIT[:12]}" / "test"
    target = where / "test_serialization.py"
    note = ""
    if given is not None:
        where.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(given, target)
        digest = _sha256(target)
        if digest != TORCH_SHA256:
            note = f"given file's sha256 {digest[:12]}... is not the pinned one's {TORCH_SHA256[:12]}..."
    elif not target.exists():
        if not fetch:
            return f"not fetched (run with --fetch, or give --torch-tests FILE; it is {TORCH_URL})"
        try:
            with urllib.request.urlopen(TORCH_URL, timeout=60) as r:
                data = r.read()
        except OSError as e:
            return f"cannot fetch {TORCH_URL}: {e}; fetch it elsewhere and give --torch-tests FILE"
        if hashlib.sha256(data).hexdigest() != TORCH_SHA256:
            return f"{TORCH_URL} does not have the pinned sha256 {TORCH_SHA256}"
        where.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return Suite("torch", f"torch test_serialization.py @ {TORCH_COMMIT[:12]}", where,
                 ("test_serialization.py",), note)


def safetensors_suite(cache: Path, given: Path | None, fetch: bool) -> Suite | str:
    """safetensors' torch tests, from ``given`` (bindings/python of a source tree), the cache, or
    (``fetch``) its sdist on PyPI; or why they cannot run."""
    root = given or cache / f"safetensors-{SAFETENSORS_VERSION}" / "bindings" / "python"
    if given is None and not (root / SAFETENSORS_FILES[0]).exists():
        if not fetch:
            return "not fetched (run with --fetch, or give --safetensors-tests DIR, its bindings/python)"
        with tempfile.TemporaryDirectory() as d:
            got = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
                                  "-d", d, f"safetensors=={SAFETENSORS_VERSION}"], capture_output=True, text=True)
            sdists = list(Path(d).glob("safetensors-*.tar.gz"))
            if got.returncode != 0 or len(sdists) != 1:
                return f"cannot download safetensors {SAFETENSORS_VERSION}'s sdist: {got.stderr.strip()[-300:]}"
            if _sha256(sdists[0]) != SAFETENSORS_SHA256:
                return f"safetensors {SAFETENSORS_VERSION}'s sdist does not have the pinned sha256"
            with tarfile.open(sdists[0]) as tar:
                members = [m for m in tar.getmembers() if "/bindings/python/tests/" in m.name]
                tar.extractall(cache, members=members, filter="data")
    missing = [f for f in SAFETENSORS_FILES if not (root / f).exists()]
    if missing:
        return f"{root} lacks {', '.join(missing)}"
    (root / "tests" / "data").mkdir(exist_ok=True)  # the tests write their files there
    return Suite("safetensors", f"safetensors {SAFETENSORS_VERSION} torch tests", root, SAFETENSORS_FILES)


def run(suite: Suite, routed: bool, workers: int) -> dict[str, str]:
    """Each test's outcome, running ``suite`` stock or routed."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "outcomes.json"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "plugin",
               "--pft-outcomes", str(out), *(["-n", str(workers)] if workers else []),
               *(["--pft-route"] if routed else []), *suite.files]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])))
        done = subprocess.run(cmd, cwd=suite.cwd, env=env, capture_output=True, text=True)
        if not out.exists():
            raise RuntimeError(f"pytest ({'routed' if routed else 'stock'}) wrote no outcomes for {suite.name}:\n"
                               f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return json.loads(out.read_text())


def compare(suite: Suite, stock: dict[str, str], routed: dict[str, str]) -> tuple[bool, list[str]]:
    """Whether ``suite`` meets the target, and the lines that say so."""
    passed = {t for t, o in stock.items() if o == "passed"}
    kept = {t for t in passed if routed.get(t) == "passed"}
    lost = sorted(passed - kept)
    gained = sorted(t for t, o in routed.items() if o == "passed" and t not in passed)
    share = len(kept) / len(passed) if passed else 1.0
    documented = DOCUMENTED.get(suite.name, {})
    undocumented = [t for t in lost if t.split("::", 1)[-1] not in documented]
    ok = share >= TARGET and not undocumented
    lines = [f"{suite.title}: {len(stock)} tests, {len(passed)} pass stock, {len(kept)} of them pass routed "
             f"({share:.1%}; target {TARGET:.0%}): {'met' if ok else 'NOT MET'}"]
    if suite.note:
        lines.append(f"  note: {suite.note}")
    for t in lost:
        reason = documented.get(t.split("::", 1)[-1])
        lines.append(f"  fails routed: {t}: {reason or 'NOT DOCUMENTED'}")
    for t in gained:
        lines.append(f"  passes routed only: {t}")
    return ok, lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description="Run PyTorch's test_serialization.py and safetensors' torch tests stock and with "
                    "pyfastensor.route() in force, and print stock passes against routed ones.",
        epilog="The test files are the peers', at pinned versions, fetched into --dir; see docs/testing.md.")
    p.add_argument("--fetch", action="store_true", help="fetch the pinned test files that are not in --dir yet")
    p.add_argument("--dir", type=Path, default=default_dir(), help="where the fetched files live (default: %(default)s)")
    p.add_argument("--torch-tests", type=Path, help="PyTorch's test/test_serialization.py, fetched elsewhere")
    p.add_argument("--safetensors-tests", type=Path, help="safetensors' bindings/python folder (with tests/)")
    p.add_argument("--suite", choices=("torch", "safetensors", "all"), default="all", help="which suite to run")
    p.add_argument("--workers", type=int, default=2, help="pytest-xdist workers per run; 0: one process (default 2)")
    p.add_argument("--json", type=Path, help="also write every test's outcomes, stock and routed, here")
    a = p.parse_args(argv)
    a.dir.mkdir(parents=True, exist_ok=True)
    suites: list[Suite | str] = []
    names = ("torch", "safetensors") if a.suite == "all" else (a.suite,)
    if "torch" in names:
        suites.append(torch_suite(a.dir, a.torch_tests, a.fetch))
    if "safetensors" in names:
        suites.append(safetensors_suite(a.dir, a.safetensors_tests, a.fetch))
    ran, ok, report = 0, True, {}
    for name, suite in zip(names, suites, strict=True):
        if isinstance(suite, str):
            print(f"{name}: not run: {suite}")
            continue
        stock, routed = run(suite, False, a.workers), run(suite, True, a.workers)
        met, lines = compare(suite, stock, routed)
        print("\n".join(lines))
        ran += 1
        ok = ok and met
        report[name] = {"stock": stock, "routed": routed}
    if a.json:
        a.json.write_text(json.dumps(report, indent=1, sort_keys=True))
    if not ran:
        return 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
