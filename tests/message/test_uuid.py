"""UUIDs, Clocks and Flags: Gazette's uuid_test.go, ported, plus properties.

The UUID and Clock fixtures below were computed with Gazette's Go
implementation (message.BuildUUID and message.NewClock).
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from message import (
    Clock,
    Flags,
    build_uuid,
    get_clock,
    get_flags,
    get_producer_id,
    new_clock,
    new_producer_id,
)
from message._uuid import uuid_text

G1582NS100 = 122192928000000000  # 100 ns intervals from 1582-10-15 to 1970-01-01.

# (producer hex, clock, flags, BuildUUID(producer, clock, flags)) from Gazette.
GO_UUIDS = [
    ("010203040506", 0, 0, "00000000-0000-1000-8000-010203040506"),
    ("fffefdfcfbfa", 1, 1, "00000000-0000-1000-8401-fffefdfcfbfa"),
    ("8b5a00112233", 15, 2, "00000000-0000-1000-bc02-8b5a00112233"),
    ("010203040506", 16, 256, "00000001-0000-1000-8100-010203040506"),
    ("fffefdfcfbfa", 160, 682, "0000000a-0000-1000-82aa-fffefdfcfbfa"),
    ("8b5a00112233", 18364758544493064720, 1023, "87654321-cba9-1fed-83ff-8b5a00112233"),
    ("010203040506", 18446744073709551615, 0, "ffffffff-ffff-1fff-bc00-010203040506"),
    ("fffefdfcfbfa", 2205855587517003792, 1, "83fc2f81-cc5f-11e9-8001-fffefdfcfbfa"),
    ("8b5a00112233", 2205855587517003794, 2, "83fc2f81-cc5f-11e9-8802-8b5a00112233"),
    ("010203040506", 1955086848000000000, 256, "13814000-1dd2-11b2-8100-010203040506"),
]

# (unix nanoseconds, NewClock(time.Unix(0, ns))) from Gazette.
GO_CLOCKS = [
    (0, 1955086848000000000),
    (12000000300, 1955086849920000048),
    (12000000399, 1955086849920000048),
    (1567304621981273734, 2205855587517003792),
    (1700000000123456789, 2227086848019753072),
]


def unix_ns(secs: int, nanos: int) -> int:
    return secs * 1_000_000_000 + nanos


def test_flags_values() -> None:
    """Flags is an IntEnum with Gazette's values."""
    assert issubclass(Flags, enum.IntEnum)
    assert Flags.OUTSIDE_TXN == 0
    assert Flags.CONTINUE_TXN == 1
    assert Flags.ACK_TXN == 2
    assert isinstance(Flags.ACK_TXN, int)


def test_producer_uniqueness() -> None:
    """Gazette's TestUUIDProducerUniqueness; also 6 bytes with the multicast bit set."""
    ids = [new_producer_id() for _ in range(1000)]
    assert len(set(ids)) == 1000
    for pid in ids:
        assert isinstance(pid, bytes)
        assert len(pid) == 6
        assert pid[0] & 0x01 == 1
    # The other 47 bits are random: every bit position takes both values.
    ored = andded = int.from_bytes(ids[0], "big")
    for pid in ids[1:]:
        ored |= int.from_bytes(pid, "big")
        andded &= int.from_bytes(pid, "big")
    assert ored == (1 << 48) - 1
    assert andded == 1 << 40


@pytest.mark.parametrize(("producer", "clock", "flags", "expect"), GO_UUIDS)
def test_build_uuid_matches_go(producer: str, clock: int, flags: int, expect: str) -> None:
    """build_uuid reproduces Gazette's BuildUUID byte for byte; the getters invert it."""
    pid = bytes.fromhex(producer)
    u = build_uuid(pid, clock, flags)
    assert isinstance(u, uuid.UUID)
    assert u == uuid.UUID(expect)
    assert u.bytes == uuid.UUID(expect).bytes
    assert get_clock(u) == clock
    assert get_flags(u) == flags
    assert get_producer_id(u) == pid
    assert isinstance(get_producer_id(u), bytes)


@pytest.mark.parametrize(("ns", "expect"), GO_CLOCKS)
def test_new_clock_matches_go(ns: int, expect: int) -> None:
    """new_clock reproduces Gazette's NewClock, precise to 100 ns."""
    assert new_clock(ns) == expect
    assert new_clock(ns) == ((ns // 100) + G1582NS100) << 4


def test_clock() -> None:
    """Gazette's TestUUIDClock (tick adds one; update never decreases, sequence bits included)."""
    clock = Clock()
    assert clock.value == 0

    # Each tick produces a new value.
    assert clock.tick() == 1
    assert clock.tick() == 2
    assert clock.value == 2

    # advance(n) passes n values at once and returns the first of them.
    assert clock.advance(3) == 3 and clock.value == 5
    assert clock.advance(1) == 6 == clock.value
    with pytest.raises(ValueError, match="at least 1"):
        clock.advance(0)
    clock = Clock(2)

    clock.update(unix_ns(12, 300))

    # Clock representation is precise to 100 ns.
    assert clock.value == new_clock(unix_ns(12, 399))
    assert clock.value < new_clock(unix_ns(12, 400))
    assert clock.value > new_clock(unix_ns(12, 299))

    # Within a 100 ns interval, Clock uses remaining bits to extend the sequence.
    assert clock.value == new_clock(unix_ns(12, 300))
    clock.tick()
    assert clock.value > new_clock(unix_ns(12, 399))

    # Just 4 bits are available. If they're overflowed, tick spills over to the timestamp.
    for _ in range(14):
        clock.tick()
        assert clock.value < new_clock(unix_ns(12, 400))
    clock.tick()  # 16th tick.
    assert clock.value == new_clock(unix_ns(12, 400))

    # Update must never decrease the clock value.
    clock.update(unix_ns(11, 100))
    assert clock.value == new_clock(unix_ns(12, 400))

    # That includes sequence bits.
    clock.tick()
    clock.update(unix_ns(12, 400))
    assert clock.value > new_clock(unix_ns(12, 400))
    assert clock.value == new_clock(unix_ns(12, 400)) + 1

    # Sequence bits are reset if the clock timestamp is updated.
    clock.update(unix_ns(12, 500))
    assert clock.value == new_clock(unix_ns(12, 500))


def test_clock_initial_value_and_update_to_now() -> None:
    """Clock(value) starts there; update() with no argument moves to the wall clock."""
    assert Clock(12345).value == 12345
    assert Clock(12345).tick() == 12346

    clock = Clock()
    before = new_clock(time.time_ns())
    clock.update()
    after = new_clock(time.time_ns())
    assert before <= clock.value <= after

    # A clock ahead of the wall clock stays where it is.
    ahead = Clock(after + (10**9 << 4))
    ahead.update()
    assert ahead.value == after + (10**9 << 4)
    ahead.update(None)
    assert ahead.value == after + (10**9 << 4)


def test_update_and_tick_is_the_wall_clock_plus_one_and_never_goes_back() -> None:
    clock = Clock()
    before = new_clock(time.time_ns())
    first = clock.update_and_tick()
    assert before + 1 <= first <= new_clock(time.time_ns()) + 1
    assert clock.value == first
    values = [clock.update_and_tick() for _ in range(1000)]
    assert all(b > a for a, b in zip([first, *values], values, strict=False))
    start = new_clock(time.time_ns()) + (10**9 << 4)
    ahead = Clock(start)  # ahead of the wall clock: it only ticks
    assert [ahead.update_and_tick() for _ in range(3)] == [start + 1, start + 2, start + 3]


def test_uuid_building() -> None:
    """Gazette's TestUUIDBuilding: round trip, and compatibility with RFC 4122 tooling."""
    producer = new_producer_id()
    expect_secs, expect_nanos = 1567304621, 981273734
    clock = Clock()
    clock.update(unix_ns(expect_secs, expect_nanos))
    clock.tick()
    clock.tick()
    expect_flags = 682  # 0b1010101010

    u = build_uuid(producer, clock.value, expect_flags)
    assert get_clock(u) == clock.value
    assert get_producer_id(u) == producer
    assert get_flags(u) == expect_flags

    # Compatibility with Python's uuid module.
    assert u.version == 1
    assert u.variant == uuid.RFC_4122
    assert u.node == int.from_bytes(producer, "big")
    assert u.time == clock.value >> 4

    # The module extracts our time point, rounded to 100 ns.
    ns = (u.time - G1582NS100) * 100
    assert divmod(ns, 1_000_000_000) == (expect_secs, (expect_nanos // 100) * 100)


def test_nil_uuid() -> None:
    """The nil UUID has clock 0, flags 0 and an all-zero producer."""
    nil = uuid.UUID(int=0)
    assert get_clock(nil) == 0
    assert get_flags(nil) == 0
    assert get_producer_id(nil) == bytes(6)


@pytest.mark.parametrize("flags", [0x400, 0x401, 0xFFFF, 1 << 20])
def test_build_uuid_rejects_large_flags(flags: int) -> None:
    """Flags above 0x3ff raise ValueError (Gazette panics)."""
    with pytest.raises(ValueError):
        build_uuid(bytes(6), 1, flags)


@pytest.mark.parametrize("producer", [b"", bytes(5), bytes(7), bytes(16)])
def test_build_uuid_rejects_bad_producer(producer: bytes) -> None:
    """A producer ID that is not 6 bytes raises ValueError."""
    with pytest.raises(ValueError):
        build_uuid(producer, 1, 0)


def test_flags_enum_accepted() -> None:
    """Flags members and plain ints build the same UUID."""
    pid = bytes.fromhex("0102030405ff")
    for f in Flags:
        assert build_uuid(pid, 99, f) == build_uuid(pid, 99, int(f))
        assert get_flags(build_uuid(pid, 99, f)) == f


def test_tick_is_thread_safe() -> None:
    """Concurrent ticks return distinct values, increasing in each thread, and none is lost."""
    clock = Clock(1000)
    n_threads, n_ticks = 8, 5000
    results: list[list[int]] = [[] for _ in range(n_threads)]
    barrier = threading.Barrier(n_threads)

    def work(out: list[int]) -> None:
        barrier.wait()
        out.extend(clock.tick() for _ in range(n_ticks))

    threads = [threading.Thread(target=work, args=(r,)) for r in results]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    every = [v for r in results for v in r]
    assert len(set(every)) == n_threads * n_ticks
    assert sorted(every) == list(range(1001, 1001 + n_threads * n_ticks))
    assert clock.value == 1000 + n_threads * n_ticks
    for r in results:
        assert r == sorted(r)


def test_update_and_tick_concurrently_stay_monotonic() -> None:
    """Concurrent updates never move the clock backwards, nor make a tick repeat."""
    clock = Clock()
    base = unix_ns(1_700_000_000, 0)
    seen: list[list[int]] = [[], []]
    stop = threading.Event()

    def ticker(out: list[int]) -> None:
        while not stop.is_set():
            out.append(clock.tick())

    def updater() -> None:
        for i in range(2000):
            clock.update(base + (i % 50) * 100)  # Goes back and forth in time.

    threads = [threading.Thread(target=ticker, args=(s,)) for s in seen]
    for t in threads:
        t.start()
    updater()
    stop.set()
    for t in threads:
        t.join()
    for s in seen:
        assert all(a < b for a, b in itertools.pairwise(s))
    every = [v for s in seen for v in s]
    assert len(set(every)) == len(every)
    assert clock.value >= new_clock(base + 49 * 100)


@settings(deadline=None, max_examples=300)
@given(
    producer=st.binary(min_size=6, max_size=6),
    clock=st.integers(0, 2**64 - 1),
    flags=st.integers(0, 0x3FF),
)
def test_round_trip_property(producer: bytes, clock: int, flags: int) -> None:
    """get_clock, get_flags and get_producer_id invert build_uuid; always v1, RFC 4122."""
    u = build_uuid(producer, clock, flags)
    assert (get_producer_id(u), get_clock(u), get_flags(u)) == (producer, clock, flags)
    assert u.version == 1
    assert u.variant == uuid.RFC_4122
    # The layout, field by field.
    assert u.time_low == (clock >> 4) & 0xFFFFFFFF
    assert u.time_mid == (clock >> 36) & 0xFFFF
    assert u.time_hi_version == ((clock >> 52) & 0x0FFF) | 0x1000
    assert (u.clock_seq_hi_variant << 8 | u.clock_seq_low) == (
        ((clock << 10) & 0x3C00) | flags | 0x8000
    )
    assert u.node == int.from_bytes(producer, "big")


class OwnUUID(uuid.UUID):
    """A subclass, as uuid6.UUID is."""


@given(value=st.integers(0, 2**128 - 1))
def test_uuid_text_is_the_canonical_string(value: int) -> None:
    """uuid_text (what documents store) is str(u), for every 128-bit value,
    of uuid.UUID and of its subclasses."""
    u = uuid.UUID(int=value)
    assert uuid_text(u) == str(u)
    assert uuid_text(OwnUUID(int=value)) == str(u)


@settings(deadline=None, max_examples=200)
@given(
    producer=st.binary(min_size=6, max_size=6),
    a=st.integers(0, 2**64 - 1),
    b=st.integers(0, 2**64 - 1),
    fa=st.integers(0, 0x3FF),
    fb=st.integers(0, 0x3FF),
)
def test_clock_order_property(producer: bytes, a: int, b: int, fa: int, fb: int) -> None:
    """UUIDs of one producer order by clock: get_clock preserves order whatever the flags."""
    ua, ub = build_uuid(producer, a, fa), build_uuid(producer, b, fb)
    assert (get_clock(ua) < get_clock(ub)) == (a < b)
    assert (ua == ub) == (a == b and fa == fb)


@settings(deadline=None, max_examples=200)
@given(ns=st.integers(0, 2**62), ticks=st.integers(0, 40), later=st.integers(-(10**6), 10**6))
def test_update_property(ns: int, ticks: int, later: int) -> None:
    """update sets new_clock(t) only if larger; tick adds exactly one."""
    clock = Clock()
    clock.update(ns)
    assert clock.value == new_clock(ns)
    for _ in range(ticks):
        clock.tick()
    current = clock.value
    assert current == new_clock(ns) + ticks
    clock.update(max(0, ns + later))
    assert clock.value == max(current, new_clock(max(0, ns + later)))


def test_build_uuid_rejects_clocks_beyond_64_bits() -> None:
    """A clock outside 0..2**64-1 is a ValueError, not silently truncated."""
    build_uuid(b"\x01" * 6, (1 << 64) - 1, 0)
    for bad in (1 << 64, -1):
        with pytest.raises(ValueError):
            build_uuid(b"\x01" * 6, bad, 0)


def test_uuids_are_made_by_the_constructor_where_uuid_slots_differ() -> None:
    """Where uuid.UUID is not its two slots ``int`` and ``is_safe``, UUIDs
    are made by its constructor, and stay the same values."""
    import subprocess
    import sys
    from pathlib import Path

    code = r"""
import uuid
class Other(uuid.UUID):  # a UUID class with one more slot
    __slots__ = ("extra",)
uuid.UUID = Other
import message
from message import Flags, build_uuid
from message._uuid import SLOTS_KNOWN
assert not SLOTS_KNOWN
assert message.IMPLEMENTATION == "python"  # the native core makes UUIDs by slots
u = build_uuid(bytes(range(1, 7)), 0x1EF1234567890ABC, Flags.ACK_TXN)
assert isinstance(u, Other) and u.version == 1, u
print(u)
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=60, cwd=Path(__file__).resolve().parents[2], env={"PATH": ""})
    assert r.returncode == 0, r.stderr
    assert "uuid.UUID is not laid out as it expects" in r.stderr or "not built" in r.stderr
    from message import Flags, build_uuid

    assert r.stdout.strip() == str(build_uuid(bytes(range(1, 7)), 0x1EF1234567890ABC,
                                              Flags.ACK_TXN))
