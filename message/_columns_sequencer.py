"""The Sequencer's decisions over columns, computed with numpy.

Given the frames of a window of one journal as columns (offset, ProducerID,
clock, flags, in offset order) and the producers' states before it, this
module says which frames commit and which frame commits each one, and gives
the producers' states after the window: the same answer as a
:class:`message.Sequencer` fed the same frames (``message/_sequencer.py`` is
the definition), with no Python object per frame.

Per producer, the Sequencer's state machine unrolls into scans:

1. ``last_ack`` before each frame is a running maximum of the producer's
   OUTSIDE_TXN clocks, restarted at each ACK_TXN (an ACK sets ``last_ack``
   to its clock, a roll-back even lowers it). An OUTSIDE_TXN frame commits
   iff its clock exceeds it; an ACK_TXN frame commits its span iff its clock
   exceeds it, else it rolls back.
2. Those commits and every ACK cut the producer's frames into spans: the
   CONTINUE_TXN frames between two of them. A span closed by a committing
   ACK emits each frame whose clock exceeds every clock of the span before
   it (starting from ``last_ack``) and does not exceed the ACK's
   (``rules.span_emits``); the ACK follows unless a frame with its own
   clock was emitted (``rules.ack_emits``). Other spans are discarded.
3. A span still open at the end of the window is the producer's ``begin``.

A span open before the window (a state with ``begin``) is committed here
only with its first frames: the caller passes them ahead of the window's
frames (``replayed``), as the Sequencer's replay re-reads them.

:func:`numpy_sequence_columns` is the definition, in numpy; the native core,
when built, runs the same rules as one pass over the frames
(``message/_native_src/columns_sequencer.inc.c``), and :func:`sequence_columns` picks it
(``EXACTLY_PURE_PYTHON=1``: numpy). The test suite holds the two to the same
answers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ._core import NATIVE
from .layout import ACK_TXN, CONTINUE_TXN

if TYPE_CHECKING:
    Array = np.ndarray[Any, Any]
else:
    Array = Any

_U64 = np.uint64
_I64 = np.int64


@dataclass(slots=True)
class ProducerColumns:
    """The producer states of one journal as columns, sorted by ProducerID:
    ``last_ack`` and ``begin`` (-1: no open span), as ``ProducerState`` has them."""

    producers: Array  # uint64, sorted, unique
    last_ack: Array  # uint64
    begin: Array  # int64

    @staticmethod
    def empty() -> ProducerColumns:
        return ProducerColumns(
            np.zeros(0, dtype=_U64), np.zeros(0, dtype=_U64), np.zeros(0, dtype=_I64)
        )

    @staticmethod
    def of(states: list[tuple[int, int, int]]) -> ProducerColumns:
        """From ``(producer, last_ack, begin)`` triples (the last of a producer wins)."""
        if not states:
            return ProducerColumns.empty()
        p = np.array([s[0] for s in states], dtype=_U64)
        a = np.array([s[1] for s in states], dtype=_U64)
        b = np.array([s[2] for s in states], dtype=_I64)
        # The last occurrence of each producer: unique over the reversed arrays.
        uniq, first = np.unique(p[::-1], return_index=True)
        keep = len(p) - 1 - first
        return ProducerColumns(uniq, a[keep], b[keep])

    def __len__(self) -> int:
        return len(self.producers)

    def open_spans(self) -> tuple[Array, Array]:
        """``(producers, begin)`` of the producers with an open span."""
        m = self.begin >= 0
        return self.producers[m], self.begin[m]

    def merged(self, producers: Array, last_ack: Array, begin: Array) -> ProducerColumns:
        """These states with those of ``producers`` (sorted, unique) replaced or added."""
        if not len(producers):
            return self
        if not len(self.producers):
            return ProducerColumns(producers, last_ack, begin)
        old = ~np.isin(self.producers, producers, assume_unique=True)
        p = np.concatenate([self.producers[old], producers])
        order = np.argsort(p, kind="stable")
        return ProducerColumns(
            p[order],
            np.concatenate([self.last_ack[old], last_ack])[order],
            np.concatenate([self.begin[old], begin])[order],
        )

    def pruned(self, units: int) -> ProducerColumns:
        """Without the producers whose ``last_ack`` is more than ``units``
        Clock units older than the newest (``Sequencer.producer_states``'s horizon)."""
        if not len(self.producers):
            return self
        threshold = int(self.last_ack.max()) - units
        if threshold <= 0:
            return self
        keep = self.last_ack >= _U64(threshold)
        return ProducerColumns(self.producers[keep], self.last_ack[keep], self.begin[keep])


def segmented_running_max(values: Array, segments: Array) -> Array:
    """The running maximum of ``values`` (uint64) restarted at each new
    value of ``segments`` (int64, non-decreasing): inclusive, element by element."""
    if not len(values):
        return np.zeros(0, dtype=_U64)
    # Values lifted above every earlier segment's, so that one cumulative
    # maximum serves all segments: as offsets from the smallest value when
    # they fit (clocks of one journal are close together), else as ranks.
    low = values.min()
    span = int(values.max() - low) + 1
    segs = (segments - segments[0]).astype(_I64)
    if span * (int(segs[-1]) + 1) < (1 << 62):
        base = segs * _I64(span)
        acc = np.maximum.accumulate((values - low).astype(_I64) + base)
        out: Array = (acc - base).astype(_U64) + low
        return out
    uniq, rank = np.unique(values, return_inverse=True)
    base = segs * _I64(len(uniq))
    acc = np.maximum.accumulate(rank.astype(_I64).reshape(-1) + base)
    out = uniq[acc - base]
    return out


def group_order(keys: Array) -> tuple[Array, Array]:
    """``(order, group)``: the stable order of ``keys`` (uint64) by value,
    and each ordered element's group number (0, 1, ...: one per distinct
    key). Distinct keys are found by hashing (pyarrow's dictionary
    encoding) when pyarrow is at hand, so that few distinct keys sort in
    linear time."""
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - pyarrow comes with numpy here
        pa = None
    if pa is not None and len(keys) > 1:
        enc = pa.array(keys, pa.uint64()).dictionary_encode()
        dictionary = np.asarray(enc.dictionary.to_numpy(zero_copy_only=False))
        codes = np.asarray(enc.indices.to_numpy(zero_copy_only=False))
        rank = np.empty(len(dictionary), dtype=_I64)
        rank[np.argsort(dictionary)] = np.arange(len(dictionary))
        ranked = rank[codes]
        if len(dictionary) < (1 << 16):
            ranked = ranked.astype(np.uint16)  # a stable sort of 16 bits is a radix sort
        order = np.argsort(ranked, kind="stable")
        sorted_keys = ranked[order]
    else:
        order = np.argsort(keys, kind="stable")
        sorted_keys = keys[order]
    first = np.r_[True, sorted_keys[1:] != sorted_keys[:-1]]
    return order, np.cumsum(first) - 1


def sequence_columns(
    begin: Array,
    producers: Array,
    clocks: Array,
    flags: Array,
    states: ProducerColumns,
    replayed: Array | None = None,
) -> tuple[Array, ProducerColumns]:
    """:func:`numpy_sequence_columns`, in the native core when it is built."""
    if NATIVE is None:
        return numpy_sequence_columns(begin, producers, clocks, flags, states, replayed)
    n = len(begin)
    commit: Array = np.empty(n, dtype=_I64)
    if n == 0:
        return commit, states
    p, a, b = NATIVE.sequence_columns(
        np.ascontiguousarray(begin, dtype=_I64), np.ascontiguousarray(producers, dtype=_U64),
        np.ascontiguousarray(clocks, dtype=_U64), np.ascontiguousarray(flags, dtype=np.int32),
        None if replayed is None else np.ascontiguousarray(replayed, dtype=bool),
        np.ascontiguousarray(states.producers, dtype=_U64),
        np.ascontiguousarray(states.last_ack, dtype=_U64),
        np.ascontiguousarray(states.begin, dtype=_I64), commit,
    )
    seen = np.frombuffer(p, dtype=_U64)
    order = np.argsort(seen)
    return commit, states.merged(
        seen[order], np.frombuffer(a, dtype=_U64)[order], np.frombuffer(b, dtype=_I64)[order]
    )


def numpy_sequence_columns(
    begin: Array,
    producers: Array,
    clocks: Array,
    flags: Array,
    states: ProducerColumns,
    replayed: Array | None = None,
) -> tuple[Array, ProducerColumns]:
    """Which frames commit: per frame, the offset of the frame whose arrival
    commits it (itself, or its ACK), or -1; and the states after the frames.

    The frames (``begin`` int64, ``producers`` and ``clocks`` uint64,
    ``flags`` int32) are in offset order; ``replayed`` marks frames read
    again from before the window for a span open in ``states`` (they count
    as that span's frames whatever their flags, as in a Sequencer's replay).
    Frames with clock 0 always commit and are never tracked.
    """
    n = len(begin)
    commit = np.full(n, -1, dtype=_I64)
    if n == 0:
        return commit, states
    zero = clocks == 0
    commit[zero] = begin[zero]
    rows = np.flatnonzero(~zero)
    if not len(rows):
        return commit, states
    # Group by producer, keeping offset order within each producer.
    by_producer, g = group_order(producers[rows])
    order = rows[by_producer]
    ps, ck, bs = producers[order], clocks[order], begin[order]
    f = flags[order]
    forced = (
        replayed[order] if replayed is not None else np.zeros(len(order), dtype=bool)
    )
    is_c = (f == CONTINUE_TXN) | forced
    is_a = (f == ACK_TXN) & ~forced
    is_o = ~is_c & ~is_a
    m = len(order)
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    gp = ps[starts]
    # Each group's state before the window: a known producer's, or a new
    # one's (first seen with clock c: last_ack = c - 1).
    at = np.searchsorted(states.producers, gp)
    at_c = np.minimum(at, max(len(states) - 1, 0))
    known = (at < len(states)) & (states.producers[at_c] == gp) if len(states) else (
        np.zeros(len(gp), dtype=bool)
    )
    init_last = np.where(known, states.last_ack[at_c] if len(states) else 0, ck[starts] - _U64(1))
    init_last = init_last.astype(_U64)
    init_begin = np.where(known, states.begin[at_c] if len(states) else -1, -1).astype(_I64)

    # 1. last_ack before each frame: per group, the sequence [init, v_0, v_1, ...]
    # where an OUTSIDE_TXN frame's v is its clock, an ACK's its clock (which
    # starts a new segment: it resets last_ack), a CONTINUE's the smallest
    # value of all (no effect).
    neutral = min(ck.min(), init_last.min())  # below every segment's first value
    v = np.where(is_c, neutral, ck)
    cum_a = np.cumsum(is_a)
    a_before_start = cum_a[starts] - is_a[starts]
    seq_vals = np.empty(m + len(starts), dtype=_U64)
    seq_segs = np.empty(m + len(starts), dtype=_I64)
    pos_row = np.arange(m) + g + 1  # where each frame's v sits in the sequence
    pos_init = starts + np.arange(len(starts))
    seq_vals[pos_row] = v
    seq_segs[pos_row] = cum_a + g
    seq_vals[pos_init] = init_last
    seq_segs[pos_init] = a_before_start + np.arange(len(starts))
    running = segmented_running_max(seq_vals, seq_segs)
    lab = running[pos_row - 1]  # last_ack just before each frame
    ends = np.r_[starts[1:], m] - 1
    final_last = running[pos_row[ends]]

    # 2. Spans, cut by the commits and the ACKs.
    event = is_a | (is_o & (ck > lab))
    commits_span = is_a & (ck > lab)
    cum_e = np.cumsum(event)
    span = cum_e - event + g  # the span each frame belongs to (or closes)
    closer = np.full(int(cum_e[-1]) + len(starts) + 1, -1, dtype=_I64)
    ev_rows = np.flatnonzero(event)
    closer[span[ev_rows]] = ev_rows
    c_rows = np.flatnonzero(is_c)
    emit = np.zeros(m, dtype=bool)
    ack_of = np.zeros(m, dtype=_U64)
    if len(c_rows):
        c_span = span[c_rows]
        c_close = closer[c_span]
        closed = c_close >= 0
        committed = np.zeros(len(c_rows), dtype=bool)
        committed[closed] = commits_span[c_close[closed]]
        ack = np.zeros(len(c_rows), dtype=_U64)
        ack[committed] = ck[c_close[committed]]
        # The largest clock of the span before each of its frames, from last_ack.
        kc = ck[c_rows]
        inclusive = segmented_running_max(kc, c_span)
        prior = np.r_[_U64(0), inclusive[:-1]]
        new_span = np.r_[True, c_span[1:] != c_span[:-1]]
        prior[new_span] = 0
        prior = np.maximum(prior, lab[c_rows])
        ok = committed & (kc > prior) & (kc <= ack)
        emit[c_rows[ok]] = True
        ack_of[c_rows] = ack
        commit[order[c_rows[ok]]] = bs[c_close[ok]]
    # 3. The ACK follows its span unless a frame with its clock was emitted.
    hit = emit & (ck == ack_of)
    span_hit = np.zeros(len(closer), dtype=bool)
    span_hit[span[hit]] = True
    acks = np.flatnonzero(commits_span)
    acks = acks[~span_hit[span[acks]]]
    commit[order[acks]] = bs[acks]
    outside = np.flatnonzero(is_o & (ck > lab))
    commit[order[outside]] = bs[outside]

    # 4. The states after: last_ack, and the open span at the end, if any.
    events_in_group = np.add.reduceat(event.astype(_I64), starts)
    last_span = span[ends] + event[ends]  # the span after each group's last frame
    opener = is_c & ~forced & (ck > lab) & (span == last_span[g])
    final_begin = np.where(events_in_group == 0, init_begin, -1).astype(_I64)
    need = final_begin < 0
    op_rows = np.flatnonzero(opener)
    if len(op_rows):
        og, first_at = np.unique(g[op_rows], return_index=True)
        fb = bs[op_rows[first_at]]
        sel = need[og]
        final_begin[og[sel]] = fb[sel]
    return commit, states.merged(gp, final_last, final_begin)
