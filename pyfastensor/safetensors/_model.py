"""Whole models as safetensors files: :func:`save_model` and :func:`load_model`.

A model's state dict may hold one tensor under several names (tied
weights: ``lm_head.weight`` and ``embed.weight``); a safetensors file may
not. A save keeps one name of each such group, one whose tensor covers its
whole storage, and records the names it dropped in the metadata; a load
puts the file's tensors back and counts the dropped names as loaded.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable

import torch

from ._files import load_file, save_file


def shared_groups(state_dict: dict[str, torch.Tensor]) -> list[set[str]]:
    """The names of ``state_dict`` in groups whose tensors overlap in memory; names that share
    no memory are groups of one. Meta tensors and tensors without memory are left out."""
    by_storage: dict[tuple[torch.device, int, int], list[str]] = {}
    for name, t in state_dict.items():
        if t.device.type == "meta":
            continue
        storage = t.untyped_storage()
        if storage.data_ptr() == 0 or storage.nbytes() == 0:
            continue
        by_storage.setdefault((t.device, storage.data_ptr(), storage.nbytes()), []).append(name)
    groups: list[set[str]] = []
    for names in sorted(by_storage.values(), key=sorted):
        spans = sorted((_span(state_dict[n]), n) for n in names)
        end = None
        for (start, stop), name in spans:
            if end is None or start >= end:
                groups.append({name})
                end = stop
            else:
                groups[-1].add(name)
                end = max(end, stop)
    return groups


def _span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes ``t`` reaches: from its first element to the end of its last one."""
    if not t.numel():
        return t.data_ptr(), t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (last + 1) * t.element_size()


def _covers_storage(t: torch.Tensor) -> bool:
    storage = t.untyped_storage()
    return t.data_ptr() == storage.data_ptr() and t.numel() * t.element_size() == storage.nbytes()


def duplicate_names(state_dict: dict[str, torch.Tensor], *, preferred: Iterable[str] = (),
                    discard: Collection[str] = ()) -> dict[str, list[str]]:
    """For each group of names sharing memory, the name kept (a tensor covering the whole
    storage; among those, one of ``preferred``, else not of ``discard``, else the first by
    name) and the names dropped with it.

    Raises:
        RuntimeError: a group has no name whose tensor covers its whole storage (saving any one
            of them would lose the others' bytes).
    """
    preferred = set(preferred)
    dropped: dict[str, list[str]] = {}
    for group in shared_groups(state_dict):
        if len(group) < 2:
            continue
        whole = sorted(n for n in group if _covers_storage(state_dict[n]))
        if not whole:
            raise RuntimeError(
                f"the tensors {sorted(group)} share memory but none covers all of it: saving one would "
                "lose the others' bytes. Save clones of them, or pyfastensor.save the state dict (which "
                "keeps the sharing)")
        keep = ([n for n in whole if n in preferred] or [n for n in whole if n not in discard] or whole)[0]
        dropped[keep] = sorted(n for n in group if n != keep)
    return dropped


def save_model(model: torch.nn.Module, filename: str | os.PathLike[str], metadata: dict[str, str] | None = None,
               force_contiguous: bool = True) -> None:
    """Save a model's state dict as a safetensors file, like :func:`safetensors.torch.save_model`.

    Tensors shared under several names (tied weights) are saved once, under
    one of their names; the metadata maps each dropped name to the name kept
    (unless the caller's metadata has that key already).

    Args:
        model: the module to save.
        filename: the file to write.
        metadata: text-only metadata for the header. Default: none.
        force_contiguous: save non-contiguous tensors as contiguous copies. Default: ``True``.

    Raises:
        RuntimeError: tensors share memory but none of them covers all of it.
        ValueError: a tensor is not contiguous and ``force_contiguous`` is ``False``.

    Example::

        >>> import torch
        >>> from pyfastensor.safetensors import save_model, load_model
        >>> save_model(torch.nn.Linear(4, 2), "/tmp/lin.safetensors")
        >>> load_model(torch.nn.Linear(4, 2), "/tmp/lin.safetensors")
        ([], [])
    """
    state_dict = model.state_dict()
    for kept, names in duplicate_names(state_dict).items():
        for name in names:
            metadata = {} if metadata is None else metadata
            metadata.setdefault(name, kept)
            del state_dict[name]
    if force_contiguous:
        state_dict = {k: v.contiguous() for k, v in state_dict.items()}
    try:
        save_file(state_dict, filename, metadata=metadata)
    except ValueError as e:
        raise ValueError(f"{e} Or use save_model(..., force_contiguous=True).") from None


def load_model(model: torch.nn.Module, filename: str | os.PathLike[str], strict: bool = True,
               device: str | int | torch.device = "cpu", *, backend: str = "mmap") -> tuple[list[str], list[str]]:
    """Load a safetensors file into a model, like :func:`safetensors.torch.load_model`.

    Names the model shares memory under count as loaded when the file has
    one of them (as :func:`save_model` writes it).

    Args:
        model: the module to load into.
        filename: the file to read.
        strict: raise when keys are missing or unexpected. Default: ``True``.
        device: where to read the tensors to before they are copied into the model. Default: ``"cpu"``.
        backend: accepted as the safetensors package takes it (``"mmap"`` or ``"pread"``).

    Returns:
        ``(missing, unexpected)``: the model's names the file did not fill, and the file's
        names the model has no place for, sorted.

    Raises:
        RuntimeError: ``strict`` and some keys are missing or unexpected (names them all).
    """
    state_dict = load_file(filename, device=device, backend=backend)
    dropped = duplicate_names(model.state_dict(), preferred=state_dict.keys())
    missing_keys, unexpected = model.load_state_dict(state_dict, strict=False)
    missing = set(missing_keys)
    for names in dropped.values():
        for name in names:
            if name in missing:
                missing.discard(name)
            else:
                unexpected.append(name)
    if strict and (missing or unexpected):
        error = f"Error(s) in loading state_dict for {model.__class__.__name__}:"
        if missing:
            error += "\n    Missing key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(missing))
        if unexpected:
            error += "\n    Unexpected key(s) in state_dict: " + ", ".join(f'"{k}"' for k in sorted(unexpected))
        raise RuntimeError(error)
    return sorted(missing), sorted(unexpected)
