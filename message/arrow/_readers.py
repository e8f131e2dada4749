"""The readers: ReadCommittedArrow and ReadUncommittedArrow."""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from journal import Closing, CorruptJournalError, JournalClient

from .._checkpoint import Checkpoint
from .._columns_sequencer import ProducerColumns, sequence_columns
from .._envelope import ProducerState
from .._sequencer import horizon_units
from .._types import DEFAULT_UUID_PATH, uuid_path_of
from ..layout import (
    ACK_TXN,
    clocks_of,
    flags_of,
)
from ._content import BATCH_BYTES, ArrowContent, _head, _proto_fields, infer_content_fields
from ._source import _Source
from ._windows import _MASK48, _one_chunk, _span_rows, _take, _Window, bucket_of, envelope_columns

if TYPE_CHECKING:
    Array = np.ndarray[Any, Any]
else:
    Array = Any

log = logging.getLogger("message")




# -- the readers ------------------------------------------------------------------


class _ArrowReader(Closing):
    """What both readers share: the journals, the content, the windows."""

    committed = True

    def __init__(
        self,
        client: JournalClient,
        journal: str | Sequence[str] | None = None,
        *,
        selector: str | None = None,
        schema: pa.Schema | Sequence[tuple[str, pa.DataType]] | None = None,
        content: ArrowContent | None = None,
        uuid_path: str = "/".join(DEFAULT_UUID_PATH),
        proto_class: Any = None,
        uuid_field: str = "uuid",
        offset: int = 0,
        end_offset: int | Mapping[str, int] | None = None,
        checkpoint: Checkpoint | None = None,
        include_acks: bool = False,
        skip_corrupt: bool = False,
        on_skip: Callable[[Exception], None] | None = None,
        batch_bytes: int = BATCH_BYTES,
        bucket: int = 0,
        buckets: int = 1,
    ) -> None:
        if (journal is None) == (selector is None):
            raise ValueError("name a journal (or journals) or give a selector, not both")
        if buckets < 1 or not 0 <= bucket < buckets:
            raise ValueError(f"bucket must be in [0, {buckets})")
        self.client = client
        if selector is not None:
            self.specs = sorted(client.list(selector), key=lambda s: s.name)
        else:
            names = [journal] if isinstance(journal, str) else list(journal or ())
            self.specs = [client.get(n) for n in names]
        if content is None:
            path = uuid_path_of(uuid_path)
            if schema is None:
                if proto_class is not None:
                    fields = _proto_fields(proto_class, uuid_field)
                else:
                    fields = infer_content_fields(client, self.specs, path)
            else:
                fields = [(f.name, f.type) if isinstance(f, pa.Field) else (f[0], f[1])
                          for f in schema]
            content = ArrowContent(tuple(fields), path, proto_class, uuid_field)
        self.content = content
        #: The schema of every batch: the envelope columns, then the content's.
        self.schema: pa.Schema = content.schema()
        self.include_acks = include_acks or not self.committed
        self.skip_corrupt = skip_corrupt
        self.on_skip = on_skip
        self.batch_bytes = max(1, batch_bytes)
        self.bucket, self.buckets = bucket, buckets
        #: Corrupt frames skipped (with ``skip_corrupt=True``).
        self.skipped_frames = 0
        #: Offsets ``[begin, end)`` of damaged pieces of journals skipped.
        self.skipped_ranges: list[tuple[int, int]] = []
        # Where each journal starts and ends, and its producers' states.
        self._offsets: dict[str, int] = {}
        self._states: dict[str, ProducerColumns] = {}
        self._base_offsets: dict[str, int] = {}
        by_journal: dict[str, list[tuple[int, int, int]]] = {}
        if checkpoint is not None:
            self._base_offsets = dict(checkpoint.offsets)
            for s in checkpoint.states:
                by_journal.setdefault(s.journal, []).append(
                    (int.from_bytes(s.producer, "big"), s.last_ack, s.begin)
                )
        self._ends: dict[str, int] = {}
        for spec in self.specs:
            name = spec.name
            self._offsets[name] = (
                checkpoint.offsets.get(name, offset) if checkpoint is not None else offset
            )
            self._states[name] = ProducerColumns.of(by_journal.get(name, []))
            if isinstance(end_offset, Mapping):
                self._ends[name] = int(end_offset.get(name, _head(client, name)))
            elif end_offset is not None:
                self._ends[name] = int(end_offset)
            else:
                self._ends[name] = _head(client, name)
        # Per journal, the frames read so far of the spans open in its
        # states that began at or after an offset (see _keep_open): a replay
        # of those spans is taken from memory, not read and parsed again.
        self._open: dict[str, tuple[int, _Window | None]] = {}
        self._gen = self._generate()

    @property
    def skipped(self) -> int:
        """Corrupt frames and damaged pieces skipped (with ``skip_corrupt=True``)."""
        return self.skipped_frames + len(self.skipped_ranges)

    def damaged(self, exc: CorruptJournalError, begin: int, end: int) -> None:
        """Told that a journal's bytes ``[begin, end)`` are damaged and skipped."""
        self.skipped_ranges.append((begin, end))
        if self.on_skip is not None:
            self.on_skip(exc)
        else:
            log.warning("skipped damaged bytes of %s at offsets [%d, %d): %s",
                        exc.journal, begin, end, exc.reason)

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        return self._gen

    def __next__(self) -> pa.RecordBatch:
        return next(self._gen)

    def read_all(self) -> pa.Table:
        """Every remaining batch, as one table."""
        return pa.Table.from_batches(list(self._gen), schema=self.schema)

    def close(self) -> None:
        """Stop reading."""
        self._gen.close()


    def _generate(self) -> Generator[pa.RecordBatch, None, None]:
        for spec in self.specs:
            name = spec.name
            source = _Source(self, spec)
            start, stop = self._offsets[name], self._ends[name]
            if start >= stop:
                continue
            # Spans open in the states from before `start` are not in memory
            # (a span's begin is below the offset its checkpoint resumes at).
            _, open_b = self._states[name].open_spans()
            self._open[name] = (max(start, int(open_b.max()) + 1 if len(open_b) else 0), None)
            for w in source.windows(start, stop):
                batch = self._batch(source, w)
                self._offsets[name] = w.stop
                if batch is not None and batch.num_rows:
                    yield batch
                if w.error is not None:
                    raise w.error
            self._offsets[name] = max(self._offsets[name], stop)

    def _batch(self, source: _Source, w: _Window) -> pa.RecordBatch | None:
        name = source.spec.name
        if self.buckets > 1 and len(w):
            mine = bucket_of(w.lo & _MASK48, self.buckets) == self.bucket
            if not mine.all():  # (a window parsed in bulk holds only the bucket's rows)
                w = w.take(np.flatnonzero(mine))
        if not len(w):
            return None
        producers = w.lo & _MASK48
        clocks = clocks_of(w.hi, w.lo)
        flags = flags_of(w.lo)
        if not self.committed:
            commit = w.begin
            rows = np.arange(len(w))
        else:
            replay = self._replay(source, w, producers, clocks, flags)
            replayed = None
            window = w
            if replay is not None and len(replay):
                w = _Window.concat([replay, w], source.content_schema)
                producers = np.concatenate([replay.lo & _MASK48, producers])
                clocks = np.concatenate([clocks_of(replay.hi, replay.lo), clocks])
                flags = np.concatenate([flags_of(replay.lo), flags])
                replayed = np.zeros(len(w), dtype=bool)
                replayed[: len(replay)] = True
            commit, self._states[name] = sequence_columns(
                w.begin, producers, clocks, flags, self._states[name], replayed
            )
            self._keep_open(source, window)
            keep = commit >= 0
            if not self.include_acks:
                keep &= flags != ACK_TXN
            rows = np.flatnonzero(keep)
            # Commit order: rows are in offset order, and mostly commit themselves.
            rows = rows[np.argsort(commit[rows], kind="stable")]
        if not len(rows):
            return None
        cols = envelope_columns(name, _take(w.begin, rows), _take(w.end, rows), w.hi[rows],
                                w.lo[rows], _take(commit, rows))
        if self.content.fields:
            all_rows = len(rows) == len(w) and bool((rows[1:] > rows[:-1]).all())
            table = w.content if all_rows else w.content.take(pa.array(rows, pa.int64()))
            cols += [_one_chunk(table.column(i)) for i in range(table.num_columns)]
        return pa.RecordBatch.from_arrays(cols, schema=self.schema)

    def _replay(
        self, source: _Source, w: _Window, producers: Array, clocks: Array, flags: Array
    ) -> _Window | None:
        """The frames, before the window, of the spans open in the states that
        an ACK in the window may commit (what a Sequencer would replay)."""
        open_p, open_b = self._states[source.spec.name].open_spans()
        if not len(open_p):
            return None
        early = open_b < w.start
        # The open spans' producers (sorted) that have an ACK in the window.
        ack_p = producers[(flags == ACK_TXN) & (clocks != 0)]
        at = np.minimum(np.searchsorted(open_p, ack_p), len(open_p) - 1)
        acked = np.zeros(len(open_p), dtype=bool)
        acked[at[open_p[at] == ack_p]] = True
        want = early & acked
        if not want.any():
            return None
        want_p, want_b = open_p[want], open_b[want]
        kept_from, kept = self._open.get(source.spec.name, (0, None))
        if kept is not None and int(want_b.min()) >= kept_from:
            return kept.take(_span_rows(kept, want_p, want_b))
        parts = []
        for part in source.windows(int(want_b.min()), w.start, quiet=True):
            if part.error is not None:
                raise part.error
            rows = _span_rows(part, want_p, want_b)
            if len(rows):
                parts.append(part.take(rows))
        return _Window.concat(parts, source.content_schema)

    def _keep_open(self, source: _Source, w: _Window) -> None:
        """After window ``w``: keep the frames of the spans now open that
        began at or after the offset kept from (those kept before ``w`` and
        those of ``w``), as long as they are at most ``batch_bytes`` long;
        beyond that, forget them and keep from the end of ``w`` on (their
        replay reads the journal again)."""
        name = source.spec.name
        kept_from, kept = self._open.get(name, (w.start, None))
        open_p, open_b = self._states[name].open_spans()
        mine = open_b >= kept_from
        open_p, open_b = open_p[mine], open_b[mine]
        parts = []
        if len(open_p):
            for part in (kept, w):
                if part is not None and len(part):
                    rows = _span_rows(part, open_p, open_b)
                    if len(rows):
                        parts.append(part.take(rows))
        now = _Window.concat(parts, source.content_schema)
        if int((now.end - now.begin).sum()) > self.batch_bytes:
            self._open[name] = (w.stop, None)
        else:
            self._open[name] = (kept_from, now)

    def checkpoint(self, prune_horizon: float | datetime.timedelta = 0) -> Checkpoint:
        """Where to resume: per journal, the offset read through and its
        producers' states; valid between any two batches, and interchangeable
        with :meth:`message.ReadCommittedIter.checkpoint`'s. ``prune_horizon``
        forgets producers idle that long, relative to their journal's newest
        (as :meth:`Sequencer.producer_states`)."""
        units = horizon_units(prune_horizon)
        offsets = dict(self._base_offsets)
        states: list[ProducerState] = []
        for spec in self.specs:
            name = spec.name
            offsets[name] = self._offsets[name]
            cols = self._states[name]
            if units is not None:
                cols = self._states[name] = cols.pruned(units)
            states += [
                ProducerState(name, int(p).to_bytes(6, "big"), int(a), int(b))
                for p, a, b in zip(
                    cols.producers.tolist(), cols.last_ack.tolist(), cols.begin.tolist(),
                    strict=True,
                )
            ]
        return Checkpoint(offsets, states)


class ReadCommittedArrow(_ArrowReader):
    """Iterates the committed messages of a journal (or of several: a list
    of names, or ``selector``) as ``pyarrow.RecordBatch``es of
    :attr:`schema`: the rows :class:`message.ReadCommittedIter` would yield,
    journal after journal, each journal's in the same order, with its
    ACK_TXN messages left out unless ``include_acks``.

    Content: ``schema`` (a ``pyarrow.Schema`` or ``(name, type)`` pairs)
    names the content columns; without one, NDJSON fields (or CSV ones) are
    inferred (:func:`infer_content_fields`) and a fixed-protobuf ``proto_class`` gives
    all its scalar fields. ``uuid_path`` says where an NDJSON document keeps
    its UUID; ``content`` (an :class:`ArrowContent`) says all of it at once.

    Reading starts at ``offset`` (or where ``checkpoint`` says, from its
    producer states) and ends at ``end_offset`` (an offset, or one per
    journal), by default at each journal's end when the reader is made.
    :meth:`checkpoint` may be called between any two batches: a reader, or
    a ``ReadCommittedIter``, made with it yields exactly the committed
    messages not yet yielded. A corrupt frame raises its framing error with
    ``.journal`` and ``.offset`` once the batch before it is yielded; with
    ``skip_corrupt=True`` it is skipped and counted in :attr:`skipped`
    (``on_skip`` is told of each instead of the log). ``bucket`` of
    ``buckets`` reads only the producers whose hashed ProducerID falls in
    that bucket (the rest is another reader's: parallel reads of a journal);
    it parses every line's UUID, and the content of its own lines only.
    """


class ReadUncommittedArrow(_ArrowReader):
    """Iterates every frame of a journal (or journals) as
    ``pyarrow.RecordBatch``es, duplicates, transactions never committed and
    ACKs included, in offset order (``commit_offset`` is each row's own
    ``begin``). Takes the options of :class:`ReadCommittedArrow`."""

    committed = False
