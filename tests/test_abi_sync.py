"""The C boundary's two sides stay in step: status codes and prototypes.

The Go side (gofastensor/*.go) defines the status codes and the exported
functions; the Python side (pyfastensor/_lib.py and each area's
``_lib.register``) maps the codes to exceptions and declares each
function's argument types for ctypes. A change on one side alone fails
here, before it can corrupt a call at run time.
"""

from __future__ import annotations

import ctypes
import importlib
import re
from pathlib import Path

from pyfastensor import _lib

ROOT = Path(__file__).resolve().parent.parent
GO_FILES = sorted((ROOT / "gofastensor").glob("*.go"))

# Every module that declares native functions (``_lib.register``), imported
# so that their prototypes are in ``_lib._PROTOTYPES``.
_DECLARING = sorted(
    ".".join(p.relative_to(ROOT).with_suffix("").parts)
    for p in (ROOT / "pyfastensor").rglob("*.py")
    if "_lib.register(" in p.read_text()
)

# Go parameter types as ctypes sees them.
_CTYPES = {
    "*C.char": ctypes.c_char_p,
    "C.int": ctypes.c_int,
    "C.double": ctypes.c_double,
    "C.int64_t": ctypes.c_int64,
    "C.uint64_t": ctypes.c_uint64,
    "C.size_t": ctypes.c_size_t,
    "unsafe.Pointer": ctypes.c_void_p,
    "**C.char": ctypes.POINTER(ctypes.c_void_p),
    "*unsafe.Pointer": ctypes.POINTER(ctypes.c_void_p),
    "*C.int": ctypes.POINTER(ctypes.c_int),
    "*C.double": ctypes.POINTER(ctypes.c_double),
    "*C.int64_t": ctypes.POINTER(ctypes.c_int64),
    "*C.uint64_t": ctypes.POINTER(ctypes.c_uint64),
    "*C.size_t": ctypes.POINTER(ctypes.c_size_t),
}

# Exports with a shape of their own, declared by _lib._declare itself.
_SPECIAL = {"pft_free", "pft_handle_count"}


def go_statuses() -> dict[str, int]:
    text = (ROOT / "gofastensor" / "abi.go").read_text()
    block = re.search(r"const \(\n(.*?)\n\)", text[text.index("Status codes"):], re.S).group(1)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(st\w+)\s*=\s*(\d+)", block, re.M)}


def go_exports() -> dict[str, list[str]]:
    """name -> the Go types of its parameters, in order, from every ``//export``."""
    out: dict[str, list[str]] = {}
    for path in GO_FILES:
        text = path.read_text()
        for m in re.finditer(r"//export (\w+)\nfunc (\w+)\((.*?)\)\s*(C\.\w+)?\s*\{", text, re.S):
            assert m.group(1) == m.group(2), f"{path.name}: //export {m.group(1)} above func {m.group(2)}"
            types: list[str] = []
            pending = 0
            for param in (p.strip() for p in m.group(3).replace("\n", " ").split(",") if p.strip()):
                parts = param.split()
                if len(parts) == 1:  # "a, b T": a takes b's type
                    pending += 1
                    continue
                types += [parts[-1]] * (pending + 1)
                pending = 0
            out[m.group(1)] = types
    return out


def python_prototypes() -> dict[str, list]:
    for name in _DECLARING:
        importlib.import_module(name)
    return dict(_lib._PROTOTYPES)


def test_status_codes_match():
    go = go_statuses()
    assert go["stOK"] == 0
    assert sorted(_lib._STATUS) == sorted(v for k, v in go.items() if k != "stOK"), (
        "gofastensor/abi.go status codes and pyfastensor/_lib.py _STATUS differ: "
        f"Go {sorted(go.items(), key=lambda kv: kv[1])}, Python {sorted(_lib._STATUS)}"
    )


def test_every_export_has_its_prototype_and_every_prototype_an_export():
    go = go_exports()
    py = python_prototypes()
    assert len(go) > 30, "the parser found too few exports: it is broken"
    assert set(go) - _SPECIAL == set(py), (
        f"exported in Go, not declared in Python: {sorted(set(go) - _SPECIAL - set(py))}; "
        f"declared in Python, not exported: {sorted(set(py) - set(go))}"
    )


def test_benchmarks_are_not_exported():
    # The dictionaries' hit-rate benchmark is a Go program (cmd/dicthitrate), not part of the library.
    assert "pft_dict_hitrate" not in go_exports()
    assert "pft_dict_hitrate" not in python_prototypes()
    assert not [p.name for p in GO_FILES if "transfer/dict/hitrate" in p.read_text()]


def test_prototypes_have_the_go_argument_types():
    go = go_exports()
    for name, argtypes in python_prototypes().items():
        gotypes = go[name]
        assert gotypes[-2:] == ["*C.char", "C.size_t"], f"{name}: every export ends with (errbuf, errlen)"
        want = [_CTYPES[t] for t in gotypes[:-2]]
        assert len(argtypes) == len(want), (
            f"{name}: Go takes {len(want)} arguments before (errbuf, errlen) ({gotypes[:-2]}), "
            f"Python declares {len(argtypes)}"
        )
        for i, (have, need) in enumerate(zip(argtypes, want, strict=True)):
            assert have == need or ctypes.sizeof(have) == ctypes.sizeof(need) and (
                issubclass(have, ctypes._Pointer) == issubclass(need, ctypes._Pointer)
                and _kind(have) == _kind(need)
            ), f"{name} argument {i}: Go {gotypes[i]} is {need.__name__}, Python declares {have.__name__}"


def _kind(t: type) -> str:
    """Integer, float, pointer or string: what must agree beside the size."""
    if issubclass(t, ctypes._Pointer) or t in (ctypes.c_void_p,):
        return "pointer"
    if t is ctypes.c_char_p:
        return "string"
    if t in (ctypes.c_double, ctypes.c_float):
        return "float"
    return "int"


def test_the_parser_sees_a_change_on_one_side(monkeypatch):
    """A prototype with one argument too many is caught (the check can fail)."""
    py = python_prototypes()
    name = "pft_ckpt_close"
    monkeypatch.setitem(_lib._PROTOTYPES, name, [*py[name], ctypes.c_int])
    try:
        test_prototypes_have_the_go_argument_types()
    except AssertionError as e:
        assert name in str(e)
    else:
        raise AssertionError("an extra argument went unnoticed")
