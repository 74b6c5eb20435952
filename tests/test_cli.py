"""The command line works where torch does not import: ``--help``, ``info`` and every ``--help``.

Each command runs as ``python -m pyfastensor ...`` (and ``python -m benchmarks ...``,
the repository's benchmarks) in a subprocess whose
PYTHONPATH starts with a directory holding a ``torch`` package that raises
ImportError, so ``import torch`` fails there as it does on a machine without
torch (or with a broken one).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import benchmarks
import pyfastensor
from pyfastensor.cli import build_parser

SUBCOMMANDS = ("info", "demo", "bench", "ckpt", "data", "dict")
BENCHMARKS = ("checkpoint", "dcp", "offload", "plan", "data", "data-nodes", "dict", "trace", "gpu", "trainer")


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every subcommand path of ``parser``, depth first: ("bench",), ("bench", "io"), ..."""
    out: list[tuple[str, ...]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.append((*prefix, name))
                out += _subcommands(sub, (*prefix, name))
    return out


ALL = _subcommands(build_parser())
BENCH_ALL = _subcommands(benchmarks.build_parser())


@pytest.fixture(scope="module")
def no_torch_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    fake = tmp_path_factory.mktemp("no-torch")
    (fake / "torch").mkdir()
    (fake / "torch" / "__init__.py").write_text('raise ImportError("torch is hidden by tests/test_cli.py")\n')
    root = Path(__file__).resolve().parents[1]  # this checkout's pyfastensor, as in the other tests
    path = os.pathsep.join(p for p in (str(fake), str(root), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path)


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=120)


def test_torch_is_hidden(no_torch_env):
    out = _run(["-c", "import torch"], no_torch_env)
    assert out.returncode != 0
    assert "torch is hidden by tests/test_cli.py" in out.stderr


def test_help_lists_every_subcommand(no_torch_env):
    out = _run(["-m", "pyfastensor", "--help"], no_torch_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("usage: python -m pyfastensor")
    for name in SUBCOMMANDS:
        assert f"\n    {name} " in out.stdout, f"{name} missing from --help:\n{out.stdout}"
    assert out.stderr == ""


def test_no_command_is_a_usage_error(no_torch_env):
    out = _run(["-m", "pyfastensor"], no_torch_env)
    assert out.returncode == 2
    assert "usage: python -m pyfastensor" in out.stderr and "COMMAND" in out.stderr


def test_info_without_torch(no_torch_env, tmp_path):
    out = _run(["-m", "pyfastensor", "info", str(tmp_path)], no_torch_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"pyfastensor {pyfastensor.__version__} (go")
    assert "  torch     not installed\n" in out.stdout
    assert "    posix   available\n" in out.stdout


def test_info_json_without_torch(no_torch_env, tmp_path):
    out = _run(["-m", "pyfastensor", "info", "--json", str(tmp_path)], no_torch_env)
    assert out.returncode == 0, out.stderr
    r = json.loads(out.stdout)
    assert r["version"] == pyfastensor.__version__
    assert r["python"]["torch"] is None
    assert r["engines"]["posix"]["available"] is True


def test_every_subcommand_is_covered():
    names = {path[0] for path in ALL}
    assert names == set(SUBCOMMANDS)
    assert {("bench", "io"), ("ckpt", "ls"), ("ckpt", "verify"), ("data", "pack"), ("data", "verify")} <= set(ALL)
    # The installed package measures this machine only; the comparative benchmarks are the repository's.
    assert [p for p in ALL if p[0] == "bench"] == [("bench",), ("bench", "io")]
    assert {path[0] for path in BENCH_ALL} == set(BENCHMARKS)
    assert {("checkpoint",), ("offload",), ("dict",), ("plan",), ("data",), ("dcp",), ("data-nodes",),
            ("trace",), ("gpu",)} <= set(BENCH_ALL)


def test_bench_help_lists_only_io(no_torch_env):
    out = _run(["-m", "pyfastensor", "bench", "--help"], no_torch_env)
    assert out.returncode == 0, out.stderr
    assert "\n    io " in out.stdout
    for name in BENCHMARKS:
        assert f"\n    {name} " not in out.stdout, out.stdout


@pytest.mark.parametrize("path", ALL, ids=[" ".join(p) for p in ALL])
def test_subcommand_help_without_torch(no_torch_env, path):
    out = _run(["-m", "pyfastensor", *path, "--help"], no_torch_env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m pyfastensor {' '.join(path)} ")
    assert "-h, --help" in out.stdout
    assert out.stderr == ""


@pytest.mark.parametrize("path", BENCH_ALL, ids=[" ".join(p) for p in BENCH_ALL])
def test_benchmark_help_without_torch(no_torch_env, path):
    out = subprocess.run([sys.executable, "-m", "benchmarks", *path, "--help"], capture_output=True, text=True,
                         env=no_torch_env, timeout=120, cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith(f"usage: python -m benchmarks {' '.join(path)} ")
    assert "-h, --help" in out.stdout
    assert out.stderr == ""


def test_parser_imports_no_torch():
    # With torch installed too: building the parser (what --help does) must not import it.
    code = ("import sys, benchmarks as b, pyfastensor.cli as c; c.build_parser(); b.build_parser(); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_demo_without_torch_says_what_is_missing(no_torch_env, tmp_path):
    out = _run(["-m", "pyfastensor", "demo", "--quick", "--dir", str(tmp_path)], no_torch_env)
    assert out.returncode == 1
    assert "pyfastensor: error: `demo` needs a module that does not import here" in out.stderr
    assert "torch is hidden by tests/test_cli.py" in out.stderr
    assert "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []
