"""pyfastensor.save of CUDA tensors through the pinned ring (checkpoint/_from_device.py), driven
on CPU by the fake CUDA backend.

``_from_device.on_device`` is patched to treat chosen CPU storages as CUDA ones; the fake
runs a side-stream copy only when its event is waited for (or a stream waits for it), so a
save that wrote a slot before its copy landed would write the slot's garbage (0xEE), and one
that refilled a slot before writing it would write the wrong storage's bytes.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from cuda_fakes import FakeCuda

import pyfastensor
from pyfastensor import _device
from pyfastensor.checkpoint import _from_device, _staged

save_module = importlib.import_module("pyfastensor.checkpoint.save")  # the package's save is the function

POOL = 1 << 20  # 4 slots of 256 KiB


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("PYFASTENSOR_PINNED_POOL", str(POOL))
    f = FakeCuda()

    def on_device(storage: torch.UntypedStorage) -> bool:
        return storage.nbytes() > 64 and not f.is_pinned(storage.data_ptr())  # tiny ones: CPU storages

    def no_host_copy(key: str, storage: torch.UntypedStorage, kind: str) -> Any:
        raise AssertionError(f"storage {key} was copied to the host whole")
    monkeypatch.setattr(_from_device, "on_device", on_device)
    monkeypatch.setattr(save_module, "_to_cpu", no_host_copy)
    with _device.using(f):
        yield f


def state() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    big = torch.randn(300, 700, generator=g)  # 840,000 bytes: pieces over several slots
    return {
        "big": big, "view": big[3:9, 100:], "tiny": torch.arange(4),
        "half": torch.randn(1000, generator=g).half(), "bf16": torch.randn(70_001, generator=g).bfloat16(),
        **{f"s{i}": torch.randn(i * 97 + 3, generator=g) for i in range(30)},  # packed in shared slots
        "empty": torch.empty(0), "slot": torch.randn(POOL // 16, generator=g),  # exactly a slot
    }


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of ``t``'s storage, as one uint8 tensor (compared in one call, not per byte)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def assert_loads_as(path: Path, want: dict[str, torch.Tensor]) -> None:
    got = torch.load(path)
    assert sorted(got) == sorted(want)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].stride() == v.stride(), k
        assert torch.equal(raw(got[k]), raw(v)), f"{k}: bytes differ"
    assert got["view"].untyped_storage().data_ptr() == got["big"].untyped_storage().data_ptr()


def test_save_from_cuda_round_trips_bit_for_bit_and_lays_out_as_a_cpu_save(
    tmp_path: Path, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import zipfile

    tensors = state()
    pyfastensor.save(tensors, tmp_path / "d.pt")
    assert_loads_as(tmp_path / "d.pt", tensors)
    assert pyfastensor.load(tmp_path / "d.pt")["big"].equal(tensors["big"]), "every CRC-32 checks"
    side = [n for s, n in fake.copies if s != "compute"]
    assert side and max(side) <= POOL // 4, "device-to-host copies of a slot at most, on a side stream"
    monkeypatch.setattr(_from_device, "on_device", lambda s: False)  # every storage in host memory
    pyfastensor.save(tensors, tmp_path / "c.pt")
    with zipfile.ZipFile(tmp_path / "d.pt") as a, zipfile.ZipFile(tmp_path / "c.pt") as b:
        def layout(z: zipfile.ZipFile) -> list[tuple[str, int, int, int]]:
            return [(i.filename, i.header_offset, i.file_size, i.CRC) for i in z.infolist()
                    if not i.filename.endswith("serialization_id")]
        assert layout(a) == layout(b), "the same records, offsets and CRC-32s as a save from host memory"


def test_the_ring_is_allocated_once_across_saves(tmp_path: Path, fake: FakeCuda) -> None:
    tensors = state()
    for _ in range(3):
        tensors["big"].add_(1)
        pyfastensor.save(tensors, tmp_path / "r.pt")
        assert_loads_as(tmp_path / "r.pt", tensors)
    assert fake.pinned_calls == [POOL], "one ring, of the pool's size"
    ring = _device.slab(fake, "save")
    assert ring.allocations == 1 and not ring.held


def test_copies_run_ahead_of_the_writes(tmp_path: Path, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch) -> None:
    # At each native write, the copies into the other half of the ring are already issued: the
    # disk never waits for a device-to-host copy to be issued, and the writes are batched.
    tensors = {f"w{i}": torch.full((POOL // 16,), float(i)) for i in range(12)}  # a slot each
    writes: list[tuple[int, int]] = []  # (bytes written by then, bytes whose copies were issued)
    written = [0]
    real = _staged.StagedSave.write_parts

    def spy(self: _staged.StagedSave, parts: Any) -> None:
        writes.append((written[0], sum(n for s, n in fake.copies if s != "compute")))
        real(self, parts)
        written[0] += sum(p[3] for p in parts)
    monkeypatch.setattr(_staged.StagedSave, "write_parts", spy)
    pyfastensor.save(tensors, tmp_path / "w.pt")
    assert_loads_as_plain(tmp_path / "w.pt", tensors)
    slot = POOL // 4
    assert len(writes) == 12 // 2, "two slots per native write"
    for k, (done, issued) in enumerate(writes[:-1]):
        assert issued >= done + 4 * slot, f"write {k}: the whole ring was filled before it"


def assert_loads_as_plain(path: Path, want: dict[str, torch.Tensor]) -> None:
    got = torch.load(path)
    assert sorted(got) == sorted(want) and all(torch.equal(got[k], v) for k, v in want.items())


def test_a_failed_write_leaves_the_old_file_and_frees_the_ring(
    tmp_path: Path, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch,
) -> None:
    tensors = state()
    pyfastensor.save({"old": torch.ones(3)}, tmp_path / "f.pt")
    calls = [0]
    real = _staged.StagedSave.write_parts

    def failing(self: _staged.StagedSave, parts: Any) -> None:
        calls[0] += 1
        if calls[0] == 2:
            raise OSError(28, "No space left on device (injected)")
        real(self, parts)
    with monkeypatch.context() as m:
        m.setattr(_staged.StagedSave, "write_parts", failing)
        with pytest.raises(OSError, match="injected"):
            pyfastensor.save(tensors, tmp_path / "f.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.pt"], "no temporary file left"
    assert torch.equal(torch.load(tmp_path / "f.pt")["old"], torch.ones(3)), "the old file is intact"
    assert not _device.slab(fake, "save").held
    pyfastensor.save(tensors, tmp_path / "f.pt")
    assert_loads_as(tmp_path / "f.pt", tensors)


def test_safetensors_save_from_cuda_goes_through_the_ring_and_is_the_file_of_a_cpu_save(
    tmp_path: Path, fake: FakeCuda, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import safetensors.torch as st

    tensors = {k: v for k, v in state().items() if k not in ("view",)}  # safetensors refuses shared memory
    tensors["big"] = tensors["big"].clone()
    with monkeypatch.context() as m:
        m.setattr(torch.Tensor, "cpu", lambda t: pytest.fail("a tensor was copied to the host whole"))
        pyfastensor.safetensors.save_file(tensors, tmp_path / "d.safetensors", metadata={"format": "pt"})
    with monkeypatch.context() as m:
        m.setattr(_from_device, "on_device", lambda s: False)  # the same tensors, saved from the host
        pyfastensor.safetensors.save_file(tensors, tmp_path / "h.safetensors", metadata={"format": "pt"})
    assert (tmp_path / "d.safetensors").read_bytes() == (tmp_path / "h.safetensors").read_bytes()
    got = st.load_file(tmp_path / "d.safetensors")
    for k, v in tensors.items():
        assert got[k].dtype == v.dtype and torch.equal(raw(got[k].contiguous()), raw(v.contiguous())), k
    side = [n for s, n in fake.copies if s != "compute"]
    assert side and max(side) <= POOL // 4, "device-to-host copies of a slot at most, on a side stream"
    assert fake.pinned_calls == [POOL], "the save ring, pinned once"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.safetensors", "h.safetensors"], "no temporary file"
