"""Codecs for offloaded tensors, run as torch ops on the tensor's own device.

A codec turns a flat, contiguous tensor into a byte payload (a 1-D
``torch.uint8`` tensor) and back:

``fp16``
    FP32 to FP16 and back (FlashNeuron's half-precision offload). Lossy,
    opt-in; only float32 tensors are converted.
``sparse``
    FlashNeuron's bitmap-sparse format for ReLU outputs: a packed bitmask
    of the nonzero elements followed by their values. Lossless and
    bit-exact: the mask is taken over the elements' bit patterns, so only
    +0.0 is dropped, while -0.0 and NaN (any payload) survive unchanged.
    Worth it when more than about 1/8 of a 32-bit tensor's elements are
    zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


@dataclass(frozen=True)
class Encoded:
    """A payload and what decoding it needs."""

    codec: str  # "raw", "fp16", "sparse", "fp16+sparse"
    payload: torch.Tensor  # 1-D uint8, contiguous
    dtype: torch.dtype  # dtype of the flat tensor that was encoded
    numel: int
    nnz: int = 0  # sparse: number of stored values

    @property
    def nbytes(self) -> int:
        return self.payload.numel()


def _shifts(device: torch.device) -> torch.Tensor:
    return torch.arange(8, dtype=torch.uint8, device=device)


def _mask_bytes(n: int) -> int:
    # Bytes of the packed mask of n elements, padded to 8 so that the values
    # after it start aligned for any element size.
    return (n + 63) // 64 * 8


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a 1-D bool tensor into bytes, element i at bit ``i % 8`` of byte ``i // 8``.

    The result is padded with zero bytes to a multiple of 8 bytes.
    """
    pad = (-mask.numel()) % 64
    if pad:
        mask = torch.cat([mask, mask.new_zeros(pad)])
    bits = mask.view(-1, 8).to(torch.uint8) << _shifts(mask.device)
    return bits.sum(dim=1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``n`` bits as a bool tensor."""
    bits = (packed.unsqueeze(1) >> _shifts(packed.device)) & 1
    return bits.view(-1)[:n].bool()


def sparse_size(flat: torch.Tensor) -> int:
    """Bytes the sparse format would take for ``flat``."""
    nnz = int(torch.count_nonzero(flat.view(_INT_OF_SIZE[flat.element_size()])))
    return _mask_bytes(flat.numel()) + nnz * flat.element_size()


def encode_sparse(flat: torch.Tensor) -> Encoded:
    """Bitmap-sparse encoding of a flat contiguous tensor (bit-exact)."""
    bits = flat.view(_INT_OF_SIZE[flat.element_size()])
    mask = bits != 0  # on bit patterns: -0.0 and NaN are "nonzero"
    values = bits[mask]
    payload = torch.cat([pack_bits(mask), values.view(torch.uint8)])
    return Encoded("sparse", payload, flat.dtype, flat.numel(), values.numel())


def decode_sparse(enc: Encoded) -> torch.Tensor:
    """Inverse of :func:`encode_sparse`."""
    isize = torch.empty(0, dtype=enc.dtype).element_size()
    mask_bytes = _mask_bytes(enc.numel)
    mask = unpack_bits(enc.payload[:mask_bytes], enc.numel)
    values = enc.payload[mask_bytes:mask_bytes + enc.nnz * isize].view(_INT_OF_SIZE[isize])
    out = torch.zeros(enc.numel, dtype=_INT_OF_SIZE[isize], device=enc.payload.device)
    out[mask] = values
    return out.view(enc.dtype)


def encode_fp16(flat: torch.Tensor) -> Encoded:
    """FP32 to FP16 (lossy)."""
    return Encoded("fp16", flat.to(torch.float16).view(torch.uint8), flat.dtype, flat.numel())


def decode_fp16(enc: Encoded) -> torch.Tensor:
    """FP16 back to the original dtype."""
    return enc.payload.view(torch.float16).to(enc.dtype)


def encode(flat: torch.Tensor, codec: str) -> Encoded:
    """Encode a flat contiguous tensor with ``codec`` (``raw``, ``fp16``, ``sparse``, ``fp16+sparse``)."""
    if codec == "raw":
        return Encoded("raw", flat.view(torch.uint8), flat.dtype, flat.numel())
    if codec == "fp16":
        return encode_fp16(flat)
    if codec == "sparse":
        return encode_sparse(flat)
    if codec == "fp16+sparse":
        inner = encode_sparse(flat.to(torch.float16))
        return Encoded("fp16+sparse", inner.payload, flat.dtype, flat.numel(), inner.nnz)
    raise ValueError(f"codec {codec!r}: expected raw, fp16, sparse or fp16+sparse")


def decode(enc: Encoded) -> torch.Tensor:
    """Decode a payload back to a flat tensor of ``enc.dtype``."""
    if enc.codec == "raw":
        return enc.payload.view(enc.dtype)
    if enc.codec == "fp16":
        return decode_fp16(enc)
    if enc.codec == "sparse":
        return decode_sparse(enc)
    if enc.codec == "fp16+sparse":
        half = decode_sparse(Encoded("sparse", enc.payload, torch.float16, enc.numel, enc.nnz))
        return half.to(enc.dtype)
    raise ValueError(f"unknown codec {enc.codec!r}")


def with_payload(enc: Encoded, payload: torch.Tensor) -> Encoded:
    """The same encoding over another payload (one read back from the store)."""
    return Encoded(enc.codec, payload, enc.dtype, enc.numel, enc.nnz)
