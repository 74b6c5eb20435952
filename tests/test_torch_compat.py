"""Each behaviour of torch's private interfaces that pyfastensor/_torch.py adapts to, one test each.

These run on whatever torch is installed; `make test-compat` runs them (with
the rest of the suite) on the floor torch and on a middle one. A torch that
changes one of the names fails the test named after it.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path

import pytest
import torch

from pyfastensor import _torch
from pyfastensor.errors import UnsupportedError

ROOT = Path(__file__).resolve().parents[1]


def test_floor_is_pyprojects():
    text = (ROOT / "pyproject.toml").read_text()  # no tomllib: the tests run on Python 3.10 too
    assert re.findall(r'"torch\s*([^"]*)"', text) == [f">={_torch.FLOOR[0]}.{_torch.FLOOR[1]}"]
    assert _torch.VERSION >= _torch.FLOOR, f"torch {torch.__version__} is below the floor"


def test_version_reads_local_and_patch_parts():
    assert _torch._parse("2.11.0+cu130") == (2, 11)
    assert _torch._parse("2.4.1") == (2, 4)
    assert _torch._parse("2.16.0.dev20261101+cpu") == (2, 16)
    assert _torch.VERSION == _torch._parse(torch.__version__)
    with pytest.raises(ValueError, match="cannot read torch's version from 'nightly'"):
        _torch._parse("nightly")


def test_require_names_the_version_needed_and_the_one_running():
    _torch.require("anything", _torch.FLOOR)
    with pytest.raises(UnsupportedError) as e:
        _torch.require("load(..., frob=True)", (99, 1))
    assert str(e.value) == f"load(..., frob=True) needs torch 99.1 or later; this is torch {torch.__version__}"


def _zip_of(obj: object) -> torch._C.PyTorchFileReader:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch._C.PyTorchFileReader(buf)


def test_serialization_load_takes_weights_only_from_2_14():
    takes = _torch._load_takes_weights_only()
    assert takes == (_torch.VERSION >= (2, 14))


@pytest.mark.parametrize("weights_only", [True, False])
def test_load_records_reads_torchs_zip_on_this_torch(weights_only):
    w = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    state = {"w": w, "t": w[1], "n": 3}
    module = _torch.weights_only_unpickler if weights_only else pickle
    got = _torch.load_records(_zip_of(state), "cpu", module, weights_only=weights_only,
                              encoding="utf-8")
    assert got["n"] == 3 and torch.equal(got["w"], w) and torch.equal(got["t"], w[1])
    assert got["t"].untyped_storage().data_ptr() == got["w"].untyped_storage().data_ptr()


def test_the_weights_only_unpickler_refuses_what_torch_refuses():
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    with pytest.raises(pickle.UnpicklingError, match="Unsupported global: GLOBAL (builtins.)?print"):
        _torch.load_records(_zip_of({"e": Evil()}), "cpu", _torch.weights_only_unpickler,
                            weights_only=True, encoding="utf-8")


def test_allowed_globals_has_the_rebuild_function_and_the_dtypes():
    allowed = _torch.allowed_globals()
    assert allowed["torch._utils._rebuild_tensor_v2"] is _torch.rebuild_tensor_v2
    assert allowed["torch.float32"] is torch.float32


def test_rebuild_tensor_v2_is_torchs_own_and_pickles_by_name():
    assert _torch.rebuild_tensor_v2 is torch._utils._rebuild_tensor_v2
    assert b"torch._utils\n_rebuild_tensor_v2" in pickle.dumps(_torch.rebuild_tensor_v2, protocol=2)


def test_default_load_mmap_follows_torchs_config_from_2_7():
    if _torch.VERSION < (2, 7):
        with pytest.raises(ImportError):
            import torch.utils.serialization  # noqa: F401
        assert _torch.default_load_mmap() is False
        return
    from torch.utils.serialization import config

    before = config.load.mmap
    try:
        for value in (True, False):
            config.load.mmap = value
            assert _torch.default_load_mmap() is value
    finally:
        config.load.mmap = before


def test_skip_data_follows_torchs_context_from_2_5():
    assert _torch.skip_data() is False
    if _torch.VERSION < (2, 5):
        assert not hasattr(torch.serialization, "skip_data")
        return
    with torch.serialization.skip_data():
        assert _torch.skip_data() is True
    assert _torch.skip_data() is False


def test_fake_mode_active_inside_fake_tensor_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode

    assert _torch.fake_mode_active() is False
    with FakeTensorMode():
        assert _torch.fake_mode_active() is True


def test_restore_location_maps_as_torch_load_does():
    s = torch.UntypedStorage(8)
    assert _torch.restore_location("cpu")(s, "cpu").device.type == "cpu"
    assert _torch.restore_location({"cuda:0": "cpu"})(s, "cuda:0").device.type == "cpu"
    calls = []
    _torch.restore_location(lambda st, loc: calls.append(loc) or st)(s, "cpu")
    assert calls == ["cpu"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message of a machine without CUDA")
def test_validate_device_gives_torchs_message_without_cuda():
    with pytest.raises(RuntimeError, match=r"torch.cuda.is_available\(\) is False"):
        _torch.validate_device("cuda:0", "cuda")


def test_new_dtypes_are_those_pickled_untyped():
    dtypes = _torch.new_dtypes()
    assert torch.float8_e4m3fn in dtypes and torch.bits8 in dtypes
    assert torch.float32 not in dtypes and torch.bfloat16 not in dtypes


def test_tensor_metadata_round_trips_the_conj_bit():
    t = torch.ones(2, dtype=torch.complex64)
    assert _torch.tensor_metadata(t) == {}
    meta = _torch.tensor_metadata(t.conj())
    assert meta == {"conj": True}
    u = torch.ones(2, dtype=torch.complex64)
    _torch.set_tensor_metadata(u, meta)
    assert u.is_conj()


def test_storage_slice_is_a_view_of_the_bytes():
    s = torch.arange(8, dtype=torch.uint8).untyped_storage()
    view = _torch.storage_slice(s, slice(2, 5))
    assert view.nbytes() == 3 and view.data_ptr() == s.data_ptr() + 2
    assert bytes(view) == bytes([2, 3, 4])


def test_storage_use_count_counts_tensors_on_the_storage():
    x = torch.zeros(4)
    s = x.untyped_storage()
    before = _torch.storage_use_count(s)
    y = x.view(2, 2)
    assert _torch.storage_use_count(s) == before + 1
    del y
    assert _torch.storage_use_count(s) == before
    assert _torch.storage_use_count(torch.UntypedStorage(4)) == 1


def test_storage_ref_expires_with_the_memory_and_keeps_finalizers_on_time():
    import weakref

    from torch.multiprocessing.reductions import StorageWeakRef

    x = torch.empty(1 << 16, dtype=torch.uint8)
    s = x.untyped_storage()
    ref, freed = _torch.StorageRef(s), []
    weakref.finalize(s, freed.append, True)
    del s  # the Python object is kept while the storage lives (a view uses it)
    view = x[8:].view(torch.int32)
    del x
    assert not ref.expired() and not freed
    del view
    assert ref.expired() and freed, "the storage was freed: its Python object and finalizers go too"
    # Why pyfastensor holds no StorageWeakRef: on 2.4 it keeps the object past the memory.
    y = torch.empty(1 << 16, dtype=torch.uint8)
    s, late = y.untyped_storage(), []
    torch_ref = StorageWeakRef(s)
    weakref.finalize(s, late.append, True)
    del s, y
    assert torch_ref.expired()
    if _torch.VERSION == (2, 4):
        assert not late, "torch 2.4: StorageWeakRef keeps the storage's Python object"
    elif _torch.VERSION >= (2, 11):
        assert late
    del torch_ref
    assert late


def test_new_shared_storage_is_in_shared_memory():
    s = _torch.new_shared_storage(4096)
    assert s.is_shared() and s.nbytes() == 4096


def test_current_autograd_node_is_the_node_in_backward():
    seen = []
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()
    x.register_hook(lambda g: seen.append(_torch.current_autograd_node()))
    assert _torch.current_autograd_node() is None
    y.backward()
    assert len(seen) == 1 and seen[0] is not None


def test_dispatch_mode_and_tree_flatten_see_ops_and_leaves():
    ops = []

    class Record(_torch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Record():
        torch.ones(2) + 1
    assert any("add" in op for op in ops)
    leaves, _ = _torch.tree_flatten({"a": [1, (2, 3)], "b": 4})
    assert leaves == [1, 2, 3, 4]


def test_dcp_passes_the_rank_from_2_9():
    import inspect

    from torch.distributed.checkpoint.storage import StorageReader, StorageWriter

    for cls, name in ((StorageWriter, "set_up_storage_writer"), (StorageReader, "set_up_storage_reader")):
        params = inspect.signature(getattr(cls, name)).parameters
        takes_more = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
        assert takes_more == _torch.DCP_PASSES_RANK == (_torch.VERSION >= (2, 9)), name


def test_dcp_hides_read_metadata_errors_from_2_9_to_2_11():
    import inspect

    from torch.distributed.checkpoint import state_dict_loader

    src = inspect.getsource(state_dict_loader)
    falls_back = "Falling back to rank local metadata" in src
    quotes = "global_metadata_exc" in src
    assert _torch.DCP_HIDES_METADATA_ERRORS == (falls_back and not quotes)


def test_queue_backward_callback_runs_at_the_end_of_backward_only_inside_it():
    order = []
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()
    x.register_hook(lambda g: _torch.queue_backward_callback(lambda: order.append("end")) or order.append("hook"))
    y.backward()
    assert order == ["hook", "end"]
    with pytest.raises(RuntimeError):
        _torch.queue_backward_callback(lambda: None)


def test_torch_save_and_load_are_torchs_own_functions():
    assert _torch.torch_save.__module__ == "torch.serialization" and _torch.torch_save.__name__ == "save"
    assert _torch.torch_load.__module__ == "torch.serialization" and _torch.torch_load.__name__ == "load"


def test_crc32_on_save_follows_torchs_option_from_2_6():
    if not hasattr(torch.serialization, "set_crc32_options"):
        assert _torch.crc32_on_save()
        return
    torch.serialization.set_crc32_options(False)
    try:
        assert not _torch.crc32_on_save()
    finally:
        torch.serialization.set_crc32_options(True)
    assert _torch.crc32_on_save()


def test_the_dataloader_worker_loop_is_torchs_and_looked_up_by_name():
    import torch.utils.data._utils.worker as worker

    assert _torch.dataloader_worker_loop is worker._worker_loop
    assert _torch.dataloader_worker_loop.__qualname__ == "_worker_loop"
