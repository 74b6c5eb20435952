"""The peers' own suites with pyfastensor routed in (tests/peers/run.py): the runner itself on a
suite of our making, and the real suites where their pinned files have been fetched."""

from __future__ import annotations

import importlib.util
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("peers_run", ROOT / "tests" / "peers" / "run.py")
peers = importlib.util.module_from_spec(_spec)
sys.modules["peers_run"] = peers
_spec.loader.exec_module(peers)


def test_the_runner_tells_a_stock_pass_that_fails_routed(tmp_path):
    (tmp_path / "test_peer.py").write_text(textwrap.dedent("""
        import torch
        from safetensors.torch import load_file

        def test_saves(tmp_path):
            torch.save({"a": torch.ones(2)}, tmp_path / "a.pt")
            assert torch.equal(torch.load(tmp_path / "a.pt")["a"], torch.ones(2))

        def test_knows_whose_save_it_is():
            assert torch.save.__module__ == "torch.serialization"   # true stock only

        def test_imported_name():
            assert load_file.__module__ == "safetensors.torch"      # true stock only

        def test_fails_everywhere():
            assert False
    """))
    suite = peers.Suite("demo", "a demo suite", tmp_path, ("test_peer.py",))
    stock, routed = peers.run(suite, False, 0), peers.run(suite, True, 0)
    assert stock == {"test_peer.py::test_saves": "passed", "test_peer.py::test_knows_whose_save_it_is": "passed",
                     "test_peer.py::test_imported_name": "passed", "test_peer.py::test_fails_everywhere": "failed"}
    assert routed["test_peer.py::test_saves"] == "passed"
    assert routed["test_peer.py::test_knows_whose_save_it_is"] == "failed"
    assert routed["test_peer.py::test_imported_name"] == "failed"
    ok, lines = peers.compare(suite, stock, routed)
    assert not ok
    assert lines[0].startswith("a demo suite: 4 tests, 3 pass stock, 1 of them pass routed (33.3%")
    assert "  fails routed: test_peer.py::test_imported_name: NOT DOCUMENTED" in lines


def test_every_documented_exception_is_in_the_docs():
    text = (ROOT / "docs" / "testing.md").read_text()
    for suite, tests in peers.DOCUMENTED.items():
        for test, reason in tests.items():
            assert test in text, f"{suite}: {test} is not listed in docs/testing.md"
            assert reason, test


@pytest.mark.parametrize("name", ["torch", "safetensors"])
def test_the_peers_suite_keeps_its_stock_passes_routed(name, tmp_path):
    suite = (peers.torch_suite if name == "torch" else peers.safetensors_suite)(peers.default_dir(), None, False)
    if isinstance(suite, str):
        pytest.skip(f"{name}'s test files are not fetched here ({suite}): python tests/peers/run.py --fetch")
    ok, lines = peers.compare(suite, peers.run(suite, False, 2), peers.run(suite, True, 2))
    assert ok, "\n".join(lines)
