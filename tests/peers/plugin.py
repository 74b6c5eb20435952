"""A pytest plugin for running a peer's test files (tests/peers/run.py): ``-p plugin``.

``--pft-route`` enters :func:`pyfastensor.route` before the test files are imported, so that their
``from safetensors.torch import load_file`` and ``torch.save`` are pyfastensor's (in every
pytest-xdist worker too); ``--pft-outcomes FILE`` writes each test's outcome (``passed``,
``failed``, ``skipped``) to FILE as JSON, from the process that reports (xdist's controller).
"""

from __future__ import annotations

import json

import pytest

_outcomes: dict[str, str] = {}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pyfastensor peers")
    group.addoption("--pft-route", action="store_true", help="run the tests with pyfastensor.route() in force")
    group.addoption("--pft-outcomes", default=None, help="write each test's outcome to this JSON file")


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("--pft-route"):
        import pyfastensor

        config.stash[_ROUTING] = pyfastensor.route()  # for the whole session


_ROUTING = pytest.StashKey[object]()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """A test fails if any of its phases fails; it is skipped if it was skipped and failed none."""
    if report.failed:
        _outcomes[report.nodeid] = "failed"
    elif report.skipped and _outcomes.get(report.nodeid) != "failed":
        _outcomes[report.nodeid] = "skipped"
    else:
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = session.config.getoption("--pft-outcomes")
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w") as f:
            json.dump(_outcomes, f, indent=1, sort_keys=True)
