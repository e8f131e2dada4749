"""The UUID bit layout, in one place: scalar and numpy forms.

Every other piece of code that takes a UUID apart (the Python Sequencer, the
Publisher, the native core in ``message/_native.c``, the Spark source's
vectorised scan) takes its numbers from here; the native core's copies are
checked against this module by the test suite (``tests/message/test_layout.py``).

A message UUID is an RFC 4122 version 1 UUID laid out as Gazette's
``BuildUUID``. As a 128-bit integer ``i`` (``uuid.UUID.int``), big-endian::

    bits 127..96   time_low   = clock >> 4            (32 bits)
    bits  95..80   time_mid   = clock >> 36           (16 bits)
    bits  79..76   version    = 1
    bits  75..64   time_hi    = clock >> 52           (12 bits)
    bits  63..62   variant    = 0b10
    bits  61..58   counter    = clock & 0xF           (4 bits)
    bits  57..48   flags                              (10 bits)
    bits  47..0    node       = ProducerID            (48 bits)

Split in two 64-bit halves (``hi = i >> 64``, ``lo = i & (2**64 - 1)``), as
the native core and the numpy forms hold it, the clock is::

    ((hi & 0x0FFF) << 52) | (((hi >> 16) & 0xFFFF) << 36) | ((hi >> 32) << 4)
        | ((lo >> 58) & 0xF)

The commit rules that take these fields (which envelope commits, which is a
duplicate) are :mod:`message.rules`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    import numpy as np

    Array = np.ndarray[Any, Any]
else:
    Array = Any

#: Offset between the UUID epoch (1582-10-15) and the Unix epoch, in 100 ns.
UUID_EPOCH_OFFSET: Final = 122192928000000000

#: The low 48 bits of a UUID: the node field, a ProducerID.
PRODUCER_MASK: Final = (1 << 48) - 1
#: Flags are the 10 bits above the ProducerID.
FLAGS_SHIFT: Final = 48
FLAGS_MASK: Final = 0x3FF
#: The clock's 4-bit counter sits above the flags, below the variant.
COUNTER_SHIFT: Final = 58
#: Version (1) and variant (0b10) bits of a v1 UUID, as set by build_uuid.
VERSION_BITS: Final = 0x1000 << 64
VARIANT_BITS: Final = 0x8000 << 48

#: Flag values (``message.Flags`` is the enum of these).
OUTSIDE_TXN: Final = 0x0
CONTINUE_TXN: Final = 0x1
ACK_TXN: Final = 0x2

#: Clock units: 100 ns, shifted past the 4 counter bits.
CLOCK_UNITS_PER_SECOND: Final = 10_000_000 << 4


# -- scalar forms ------------------------------------------------------------


def clock_of_int(i: int) -> int:
    """The Clock of a UUID given as its 128-bit integer."""
    return (
        (((i >> 64) & 0x0FFF) << 52)
        | (((i >> 80) & 0xFFFF) << 36)
        | ((i >> 96) << 4)
        | ((i >> COUNTER_SHIFT) & 0xF)
    )


def flags_of_int(i: int) -> int:
    """The 10 flag bits of a UUID given as its 128-bit integer."""
    return (i >> FLAGS_SHIFT) & FLAGS_MASK


def producer_of_int(i: int) -> int:
    """The ProducerID of a UUID given as its 128-bit integer, as an int."""
    return i & PRODUCER_MASK


def high_bits(clock: int) -> int:
    """Bits 64..95 of the UUID of ``clock`` (time_mid, version, time_hi):
    they change only when ``clock >> 36`` does (every seven minutes)."""
    return (((clock >> 36) & 0xFFFF) << 80) | ((((clock >> 52) & 0x0FFF) | 0x1000) << 64)


def low_bits(producer: int, clock: int, flags: int) -> int:
    """The low 64 bits of the UUID of ``clock``: variant, counter, flags, node."""
    return ((clock & 0xF) << COUNTER_SHIFT) | ((0x8000 | flags) << FLAGS_SHIFT) | producer


def uuid_int(producer: int, clock: int, flags: int) -> int:
    """The 128-bit integer of the UUID of (ProducerID as an int, clock, flags)."""
    return (((clock >> 4) & 0xFFFFFFFF) << 96) | high_bits(clock) | low_bits(producer, clock, flags)


# -- numpy forms -------------------------------------------------------------
#
# UUIDs as two uint64 arrays, ``hi`` and ``lo``. numpy is imported by the
# callers (it is an optional dependency, for the Spark source).


def clocks_of(hi: Array, lo: Array) -> Array:
    """Clocks of UUIDs (see :func:`clock_of_int`), as uint64."""
    import numpy as np

    u = np.uint64
    clocks: Array = (
        ((hi & u(0x0FFF)) << u(52))
        | (((hi >> u(16)) & u(0xFFFF)) << u(36))
        | ((hi >> u(32)) << u(4))
        | ((lo >> u(COUNTER_SHIFT)) & u(0xF))
    )
    return clocks


def halves_of(producer: int, clocks: Array, flags: int) -> tuple[Array, Array]:
    """The UUIDs of (``producer``, each of ``clocks``, ``flags``) as ``hi`` and
    ``lo`` uint64 arrays (see :func:`uuid_int`)."""
    import numpy as np

    u = np.uint64
    clocks = np.asarray(clocks, dtype=np.uint64)
    hi: Array = (
        (((clocks >> u(4)) & u(0xFFFFFFFF)) << u(32))
        | (((clocks >> u(36)) & u(0xFFFF)) << u(16))
        | ((clocks >> u(52)) & u(0x0FFF))
        | u(0x1000)
    )
    lo: Array = (
        ((clocks & u(0xF)) << u(COUNTER_SHIFT))
        | u(((0x8000 | flags) << FLAGS_SHIFT) | (producer & PRODUCER_MASK))
    )
    return hi, lo


def flags_of(lo: Array) -> Array:
    """Flags of UUIDs (see :func:`flags_of_int`), as int32."""
    import numpy as np

    flags: Array = ((lo >> np.uint64(FLAGS_SHIFT)) & np.uint64(FLAGS_MASK)).astype(np.int32)
    return flags


def producers_of(lo: Array) -> Array:
    """ProducerIDs of UUIDs as uint64."""
    import numpy as np

    producers: Array = lo & np.uint64(PRODUCER_MASK)
    return producers
