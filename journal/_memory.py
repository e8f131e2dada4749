"""``MemoryJournalClient``: journals in memory, for users' tests.

Same semantics as ``LocalJournalStore`` (ordering, bounds, blocking reads,
retention, errors) but nothing is written anywhere: an append is "durable"
as soon as it is applied, so its future is already resolved when returned.
Each append is kept as one piece; retention removes whole pieces.
"""

from __future__ import annotations

import bisect
import builtins
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final, NoReturn, final

from ._closing import Closing
from ._errors import (
    AppendTooLargeError,
    JournalClosedError,
    JournalError,
    JournalExistsError,
    JournalNotFoundError,
)
from ._labels import LabelSelector, LabelSet, LabelsInit, parse_label_selector
from ._reader import JUMPED, ReaderBase, warn_jump
from ._spec import AppendResult, JournalSpec
from ._util import age_seconds, check_read_args

#: Default bound on one append, as for the local store.
DEFAULT_MAX_APPEND_SIZE: Final = 16 << 20


@dataclass(slots=True)
class _MemJournal:
    spec: JournalSpec
    cond: threading.Condition
    # Parallel lists, one entry per append: its begin offset, bytes, and time.
    begins: list[int] = field(default_factory=list)
    chunks: list[bytes] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    head: int = 0
    gen: int = 0
    deleted: bool = False


@final
class MemoryJournalClient(Closing):
    """An in-memory ``JournalStore``. Thread-safe; not shared between processes."""

    def __init__(self, *, max_append_size: int = DEFAULT_MAX_APPEND_SIZE) -> None:
        if max_append_size < 1:
            raise ValueError(f"max_append_size must be positive ({max_append_size})")
        self.max_append_size = max_append_size
        self._lock = threading.Lock()
        self._journals: dict[str, _MemJournal] = {}
        self._closed = False

    # Administration ------------------------------------------------------

    def create(self, name: str, labels: LabelSet | LabelsInit | None = None) -> JournalSpec:
        spec = JournalSpec(name, labels)
        spec.validate()
        with self._lock:
            self._check_open()
            j = self._journals.get(name)
            if j is not None:
                if j.spec.labels != spec.labels:
                    raise JournalExistsError(name, j.spec.labels.to_dict())
                return j.spec
            self._journals[name] = _MemJournal(spec, threading.Condition())
            return spec

    def delete(self, name: str) -> None:
        with self._lock:
            j = self._journals.pop(name, None)
        if j is None:
            raise JournalNotFoundError(name)
        with j.cond:
            j.deleted = True
            j.gen += 1
            j.cond.notify_all()

    def get(self, name: str) -> JournalSpec:
        return self._journal(name).spec

    def list(self, selector: str | LabelSelector = "") -> builtins.list[JournalSpec]:
        sel = parse_label_selector(selector)
        with self._lock:
            specs = [j.spec for j in self._journals.values()]
        return sorted((s for s in specs if sel.matches(s)), key=lambda s: s.name)

    def head(self, name: str) -> int:
        j = self._journal(name)
        with j.cond:
            return j.head

    def offset_since(self, name: str, when: float | datetime) -> int:
        """The begin of the first append made at or after ``when``, else the head."""
        cutoff = when.timestamp() if isinstance(when, datetime) else float(when)
        j = self._journal(name)
        with j.cond:
            i = bisect.bisect_left(j.times, cutoff)
            return j.begins[i] if i < len(j.begins) else j.head

    def trim(
        self,
        name: str,
        *,
        before_offset: int | None = None,
        older_than: float | timedelta | None = None,
    ) -> int:
        j = self._journal(name)
        age = age_seconds(before_offset, older_than)
        cutoff = time.time() - age if age is not None else None
        with j.cond:
            n = 0
            while n < len(j.begins):
                end = j.begins[n] + len(j.chunks[n])
                if before_offset is not None and end > before_offset:
                    break
                if cutoff is not None and j.times[n] >= cutoff:
                    break
                n += 1
            del j.begins[:n], j.chunks[:n], j.times[:n]
            return j.begins[0] if j.begins else j.head

    # JournalClient -------------------------------------------------------

    def append(self, name: str, data: bytes | bytearray | memoryview) -> Future[AppendResult]:
        data = bytes(data)
        if len(data) > self.max_append_size:
            raise AppendTooLargeError(name, len(data), self.max_append_size)
        j = self._journal(name)
        fut: Future[AppendResult] = Future()
        with j.cond:
            self._check_open()
            begin = j.head
            if data:
                j.begins.append(begin)
                j.chunks.append(data)
                j.times.append(time.time())
                j.head += len(data)
                j.gen += 1
                j.cond.notify_all()
        fut.set_result(AppendResult(name, begin, begin + len(data)))
        return fut

    def read(
        self, name: str, offset: int = 0, end_offset: int | None = None, *, block: bool = False
    ) -> MemoryJournalReader:
        j = self._journal(name)
        with j.cond:
            head = j.head
        offset = check_read_args(name, offset, end_offset, block, head)
        return MemoryJournalReader(self, j, offset, end_offset, block)

    def emit(self, name: str, data: bytes | bytearray | memoryview) -> int:
        """Transient messages are the embedded store's (``LocalJournalStore.emit``)."""
        raise JournalError(
            f"cannot emit to {name!r}: MemoryJournalClient has no transient messages"
            " (LocalJournalStore has)"
        )

    def listen(self, name: str) -> NoReturn:
        """Transient messages are the embedded store's (``LocalJournalStore.listen``)."""
        raise JournalError(
            f"cannot listen to {name!r}: MemoryJournalClient has no transient messages"
            " (LocalJournalStore has)"
        )

    def flush(self, timeout: float | None = None) -> None:
        """Nothing to wait for: appends are applied when made."""

    def close(self) -> None:
        with self._lock:
            self._closed = True
            journals = builtins.list(self._journals.values())
        for j in journals:
            with j.cond:
                j.gen += 1
                j.cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed


    def _journal(self, name: str) -> _MemJournal:
        with self._lock:
            j = self._journals.get(name)
        if j is None:
            raise JournalNotFoundError(name)
        return j

    def _check_open(self) -> None:
        if self._closed:
            raise JournalClosedError("MemoryJournalClient")


@final
class MemoryJournalReader(ReaderBase):
    """A reader of a ``MemoryJournalClient`` journal."""

    def __init__(
        self,
        client: MemoryJournalClient,
        j: _MemJournal,
        offset: int,
        end_offset: int | None,
        block: bool,
    ) -> None:
        super().__init__(j.spec.name, offset, end_offset, block)
        self._client = client
        self._j = j

    def _fill(self, buf: memoryview) -> int:
        j = self._j
        with j.cond:
            if j.deleted:
                raise JournalNotFoundError(j.spec.name)
            off = self._offset
            if off >= j.head:
                return 0
            i = bisect.bisect_right(j.begins, off) - 1
            if i < 0:
                # Everything before the first kept piece was trimmed.
                first = j.begins[0] if j.begins else j.head
                warn_jump(j.spec.name, off, first)
                self._offset = first
                return JUMPED
            chunk = j.chunks[i]
            start = off - j.begins[i]
            n = min(len(buf), len(chunk) - start)
            buf[:n] = chunk[start : start + n]
            return n

    def _token(self) -> int:
        with self._j.cond:
            return self._j.gen

    def _wait(self, token: int) -> bool:
        j = self._j
        with j.cond:
            if self._client.closed or self._closing:
                return False
            if j.gen == token and not j.deleted:
                j.cond.wait()
            # A deleted journal: go on so that the next _fill raises.
            return not self._client.closed

    def _head(self) -> int:
        with self._j.cond:
            return self._j.head

    def _wake(self) -> None:
        with self._j.cond:
            self._j.cond.notify_all()
