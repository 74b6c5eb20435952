"""The options of :class:`~pyfastensor.offload.Offload`: their values, checked in one place."""

from __future__ import annotations

from typing import Any

TIERS = ("ssd", "host", "auto")
POLICIES = ("all", "auto", "scheduled", "planned", "none")
DICTIONARIES = ("wr", "w", "r")
#: The dictionary's use, by ``dictionary=`` value (the store's name for it).
DICTIONARY_USE = {"wr": "write_read", "w": "write", "r": "read"}
CODECS = ("fp16", "sparse")


def compression(value: None | str | tuple[str, ...] | list[str]) -> frozenset[str]:
    """The codecs ``compression=`` asks for.

    Raises:
        ValueError: for a codec other than ``"fp16"`` and ``"sparse"``.
    """
    if value is None:
        return frozenset()
    items = (value,) if isinstance(value, str) else tuple(value)
    for c in items:
        if c not in CODECS:
            raise ValueError(f"compression {value!r}: expected None, 'fp16', 'sparse' or ('fp16', 'sparse')")
    return frozenset(items)


def check(*, tier: str, policy: str, dictionary: str, on_full: str, budget: int | None,
          compression: None | str | tuple[str, ...], host_bytes: int | None, min_size: int,
          stash_bytes: int | None = None) -> None:
    """Check the options of an offload object, alone and together.

    Raises:
        ValueError: naming the option and the values it takes.
    """
    if tier not in TIERS:
        raise ValueError(f"tier {tier!r}: expected one of {', '.join(TIERS)}")
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r}: expected one of {', '.join(POLICIES)}")
    if dictionary not in DICTIONARIES:
        raise ValueError(f"dictionary {dictionary!r}: expected one of {', '.join(DICTIONARIES)}")
    if on_full not in ("warn", "raise"):
        raise ValueError(f"on_full {on_full!r}: expected 'warn' or 'raise'")
    if budget is not None and budget < 0:
        raise ValueError(f"budget {budget!r}: expected None or a number of bytes >= 0")
    if policy in ("scheduled", "planned", "auto") and budget is None:
        raise ValueError(f"policy={policy!r} needs budget= (bytes of saved tensors that may stay resident)")
    if policy == "planned" and tier == "host":
        raise ValueError("policy='planned' takes tier='ssd' (SSD only) or tier='auto' (G10's tiering: the SSD, "
                         "and host memory while the SSD is busy), not 'host'")
    if policy in ("planned", "auto") and compression:
        raise ValueError(f"policy={policy!r} moves saved tensors as they are: compression must be None")
    if host_bytes is not None and (host_bytes < 0 or policy != "planned" or tier != "auto"):
        raise ValueError(f"host_bytes {host_bytes!r}: a number of bytes >= 0, for policy='planned' with "
                         "tier='auto' only")
    if min_size < 0:
        raise ValueError(f"min_size {min_size!r}: expected a number of bytes >= 0")
    if stash_bytes is not None and stash_bytes < 0:
        raise ValueError(f"stash_bytes {stash_bytes!r}: expected None or a number of bytes >= 0")


def policy_for(policy: str, *, compression: frozenset[str], budget: int | None, host_bytes: int | None, tier: str,
               verbose: bool) -> Any:
    """The policy object (:mod:`._policy`, :mod:`._auto`) of ``policy=`` (checked already by
    :func:`check`: a budget where the mode needs one)."""
    from ._policy import OffloadAll, OffloadNone, Planned, Scheduled

    if policy == "none":
        return OffloadNone()
    if policy == "all":
        return OffloadAll(compression)
    assert budget is not None
    if policy == "auto":
        from ._auto import Auto

        return Auto(budget, tier, verbose)
    if policy == "scheduled":
        return Scheduled(compression, budget, verbose)
    return Planned(budget, host_bytes, tier, verbose)
