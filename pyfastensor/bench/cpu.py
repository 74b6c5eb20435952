"""How fast this CPU checks what pyfastensor writes: :func:`crc_speed`."""

from __future__ import annotations


def crc_speed(block: int, millis: int = 200) -> float:
    """Measure the CRC-32 every checkpoint record is checked with, on one thread.

    A block of ``block`` bytes is summed again and again for about ``millis``
    milliseconds. A block that fits the CPU's cache gives the checksum's own
    speed; a block larger than the caches gives its speed over memory, what
    a verified load of a large checkpoint pays per byte on each core.

    Args:
        block: bytes summed per pass (> 0).
        millis: about how long to measure, in milliseconds. Default 200.

    Returns:
        Bytes per second.

    Example::

        >>> from pyfastensor.bench import crc_speed
        >>> crc_speed(1 << 20) / 1e9  # doctest: +SKIP
        21.4
    """
    from .._lib import crc_speed as native

    return native(block, millis)
