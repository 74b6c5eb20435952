"""pyfastensor.load to CUDA on a real GPU: bit-identical to torch.load, through each route."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import pyfastensor
from pyfastensor import _device
from pyfastensor.checkpoint import _cuda
from pyfastensor.errors import CorruptFileError

POOL = 1 << 20  # 4 slots of 256 KiB: records in pieces, slots reused


@pytest.fixture(params=["pinned", "cufile"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    if request.param == "cufile":
        cufile = pyfastensor.info(tmp_path)["engines"]["cufile"]
        if not cufile["available"]:
            pytest.skip(f"cuFile is not available here: {cufile['reason']}")
    monkeypatch.setenv("PYFASTENSOR_CUDA_LOAD", request.param)
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    with _device.using(_device.CudaBackend()):  # a fresh pinned slab, of POOL bytes
        yield request.param


def state(device: str = "cpu") -> dict[str, Any]:
    g = torch.Generator().manual_seed(11)
    base = torch.randn(700, 700, generator=g).to(device)  # ~2 MB: pieces
    rest = {
        "half": torch.randn(4097, generator=g).half(), "bf16": torch.randn(300_001, generator=g).bfloat16(),
        "ints": torch.randint(-(2**40), 2**40, (513,), generator=g), "bool": torch.rand(77, generator=g) > 0.5,
        "empty": torch.empty(0, 3), **{f"s{i}": torch.randn(i * 31 + 1, generator=g) for i in range(50)},
    }
    # Views made on the device, so they share base's storage there too.
    return {"big": base, "view": base[3:9, 100:], "t": base.t(), **{k: v.to(device) for k, v in rest.items()}}


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s storage as one uint8 tensor on its device: compared in one call."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def assert_bit_identical(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        g = got[k]
        assert (g.device, g.dtype, g.shape, g.stride(), g.storage_offset()) == (
            w.device, w.dtype, w.shape, w.stride(), w.storage_offset()), k
        assert torch.equal(raw(g), raw(w)), f"{k}: bytes differ"
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()


@pytest.mark.parametrize("writer", ["pyfastensor", "torch"])
@pytest.mark.parametrize("where", ["cuda", "cuda:0", "device", "dict"])
def test_load_to_cuda_is_bit_identical_to_torch_load(tmp_path: Path, route: str, writer: str, where: str) -> None:
    path = tmp_path / "s.pt"
    (pyfastensor.save if writer == "pyfastensor" else torch.save)(state(), path)
    ml: Any = {"device": torch.device("cuda", 0), "dict": {"cpu": "cuda:0"}}.get(where, where)
    got = pyfastensor.load(path, map_location=ml)
    assert_bit_identical(got, torch.load(path, map_location=ml))
    assert _cuda.last_route["route"] == route


def test_checkpoint_saved_from_cuda_mapped_by_dict(tmp_path: Path, route: str) -> None:
    path = tmp_path / "s.pt"
    torch.save(state("cuda"), path)
    ml = {"cuda:0": "cuda:0"}
    assert_bit_identical(pyfastensor.load(path, map_location=ml), torch.load(path, map_location=ml))
    got = pyfastensor.load(path)  # map_location=None: torch's own path
    assert got["big"].is_cuda


def test_corrupt_record_is_caught(tmp_path: Path, route: str) -> None:
    from pyfastensor.checkpoint._native import Archive

    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    with Archive(path) as a:
        off = next(e.offset for e in a.entries if e.name == "archive/data/0")
    with open(path, "r+b") as f:
        f.seek(off + 12345)
        b = f.read(1)
        f.seek(off + 12345)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(CorruptFileError, match='record "archive/data/0"'):
        pyfastensor.load(path, map_location="cuda")


def _scribble(tensors: list[torch.Tensor]) -> set[int]:
    """Overwrite the storages of ``tensors`` (kernels on the current stream); their addresses."""
    ptrs = set()
    for t in tensors:
        r = raw(t)
        if r.numel():
            r.fill_(0xA5)
            ptrs.add(r.data_ptr())
    return ptrs


def test_load_to_cuda_waits_for_kernels_queued_before_it(tmp_path: Path, route: str, gpu_sleep: Any) -> None:
    """Kernels queued on the compute stream before the load (behind a ~0.5 s sleep) write into
    memory freed right after, which the caching allocator hands to the load's storages: the
    load's copies (or cuFile's reads) must wait for them, else they overwrite the loaded bytes."""
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    want = torch.load(path, map_location="cuda")
    first = pyfastensor.load(path, map_location="cuda")  # the blocks the next load gets back
    torch.cuda.synchronize()
    gpu_sleep(0.5)
    freed = _scribble(list(first.values()))
    del first  # freed on the compute stream: reusable at once by allocations on it
    got = pyfastensor.load(path, map_location="cuda")
    assert freed & {raw(t).data_ptr() for t in got.values() if t.numel()}, (
        "the allocator handed none of the freed blocks to the load: nothing was checked")
    assert_bit_identical(got, want)
    assert _cuda.last_route["route"] == route


@pytest.mark.parametrize("engine", ["posix", "direct", "cufile"])
def test_engine_argument_picks_the_route(tmp_path: Path, route: str, engine: str) -> None:
    if engine == "cufile" and route != "cufile":
        pytest.skip("engine='cufile' is checked with the cufile route's fixture (cuFile available)")
    path = tmp_path / "s.pt"
    pyfastensor.save(state(), path)
    got = pyfastensor.load(path, map_location="cuda", engine=engine)
    assert_bit_identical(got, torch.load(path, map_location="cuda"))
    assert _cuda.last_route["route"] == ("cufile" if engine == "cufile" else "pinned")
