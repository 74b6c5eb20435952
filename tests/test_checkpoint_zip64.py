"""Zip64: stock torch reads our files past 65535 records and past 4 GiB."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import pyfastensor


def test_more_than_65535_records(tmp_path):
    obj = {f"t{i}": torch.tensor([i], dtype=torch.int32) for i in range(66_000)}
    pyfastensor.save(obj, tmp_path / "many.pt", durable=False)
    # weights_only=False: the restricted unpickler takes ~5 s for 66,000 tensors, in torch too.
    for got in (torch.load(tmp_path / "many.pt", weights_only=False),
                pyfastensor.load(tmp_path / "many.pt", weights_only=False)):
        assert len(got) == 66_000
        assert got["t65999"].item() == 65_999 and got["t0"].item() == 0


def test_record_over_4gib(tmp_path):
    if shutil.disk_usage(tmp_path).free < 12 << 30:
        pytest.skip("needs 12 GiB of free disk")
    if os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES") < 8 << 30:
        pytest.skip("needs 8 GiB of free memory")
    path = tmp_path / "big.pt"
    try:
        big = torch.zeros((4 << 30) + 4096, dtype=torch.uint8)  # zero pages until touched
        big[-3:] = torch.tensor([1, 2, 3], dtype=torch.uint8)
        obj = {"big": big, "after": torch.arange(10)}
        pyfastensor.save(obj, path, durable=False)
        del big
        got = torch.load(path, mmap=True)  # stock torch, zip64 offsets and sizes
        assert torch.equal(got["after"], torch.arange(10))
        assert got["big"].shape == obj["big"].shape and got["big"][-3:].tolist() == [1, 2, 3]
        del got
        with pyfastensor.open(path) as ck:
            assert torch.equal(ck["after"], torch.arange(10))
    finally:  # pytest keeps the last runs' temporary directories: 4 GiB each, without this
        path.unlink(missing_ok=True)
