"""Message UUIDs: RFC 4122 version 1 UUIDs carrying a producer's Clock and Flags.

Byte layout (big-endian), as Gazette's ``BuildUUID``::

     0                   1                   2                   3
     0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
    +---------------------------------------------------------------+
    |                 time_low = clock >> 4 (32 bits)               |
    +-------------------------------+-------+-----------------------+
    |  time_mid = clock >> 36 (16)  | ver=1 | time_hi = clock >> 52 |
    +---+-------+-------------------+-------+-----------------------+
    |1 0|counter|      flags (10)   |                               |
    +---+-------+-------------------+        node = ProducerID      |
    |                            (48 bits)                          |
    +---------------------------------------------------------------+

``counter`` is the low 4 bits of the Clock, so a Clock is the 60-bit UUID
timestamp (100 ns units since 1582-10-15) followed by a 4-bit sequence counter:
16 UUIDs per 100 ns per producer before the clock runs ahead of the wall.
"""

from __future__ import annotations

import enum
import os
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import orjson

from .layout import FLAGS_MASK as _MAX_FLAGS
from .layout import PRODUCER_MASK as _MASK48
from .layout import UUID_EPOCH_OFFSET as UUID_EPOCH_OFFSET
from .layout import clock_of_int as clock_of_int
from .layout import flags_of_int, uuid_int

_UUID_NEW = object.__new__
_SET = object.__setattr__
_SAFE = uuid.SafeUUID.unknown


def _slots_are_known() -> bool:
    """Whether a ``uuid.UUID`` is its two slots, ``int`` and ``is_safe``, as
    Python 3.11 to 3.14 have it: then a UUID is made by setting them, with
    no re-validation; elsewhere ``uuid.UUID(int=...)`` makes it."""
    if set(getattr(uuid.UUID, "__slots__", ())) - {"__weakref__"} != {"int", "is_safe"}:
        return False
    value = (0x1234 << 96) | 0x5678
    u = _UUID_NEW(uuid.UUID)
    _SET(u, "int", value)
    _SET(u, "is_safe", _SAFE)
    return u == uuid.UUID(int=value) and str(u) == str(uuid.UUID(int=value))


#: Checked once, at import (see ``uuid_from_int``).
SLOTS_KNOWN = _slots_are_known()


class Flags(enum.IntEnum):
    """Transaction semantics of a message, the 10 low bits of its clock sequence."""

    #: Not part of a transaction: commits on its own as soon as it is read.
    OUTSIDE_TXN = 0x0
    #: Begins or continues a transaction, committed by a later ACK_TXN with a
    #: larger clock, or rolled back by one with a smaller clock.
    CONTINUE_TXN = 0x1
    #: Acknowledges (commits) the producer's preceding CONTINUE_TXN messages
    #: whose clocks are not larger than its own.
    ACK_TXN = 0x2


#: Message types that can give their UUID as an int without building a
#: ``uuid.UUID`` (the Sequencer needs only the int): type -> function.
UUID_INT_OF: dict[type, Callable[[Any], int]] = {}


def new_producer_id() -> bytes:
    """6 cryptographically random bytes, with the multicast bit set as RFC 4122
    asks of node identifiers that are not MAC addresses."""
    b = bytearray(os.urandom(6))
    b[0] |= 0x01
    return bytes(b)


def new_clock(unix_ns: int) -> int:
    """The Clock of a wall time given in nanoseconds since the Unix epoch."""
    return ((unix_ns // 100) + UUID_EPOCH_OFFSET) << 4


def _uuid_by_slots(value: int) -> uuid.UUID:
    u = _UUID_NEW(uuid.UUID)
    _SET(u, "int", value)
    _SET(u, "is_safe", _SAFE)
    return u


def _uuid_by_constructor(value: int) -> uuid.UUID:
    return uuid.UUID(int=value)


#: The ``uuid.UUID`` of a 128-bit value known to be in range. ``uuid.UUID(int=...)``
#: re-validates its argument; where the slots are known (``SLOTS_KNOWN``)
#: they are set directly instead, three times faster.
uuid_from_int: Callable[[int], uuid.UUID] = (
    _uuid_by_slots if SLOTS_KNOWN else _uuid_by_constructor
)


def build_uuid(producer: bytes, clock: int, flags: int) -> uuid.UUID:
    """A v1 UUID from a 6-byte ProducerID, a Clock and 10 bits of Flags."""
    if len(producer) != 6:
        raise ValueError(f"producer must be 6 bytes, not {len(producer)}")
    if flags > _MAX_FLAGS or flags < 0:
        raise ValueError(f"flags must be in 0..0x3ff, not {flags:#x}")
    if clock >> 64 or clock < 0:
        # A Clock is 64 bits; more would be cut silently, maybe down to the
        # clock 0 that opts a message out of exactly-once.
        raise ValueError(f"clock must be in 0..2**64-1, not {clock}")
    return uuid_from_int(uuid_int(int.from_bytes(producer, "big"), clock, flags))


def uuid_text(u: uuid.UUID) -> str:
    """``str(u)``: the canonical 8-4-4-4-12 string, formatted by orjson in C
    (a third of the time of ``uuid.UUID.__str__``) where ``u`` is a plain
    ``uuid.UUID`` (orjson takes no subclass)."""
    if type(u) is uuid.UUID:
        return orjson.dumps(u)[1:-1].decode()
    return str(u)


def get_clock(u: uuid.UUID) -> int:
    """The Clock (timestamp and counter) of a UUID; 0 for the nil UUID."""
    return clock_of_int(u.int)


def get_flags(u: uuid.UUID) -> int:
    """The 10 flag bits of a UUID's clock sequence."""
    return flags_of_int(u.int)


def get_producer_id(u: uuid.UUID) -> bytes:
    """The 6-byte node identifier (ProducerID) of a UUID."""
    return (u.int & _MASK48).to_bytes(6, "big")


def clock_to_unix_ns(clock: int) -> int:
    """Nanoseconds since the Unix epoch of a Clock's timestamp (counter dropped)."""
    return ((clock >> 4) - UUID_EPOCH_OFFSET) * 100


class Clock:
    """A monotonic, thread-safe Clock: 60 bits of timestamp, 4 of counter.

    ``tick()`` adds one; ``update()`` moves it to the wall clock, never back.
    """

    __slots__ = ("_lock", "_value")

    def __init__(self, value: int = 0) -> None:
        self._value = value
        self._lock = threading.Lock()

    @property
    def value(self) -> int:
        return self._value

    def tick(self) -> int:
        """Add one to the clock and return the new value."""
        with self._lock:
            self._value += 1
            return self._value

    def advance(self, count: int) -> int:
        """Add ``count`` to the clock and return the first of the ``count``
        values passed (what ``count`` calls of ``tick()`` would return
        first); ``count`` is at least 1."""
        if count < 1:
            raise ValueError(f"a clock advances by at least 1, not {count}")
        with self._lock:
            first = self._value + 1
            self._value += count
            return first

    def update_and_tick(self) -> int:
        """``update()`` to the wall clock, then ``tick()``, as one step: the
        clock value of a message published now."""
        wall = new_clock(time.time_ns())
        with self._lock:
            value = self._value
            self._value = value = (wall if wall > value else value) + 1
            return value

    def update(self, unix_ns: int | None = None) -> None:
        """Set the clock to the time ``unix_ns`` (default now) if that is later."""
        nxt = new_clock(time.time_ns() if unix_ns is None else unix_ns)
        with self._lock:
            if nxt > self._value:
                self._value = nxt

    def __repr__(self) -> str:
        return f"Clock({self._value})"
