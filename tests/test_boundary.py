"""The native boundary: fork safety, panics, the info report."""

from __future__ import annotations

import json
import multiprocessing as mp
import subprocess
import sys
import textwrap

import native_build
import pytest

import pyfastensor
from pyfastensor import _lib


def _child_calls(q) -> None:
    try:
        pyfastensor.info(".")
        q.put(("ok", ""))
    except pyfastensor.ForkedProcessError as e:
        q.put(("forked", str(e)))
    except Exception as e:  # pragma: no cover - reported to the parent
        q.put(("other", repr(e)))


def _child_ignores(q) -> None:
    import numpy as np

    q.put(("ok", str(int(np.arange(10).sum()))))


def _child_empties_the_cache(q) -> None:
    try:
        q.put(("ok", str(pyfastensor.empty_cache() >= 0)))
    except Exception as e:  # reported to the parent
        q.put(("other", repr(e)))


def _run_forked(target) -> tuple[str, str]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=target, args=(q,))
    p.start()
    p.join(timeout=30)
    if p.is_alive():
        p.kill()
        pytest.fail("forked child hung")
    assert p.exitcode == 0
    return q.get(timeout=5)


def test_forked_child_gets_a_clear_error_not_a_hang():
    pyfastensor.info(".")  # load the library in the parent
    assert _lib.loaded()
    kind, msg = _run_forked(_child_calls)
    assert kind == "forked"
    assert "spawn" in msg and "forkserver" in msg
    # The parent still works afterwards.
    assert pyfastensor.info(".")["version"]


def test_empty_cache_in_a_forked_child_releases_what_python_holds():
    """A DataLoader worker's empty_cache(): the pages Python keeps, not the parent's Go runtime."""
    pyfastensor.info(".")
    assert _run_forked(_child_empties_the_cache) == ("ok", "True")


def test_forked_child_that_does_not_call_in_is_unaffected():
    pyfastensor.info(".")
    assert _run_forked(_child_ignores) == ("ok", "45")


def test_spawned_child_can_use_the_library():
    pyfastensor.info(".")
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_child_calls, args=(q,))
    p.start()
    p.join(timeout=120)
    assert q.get(timeout=5) == ("ok", "")


_LEFT_OPEN = """
import os, sys
import torch
import pyfastensor
from pyfastensor.checkpoint._skeleton import pickle_skeleton
from pyfastensor.checkpoint._staged import StagedSave
from pyfastensor.checkpoint.save import torch_archive

d = sys.argv[1]
model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.Linear(512, 256))
x = torch.randn(64, 256)
spilled = pyfastensor.offload(tier="ssd", spill_dir=d, min_size=0)
with spilled:
    loss = model(x).square().sum()  # saved tensors in the spill file, never unpacked
host = pyfastensor.offload(tier="host", min_size=0)
with host:
    model(x).square().sum().backward()
skel = pickle_skeleton({"w": torch.arange(1 << 14, dtype=torch.float32)})
archive, keep, _ = torch_archive(skel, staged=set(skel.storages))
staged = StagedSave(os.path.join(d, "ckpt.pt"), archive, [True] * len(archive.keys))  # never committed
print(sorted(os.listdir(d)))
"""


def test_objects_left_open_at_exit_are_closed_quietly(tmp_path):
    """Native objects alive when the interpreter exits are released while their modules are
    intact: no "Exception ignored" on stderr (Python 3.12 clears module globals before it
    collects what they held), and an uncommitted save removes its temporary file."""
    out = subprocess.run([sys.executable, "-c", _LEFT_OPEN, str(tmp_path)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "pyfastensor-tmp" in out.stdout  # the staged save had begun its temporary file
    assert "Exception ignored" not in out.stderr, out.stderr
    assert list(tmp_path.iterdir()) == []  # nothing of the save left behind, the target untouched


def test_import_does_not_load_the_library():
    code = "import pyfastensor, pyfastensor._lib as l; print(l.loaded())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_go_panic_becomes_an_exception_and_poisons_the_library():
    native_build.debug_exports()
    code = textwrap.dedent(
        """
        import pyfastensor
        from pyfastensor import _lib
        try:
            _lib.call("pft_debug_panic", None)
        except pyfastensor.InternalError as e:
            print("first:", str(e).splitlines()[0])
        try:
            pyfastensor.info(".")
        except pyfastensor.InternalError as e:
            print("then:", str(e).splitlines()[0])
        print("alive")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "first: pyfastensor: internal error (Go panic): pft_debug_panic called"
    assert lines[1].startswith("then: pyfastensor: the native library is unusable")
    assert lines[2] == "alive"


def test_a_panic_message_arrives_whole():
    """However long, a panic's message comes back whole, its Go stack after it."""
    native_build.debug_exports()
    code = textwrap.dedent(
        """
        import json
        import pyfastensor
        from pyfastensor import _lib
        try:
            _lib.call("pft_debug_panic", ("x" * 20000 + "|end of the value").encode())
        except pyfastensor.InternalError as e:
            print(json.dumps(str(e)))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    msg = json.loads(out.stdout)
    head, stack = msg.split("|end of the value\n", 1)
    assert head == "pyfastensor: internal error (Go panic): " + "x" * 20000
    assert stack.startswith("goroutine ")
    assert "pft_debug_panic" in stack  # the stack down to the export, not cut


def test_info_reports_what_matters(tmp_path):
    r = pyfastensor.info(tmp_path)
    assert r["version"] == pyfastensor.__version__
    assert r["go_version"].startswith("go")
    assert isinstance(r["cpu"]["features"], list)
    assert r["dir"]["dir"] == str(tmp_path)
    assert r["dir"]["fs_type"]
    if r["dir"]["o_direct"]:
        assert r["dir"]["dio_offset_align"] > 0
        assert r["dir"]["dio_align_source"] in ("statx", "probe")
    for name in ("posix", "direct", "mmap"):
        assert r["engines"][name]["available"]
    for e in r["engines"].values():
        assert e["available"] or e["reason"]


def test_info_cli_json(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "pyfastensor", "info", str(tmp_path), "--json"],
        capture_output=True, text=True, check=True, timeout=60,
    )
    assert json.loads(out.stdout)["dir"]["dir"] == str(tmp_path)
    text = subprocess.run(
        [sys.executable, "-m", "pyfastensor", "info", str(tmp_path)],
        capture_output=True, text=True, check=True, timeout=60,
    ).stdout
    assert "O_DIRECT" in text and "engines" in text
    gone = subprocess.run([sys.executable, "-m", "pyfastensor", "info", str(tmp_path / "gone")],
                          capture_output=True, text=True, timeout=60)
    assert gone.returncode == 1 and gone.stdout == ""
    assert gone.stderr.startswith("pyfastensor: error: [Errno 2] no such file or directory") and "gone" in gone.stderr


def test_import_does_not_import_torch():
    code = "import sys, pyfastensor; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize("name", ["offload", "safetensors", "dcp", "data", "plan", "lightning", "engines",
                                  "dictionary"])
def test_each_module_is_an_attribute_after_import_pyfastensor(name):
    """``import pyfastensor`` then ``pyfastensor.<module>``, as the docs write it: no import of its own."""
    if name == "lightning":
        pytest.importorskip("lightning", reason="pyfastensor.lightning needs Lightning (pip install lightning)")
    code = f"import pyfastensor; print(pyfastensor.{name}.__name__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"pyfastensor.{name}", out.stderr


def test_missing_arrays_are_refused_not_a_panic(tmp_path):
    """A staged save's storages without their sizes: an error naming what is missing, and the
    library still usable (a panic would leave it unusable for the process)."""
    code = textwrap.dedent(
        f"""
        import ctypes
        import pyfastensor
        from pyfastensor import _lib
        handle = _lib.u64()
        try:
            _lib.call("pft_ckpt_stage_begin", _lib.cstr({str(tmp_path / "s.pt")!r}), b"archive", b"x", 1, None,
                      b"1", 1, b"0", None, None, (ctypes.c_int * 1)(1), _lib.options(None), ctypes.byref(handle))
        except pyfastensor.InvalidArgumentError as e:
            print("refused:", e)
        pyfastensor.info(".")
        print("alive")
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("refused:") and "without their staged flags or sizes" in lines[0], lines
    assert lines[-1] == "alive"


def test_a_path_with_a_nul_byte_is_refused_not_cut(tmp_path):
    """C ends a string at its first NUL: ``ckpt.pt\\0.bak`` would save to ``ckpt.pt``. Refused,
    as Python's own ``open`` refuses it."""
    import torch

    target = str(tmp_path / "ckpt.pt") + "\0.bak"
    with pytest.raises(ValueError, match="embedded null byte"):
        pyfastensor.save({"w": torch.ones(2)}, target)
    assert list(tmp_path.iterdir()) == []
