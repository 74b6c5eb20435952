"""The C boundary's two sides stay in step: status codes and prototypes.

The Go side (gofastensor/*.go) defines the status codes and the exported
functions; cgo writes their prototypes into a header at every build, and
the build turns that header into the one table Python declares every
function from (pyfastensor/_abi.py, by pyfastensor/_cheader.py). Here the
table is checked against the header of a fresh build (where Go is), the
shipped library's exports against the table, and the conventions every
export keeps (status returned, the message through ``char **errOut`` last,
options as one JSON argument) against the table.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import native_build
import pytest

from pyfastensor import _abi, _cheader, _lib

ROOT = Path(__file__).resolve().parent.parent

# Exports with a shape of their own: no status, no message.
_SPECIAL = {"pft_free", "pft_handle_count"}
# The test-only exports (gofastensor/debug.go, -tags pftdebug).
_DEBUG = {"pft_debug_panic", "pft_debug_inject"}
# What a data-moving export once took one by one, now fields of its options argument.
_OPTION_FIELDS = {"engine", "threads", "taskSize", "workers", "durable", "verify", "queueDepth"}
# ... except where the name is data: the engine a measured transfer went through.
_DATA = {("pft_dict_observe", "engine")}
_REGENERATE = (
    "Regenerate it (pip install -e . does, or: go build -buildmode=c-shared -o pyfastensor/_native.so "
    "./gofastensor && python -m pyfastensor._cheader pyfastensor/_native.h pyfastensor/_abi.py) and commit it."
)


def go_statuses() -> dict[str, int]:
    text = (ROOT / "gofastensor" / "abi.go").read_text()
    block = re.search(r"const \(\n(.*?)\n\)", text[text.index("Status codes"):], re.S).group(1)
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^\s*(st\w+)\s*=\s*(\d+)", block, re.M)}


@pytest.fixture(scope="module")
def built_header() -> _cheader.Table:
    """The prototypes of a library built now from the Go source (skips without Go)."""
    missing = native_build.go_missing()
    if missing:
        pytest.skip(missing)
    return _cheader.parse(native_build.build().with_suffix(".h").read_text())


def test_status_codes_match():
    go = go_statuses()
    assert go["stOK"] == 0
    assert sorted(_lib._STATUS) == sorted(v for k, v in go.items() if k != "stOK"), (
        "gofastensor/abi.go status codes and pyfastensor/_lib.py _STATUS differ: "
        f"Go {sorted(go.items(), key=lambda kv: kv[1])}, Python {sorted(_lib._STATUS)}"
    )
    errno_max = int(re.search(r"const errnoMax = (\d+)", (ROOT / "gofastensor" / "abi.go").read_text()).group(1))
    assert (_lib._ERRNO_BASE, _lib._ERRNO_MAX) == (go["stErrno"], go["stErrno"] + errno_max), \
        "the statuses that carry an errno differ"


def test_the_table_is_the_header_of_a_fresh_build(built_header):
    assert len(built_header) > 30, "the header parser found too few exports: it is broken"
    missing = sorted(set(built_header) - set(_abi.PROTOTYPES))
    stale = sorted(set(_abi.PROTOTYPES) - set(built_header))
    changed = sorted(n for n in set(built_header) & set(_abi.PROTOTYPES) if built_header[n] != _abi.PROTOTYPES[n])
    assert not (missing or stale or changed), (
        f"pyfastensor/_abi.py is not the header of the Go source: exported but not in the table {missing}, "
        f"in the table but not exported {stale}, prototypes changed {changed}. {_REGENERATE}"
    )
    assert (ROOT / "pyfastensor" / "_abi.py").read_text() == _cheader.render(built_header), (
        f"pyfastensor/_abi.py is not as the build writes it. {_REGENERATE}"
    )


def test_the_debug_build_adds_only_the_test_only_exports():
    missing = native_build.go_missing()
    if missing:
        pytest.skip(missing)
    debug = _cheader.parse(native_build.build(("pftdebug",)).with_suffix(".h").read_text())
    assert set(debug) - set(_abi.PROTOTYPES) == _DEBUG
    assert {n: debug[n] for n in _abi.PROTOTYPES} == _abi.PROTOTYPES


def test_the_shipped_library_exports_exactly_the_table():
    """The package's own library (not a PYFASTENSOR_LIB override): every function of the
    table, nothing more (no test-only export)."""
    here = Path(_lib.__file__).resolve().parent
    lib = here / "_native.so"
    if not lib.is_file():
        pytest.skip(f"no library in {here} (the package is not built)")
    if shutil.which("nm") is None:
        pytest.skip("nm (binutils) is not on PATH")
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    exported = {line.split()[-1] for line in out.splitlines() if line.split() and line.split()[-1].startswith("pft_")}
    assert not exported & _DEBUG, f"{lib} ships test-only exports: {sorted(exported & _DEBUG)}"
    assert exported == set(_abi.PROTOTYPES), (
        f"{lib} and pyfastensor/_abi.py differ: exported, not in the table {sorted(exported - set(_abi.PROTOTYPES))}; "
        f"in the table, not exported {sorted(set(_abi.PROTOTYPES) - exported)} (a stale build?)"
    )


def test_every_export_returns_a_status_and_takes_its_message_last():
    for name, (ret, params) in _abi.PROTOTYPES.items():
        if name in _SPECIAL:
            continue
        assert ret == "int", f"{name} returns {ret}, not the int status"
        assert params and params[-1] == ("char**", "errOut"), f"{name}: the last parameter is not char** errOut"
        assert ("char*", "errbuf") not in params, name


def test_options_cross_as_one_json_argument():
    with_options = []
    for name, (_, params) in _abi.PROTOTYPES.items():
        names = [n for _, n in params]
        assert not _OPTION_FIELDS & {n for n in names if (name, n) not in _DATA}, (
            f"{name} takes {sorted(_OPTION_FIELDS & set(names))} one by one: options cross as one JSON "
            "argument (gofastensor/options.go)"
        )
        if "options" in names:
            with_options.append(name)
            i = names.index("options")
            assert params[i][0] == "char*", name
            # One order: the options after the data's own arguments, before the progress
            # counter and the results (pointers the call writes).
            after = [n for _, n in params[i + 1:]]
            assert set(after) <= {"progress", "handle", "out", "crcOut", "errOut"}, f"{name}: {after}"
    assert "pft_ckpt_save_torch" in with_options and "pft_store_open" in with_options and "pft_file_open" in with_options


def test_handles_cross_as_integers():
    """A handle is a uint64_t argument, never text inside a string (options carry the
    dictionaries' handle as a JSON integer)."""
    for name, (_, params) in _abi.PROTOTYPES.items():
        for t, n in params:
            if n in ("h", "handle") and t != "uint64_t*":
                assert t == "uint64_t", f"{name}: handle {n} is {t}"
    for path in (ROOT / "gofastensor").glob("*.go"):
        assert '"dict:' not in path.read_text(), f"{path.name} parses a handle out of a string"


def test_benchmarks_are_not_exported():
    # The dictionaries' hit-rate benchmark is a Go program (cmd/dicthitrate), not part of the library.
    assert "pft_dict_hitrate" not in _abi.PROTOTYPES
    assert not [p.name for p in (ROOT / "gofastensor").glob("*.go") if "transfer/dict/hitrate" in p.read_text()]


def test_every_function_is_declared_from_the_table():
    cdll = _lib.lib()
    for name, (ret, params) in _abi.PROTOTYPES.items():
        fn = getattr(cdll, name)
        assert len(fn.argtypes) == len(params), name
        assert fn.restype is _lib._CTYPES[ret], name


def test_the_header_parser():
    header = """
#include <stddef.h>
extern size_t _GoStringLen(_GoString_ s);
extern void pft_free(void* p);
extern int64_t pft_handle_count(void);
extern int pft_a(char* path, int64_t n, void** addrs, int64_t *sizes, char* options, char** out, char** errOut);
"""
    table = _cheader.parse(header)
    assert table == {
        "pft_free": ("void", (("void*", "p"),)),
        "pft_handle_count": ("int64_t", ()),
        "pft_a": ("int", (("char*", "path"), ("int64_t", "n"), ("void**", "addrs"), ("int64_t*", "sizes"),
                          ("char*", "options"), ("char**", "out"), ("char**", "errOut"))),
    }
    namespace: dict = {}
    exec(_cheader.render(table), namespace)
    assert namespace["PROTOTYPES"] == table
    with pytest.raises(ValueError, match="pft_b"):
        _cheader.parse("extern int pft_b(char*, char** errOut);\n")


def test_tuning_bounds_match():
    """The environment's tunings are refused in Python (naming the variable) where Go would refuse
    the option: the same bounds on both sides."""
    from pyfastensor import config

    text = (ROOT / "gofastensor" / "options.go").read_text()
    go = {m.group(1): eval(m.group(2)) for m in re.finditer(r"^\s*(max\w+|min\w+)\s*=\s*([0-9 <]+)$", text, re.M)}  # noqa: S307 - constants of our own source
    assert (go["maxThreads"], go["maxQueueDepth"], go["minTaskSize"]) == (
        config.MAX_THREADS, config.MAX_QUEUE_DEPTH, config.MIN_TASK_SIZE)
