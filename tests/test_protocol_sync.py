"""The DataLoader workers' socket protocol: Python's constants (data/_client.py) are Go's (loader/local.go).

A worker speaks the protocol without the native library, so nothing at run
time ties its constants to the server's; this test does.
"""

from __future__ import annotations

import re
from pathlib import Path

from pyfastensor.data import _client

LOCAL_GO = Path(__file__).resolve().parents[1] / "loader" / "local.go"


def go_constants(source: str) -> dict[str, int]:
    """Every integer constant of ``source`` named ``Local...`` (single and grouped declarations)."""
    out = {}
    for m in re.finditer(r"^\s*(?:const\s+)?(Local\w+)\s*=\s*(\d+)\s*$", source, re.MULTILINE):
        out[m.group(1)] = int(m.group(2))
    return out


def test_go_constants_are_found():
    consts = go_constants("const LocalProtocol = 7\nconst (\n\tLocalHello = 1\n\t// c\n\tLocalGet  = 2\n)\n")
    assert consts == {"LocalProtocol": 7, "LocalHello": 1, "LocalGet": 2}


def test_worker_protocol_matches_the_server():
    go = go_constants(LOCAL_GO.read_text())
    python = {"LocalProtocol": _client.PROTOCOL, "LocalHello": _client.HELLO, "LocalGet": _client.GET,
              "LocalTake": _client.TAKE, "LocalReturn": _client.RETURN, "LocalRestore": _client.RESTORE,
              "LocalMetaFields": _client.META_FIELDS, "LocalGetInTurn": _client.GET_IN_TURN,
              "LocalGetState": _client.GET_STATE}
    assert {k: go.get(k) for k in python} == python
    ops = {k for k in go if k not in ("LocalProtocol", "LocalMetaFields", "LocalGetInTurn", "LocalGetState")}
    assert ops <= set(python), f"ops of loader/local.go that data/_client.py does not know: {ops - set(python)}"
