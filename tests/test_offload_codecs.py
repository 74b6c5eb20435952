"""The offload codecs: bitmap-sparse is bit-exact, fp16 is close."""

from __future__ import annotations

import pytest
import torch

from pyfastensor.offload import codecs

INT = {torch.float32: torch.int32, torch.float64: torch.int64, torch.float16: torch.int16,
       torch.bfloat16: torch.int16}


def relu_like(n: int, dtype: torch.dtype) -> torch.Tensor:
    x = torch.relu(torch.randn(n, generator=torch.Generator().manual_seed(n))).to(dtype)
    if n > 4:
        x[1] = -0.0
        x[2] = float("nan")
        x[3] = -float("nan")
        x[4] = float("inf")
    return x


@pytest.mark.parametrize("n", [1, 7, 8, 63, 64, 65, 1000, 4099])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_sparse_round_trip_is_bit_exact(n, dtype):
    x = relu_like(n, dtype)
    enc = codecs.encode(x, "sparse")
    y = codecs.decode(enc)
    assert y.dtype == dtype
    assert torch.equal(x.view(INT[dtype]), y.view(INT[dtype])), "bit patterns differ"
    assert enc.nbytes == codecs.sparse_size(x)


def test_sparse_keeps_negative_zero_and_nan_payloads():
    bits = torch.tensor([0, 0x80000000 - (1 << 32), 0x7FC00001, 0, 0x3F800000], dtype=torch.int32)
    x = bits.view(torch.float32)
    y = codecs.decode(codecs.encode(x, "sparse"))
    assert torch.equal(y.view(torch.int32), bits)


def test_sparse_compresses_relu_outputs():
    x = torch.relu(torch.randn(1 << 16))
    assert codecs.encode(x, "sparse").nbytes < 0.6 * x.numel() * 4


def test_fp16_within_tolerance():
    x = torch.randn(10000)
    enc = codecs.encode(x, "fp16")
    assert enc.nbytes == x.numel() * 2
    torch.testing.assert_close(codecs.decode(enc), x, rtol=1e-3, atol=1e-4)
    both = codecs.decode(codecs.encode(torch.relu(x), "fp16+sparse"))
    torch.testing.assert_close(both, torch.relu(x), rtol=1e-3, atol=1e-4)


def test_pack_bits_round_trip():
    mask = torch.rand(1001, generator=torch.Generator().manual_seed(1)) > 0.5
    packed = codecs.pack_bits(mask)
    assert packed.numel() % 8 == 0
    assert torch.equal(codecs.unpack_bits(packed, 1001), mask)
