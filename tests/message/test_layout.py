"""message.layout is the one definition of the UUID bit layout and the commit
rule: build_uuid and the get_* functions agree with it, the numpy forms with
the scalar ones, and the native core's constants and UUID reading with it."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from message import _core, build_uuid, get_clock, get_flags, get_producer_id, layout

clocks = st.integers(0, 2**64 - 1)
flags = st.integers(0, 0x3FF)
producers = st.binary(min_size=6, max_size=6)


@given(producers, clocks, flags)
def test_scalar_forms_take_build_uuid_apart(p: bytes, c: int, f: int) -> None:
    i = build_uuid(p, c, f).int
    assert i == layout.uuid_int(int.from_bytes(p, "big"), c, f)
    assert layout.clock_of_int(i) == c == get_clock(uuid.UUID(int=i))
    assert layout.flags_of_int(i) == f == get_flags(uuid.UUID(int=i))
    assert layout.producer_of_int(i).to_bytes(6, "big") == p == get_producer_id(uuid.UUID(int=i))
    assert i & layout.VERSION_BITS and i & layout.VARIANT_BITS


@given(st.lists(st.tuples(producers, clocks, flags), max_size=50))
def test_numpy_forms_equal_the_scalar_ones(rows: list[tuple[bytes, int, int]]) -> None:
    np = pytest.importorskip("numpy")
    ints = [build_uuid(p, c, f).int for p, c, f in rows]
    hi = np.array([i >> 64 for i in ints], dtype=np.uint64)
    lo = np.array([i & (2**64 - 1) for i in ints], dtype=np.uint64)
    assert layout.clocks_of(hi, lo).tolist() == [c for _, c, _ in rows]
    assert layout.flags_of(lo).tolist() == [f for _, _, f in rows]
    assert layout.producers_of(lo).tolist() == [int.from_bytes(p, "big") for p, _, _ in rows]


@given(producers, st.integers(0, 2**64 - 300), st.integers(0, 200), flags)
def test_uuids_of_a_clock_range_are_build_uuids(p: bytes, first: int, n: int, f: int) -> None:
    """``layout.halves_of`` and ``message.columns.uuid_strings``: the UUIDs of
    consecutive clocks, as a Publisher stamps them one by one."""
    np = pytest.importorskip("numpy")
    from message.columns import uuid_strings

    expected = [build_uuid(p, c, f) for c in range(first, first + n)]
    hi, lo = layout.halves_of(int.from_bytes(p, "big"), np.arange(first, first + n,
                                                                dtype=np.uint64), f)
    assert [(int(h) << 64) | int(low) for h, low in zip(hi, lo, strict=True)] == \
        [u.int for u in expected]
    assert uuid_strings(p, first, n, f) == "".join(map(str, expected)).encode()


needs_native = pytest.mark.skipif(_core.NATIVE is None, reason="the native core is not in use")


@needs_native
def test_native_constants_are_the_layout_modules() -> None:
    for name, value in _core.NATIVE.layout().items():
        assert getattr(layout, name) == value, name


@needs_native
@given(st.one_of(st.integers(0, 2**128 - 1), st.tuples(producers, clocks, flags)))
def test_native_reads_uuids_as_the_layout_module(v: int | tuple[bytes, int, int]) -> None:
    i = v if isinstance(v, int) else build_uuid(*v).int
    assert _core.NATIVE.split_uuid(i) == (
        layout.clock_of_int(i), layout.flags_of_int(i), layout.producer_of_int(i)
    )


def test_uuid_columns_module_example_runs() -> None:
    """message.columns' docstring example holds (with numpy at hand)."""
    import doctest

    pytest.importorskip("numpy")
    import message.columns

    failures, tried = doctest.testmod(message.columns)
    assert tried > 0 and failures == 0
