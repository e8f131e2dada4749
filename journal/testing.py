"""Conformance checks that every ``JournalStore`` implementation passes.

Each check is a plain function taking a factory that returns a new, empty
store; it raises ``AssertionError`` on a violation. Run them all with
``run_conformance(factory)``, or one test per check with pytest::

    import pytest
    from journal import MemoryJournalClient
    from journal.testing import CONFORMANCE_CHECKS

    @pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
    def test_conformance(check):
        check(MemoryJournalClient)

The checks rely only on the ``JournalStore`` protocol. Retention checks
assume the store can remove data ending at an append boundary at or before a
requested offset once enough data follows it (a ``LocalJournalStore`` with a
small ``fragment_size`` does).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Final

from ._errors import (
    AppendTooLargeError,
    InvalidJournalNameError,
    InvalidLabelError,
    JournalClosedError,
    JournalError,
    JournalExistsError,
    JournalNotFoundError,
    LabelSelectorError,
    OffsetNotYetAvailableError,
)
from ._interfaces import JournalReader, JournalStore
from ._labels import parse_label_selector
from ._spec import AppendResult, JournalSpec

StoreFactory = Callable[[], JournalStore]

_NDJSON: Final = {"content-type": "application/x-ndjson"}
# Generous: shared CI machines stall; latency itself is tested elsewhere.
_PROMPT: Final = 2.0


def _eq(got: object, want: object, what: str) -> None:
    if got != want:
        raise AssertionError(f"{what}: got {got!r}, want {want!r}")


def _true(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


@contextmanager
def _raises(exc: type[BaseException], what: str) -> Iterator[None]:
    try:
        yield
    except exc:
        return
    raise AssertionError(f"{what}: {exc.__name__} not raised")


@contextmanager
def _store(factory: StoreFactory) -> Iterator[JournalStore]:
    store = factory()
    try:
        yield store
    finally:
        store.close()


def _read_all(store: JournalStore, name: str, offset: int = 0) -> bytes:
    with store.read(name, offset) as r:
        return r.read()


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


# The checks ----------------------------------------------------------------


def check_create_get_list(factory: StoreFactory) -> None:
    """create returns the spec, get and list find it, re-create with the same labels is a no-op."""
    with _store(factory) as store:
        spec = store.create("examples/a-1", _NDJSON)
        _eq(spec, JournalSpec("examples/a-1", _NDJSON), "created spec")
        _eq(spec.content_type, "application/x-ndjson", "content_type")
        _eq(store.get("examples/a-1"), spec, "get")
        _eq(store.create("examples/a-1", dict(_NDJSON)), spec, "idempotent create")
        _eq(store.list(), [spec], "list")
        _eq(store.head("examples/a-1"), 0, "head of a new journal")


def check_create_conflicts_and_bad_names(factory: StoreFactory) -> None:
    """Conflicting create, bad names and unknown journals raise their errors, changing nothing."""
    with _store(factory) as store:
        store.create("examples/b", _NDJSON)
        with _raises(JournalExistsError, "create with other labels"):
            store.create("examples/b", {"content-type": "text/csv"})
        _eq(store.get("examples/b").content_type, "application/x-ndjson", "labels unchanged")
        for bad in ("/lead", "trail/", "a//b", "a/./b", "a/../b", "sp ace", "semi;colon", ""):
            with _raises(InvalidJournalNameError, f"create({bad!r})"):
                store.create(bad, _NDJSON)
            with _raises(ValueError, f"create({bad!r}) as ValueError"):
                store.create(bad, _NDJSON)
        with _raises(InvalidLabelError, "create with two content-types"):
            store.create("examples/two", {"content-type": ["text/csv", "application/x-ndjson"]})
        # Any media type, as Gazette's brokers take it (no framing need read
        # it where the journal is created); none: raw bytes.
        for ct in ("../../x", "text/", "a/b/c"):
            with _raises(InvalidLabelError, f"create with content-type {ct!r}"):
                store.create(f"examples/ct-{len(ct)}", {"content-type": ct})
        for ct in ("application/json", "TEXT/CSV", "x-raw"):
            name = f"examples/ct-{len(ct)}"
            _eq(store.create(name, {"content-type": ct}).content_type, ct,
                f"create with content-type {ct!r}")
            _eq(store.get(name).content_type, ct, f"get of a journal of content-type {ct!r}")
            store.delete(name)
        store.create("examples/raw", {"kind": "bytes"})
        store.delete("examples/raw")
        _eq([s.name for s in store.list()], ["examples/b"], "nothing created by bad calls")
        with _raises(JournalNotFoundError, "get of an unknown journal"):
            store.get("examples/none")
        with _raises(JournalNotFoundError, "append to an unknown journal"):
            store.append("examples/none", b"x")
        with _raises(JournalNotFoundError, "read of an unknown journal"):
            store.read("examples/none")
        with _raises(JournalNotFoundError, "head of an unknown journal"):
            store.head("examples/none")


def check_list_selectors(factory: StoreFactory) -> None:
    """list() applies label selectors, including the name and prefix meta-labels."""
    with _store(factory) as store:
        store.create("topic/one/part-0", {"content-type": "text/csv", "topic": "one"})
        store.create("topic/one/part-1", {"content-type": "text/csv", "topic": "one"})
        store.create("topic/two/part-0", {**_NDJSON, "topic": "two", "tag": ["x", "y"]})

        def names(selector: str) -> list[str]:
            return [s.name for s in store.list(selector)]

        everything = ["topic/one/part-0", "topic/one/part-1", "topic/two/part-0"]
        _eq(names(""), everything, "empty selector")
        _eq(names("topic=one"), everything[:2], "equality")
        _eq(names("topic!=one"), everything[2:], "inequality")
        _eq(names("tag"), everything[2:], "existence")
        _eq(names("!tag"), everything[:2], "non-existence")
        _eq(names("tag in (y, z)"), everything[2:], "set membership")
        _eq(names("topic notin (two)"), everything[:2], "set exclusion")
        _eq(names("content-type=text/csv, topic=two"), [], "conjunction")
        _eq(names("name=topic/one/part-1"), ["topic/one/part-1"], "name meta-label")
        _eq(names("prefix=topic/two/"), everything[2:], "prefix meta-label")
        _eq(names("name:prefix=topic/o"), everything[:2], "name prefix match")
        sel = parse_label_selector("topic=one")
        _eq([s.name for s in store.list(sel)], everything[:2], "LabelSelector argument")
        with _raises(LabelSelectorError, "malformed selector"):
            store.list("topic in (one")


def check_append_and_read(factory: StoreFactory) -> None:
    """Appends are contiguous and resolve to their offsets; reads honour offset and end_offset."""
    with _store(factory) as store:
        store.create("j/rw", _NDJSON)
        parts = [b"alpha\n", b"", b"beta\n", b"gamma-gamma\n"]
        futures = [store.append("j/rw", p) for p in parts]
        _true(all(isinstance(f, Future) for f in futures), "append returns Futures")
        results = [f.result(timeout=10) for f in futures]
        pos = 0
        for part, res in zip(parts, results, strict=True):
            _eq(res, AppendResult("j/rw", pos, pos + len(part)), "append result")
            pos += len(part)
        content = b"".join(parts)
        _eq(store.head("j/rw"), len(content), "head")
        _eq(_read_all(store, "j/rw"), content, "whole content")
        _eq(_read_all(store, "j/rw", 6), content[6:], "read from an offset")
        with store.read("j/rw", 6, 8) as r:
            _eq(r.read(), content[6:8], "bounded read")
            _eq(r.offset, 8, "offset at end_offset")
            _eq(r.read(), b"", "b'' at end_offset")
        with store.read("j/rw", len(content)) as r:
            _eq(r.read(), b"", "read at the head")
        with store.read("j/rw", -1) as r:
            _eq(r.offset, len(content), "offset -1 means the head")
        with _raises(OffsetNotYetAvailableError, "non-blocking read past the head"):
            store.read("j/rw", len(content) + 1)
        with _raises(ValueError, "end_offset before offset"):
            store.read("j/rw", 5, 4)


def check_reader_stream_contract(factory: StoreFactory) -> None:
    """read(n) gives 1..n bytes, b'' only at the end; offset, readinto, read1, buffering agree."""
    with _store(factory) as store:
        store.create("j/stream", _NDJSON)
        data = bytes(range(256)) * 8
        for i in range(0, len(data), 100):
            store.append("j/stream", data[i : i + 100])
        store.flush(timeout=10)
        with store.read("j/stream") as r:
            _true(isinstance(r, JournalReader), "reader satisfies JournalReader")
            _true(isinstance(r, io.IOBase) and r.readable(), "reader is a readable io stream")
            got = bytearray()
            while True:
                _eq(r.offset, len(got), "offset tracks bytes returned")
                chunk = r.read(37)
                if not chunk:
                    break
                _true(1 <= len(chunk) <= 37, f"read(37) returned {len(chunk)} bytes")
                got += chunk
            _eq(bytes(got), data, "content read in pieces")
            _eq(r.read(), b"", "b'' again at the end")
        with store.read("j/stream", 10) as r:
            buf = bytearray(50)
            n = r.readinto(buf)
            _true(1 <= n <= 50, "readinto count")
            _eq(bytes(buf[:n]), data[10 : 10 + n], "readinto content")
            one = r.read1(5)
            _eq(one, data[10 + n : 10 + n + len(one)], "read1 content")
        raw = store.read("j/stream", 3)
        with io.BufferedReader(raw) as buffered:  # type: ignore[type-var]
            _eq(buffered.read(10), data[3:13], "buffered read")
            _eq(buffered.tell(), 13, "buffered tell is the journal offset")
        _true(raw.closed, "closing the wrapper closes the reader")
        with _raises(ValueError, "read after close"):
            raw.read(1)
        raw.close()  # Idempotent.


def check_blocking_follow(factory: StoreFactory) -> None:
    """A block=True reader waits for appends, stops at end_offset, and close() releases it."""
    with _store(factory) as store:
        store.create("j/follow", _NDJSON)
        store.append("j/follow", b"first\n").result(timeout=10)
        got: list[bytes] = []
        with store.read("j/follow", 0, 18, block=True) as r:

            def consume() -> None:
                while chunk := r.read(100):
                    got.append(chunk)

            t = threading.Thread(target=consume)
            t.start()
            time.sleep(0.05)
            store.append("j/follow", b"second\n")
            store.append("j/follow", b"third\n")
            t.join(_PROMPT * 5)
            _true(not t.is_alive(), "blocking reader returned at end_offset")
        _eq(b"".join(got), b"first\nsecond\nthird\n"[:18], "followed content")

        r = store.read("j/follow", -1, block=True)
        out: list[bytes] = []
        t = threading.Thread(target=lambda: out.append(r.read(10)))
        t.start()
        time.sleep(0.05)
        _true(t.is_alive(), "blocking read waits at the head")
        r.close()
        t.join(_PROMPT)
        _true(not t.is_alive(), "close() releases a blocked read")
        _eq(out, [b""], "a released read returns b''")


def check_blocking_read_released_by_client_close(factory: StoreFactory) -> None:
    """Closing the client makes blocked reads return b''."""
    store = factory()
    try:
        store.create("j/shut", _NDJSON)
        r = store.read("j/shut", 0, block=True)
        out: list[bytes] = []
        t = threading.Thread(target=lambda: out.append(r.read(10)))
        t.start()
        time.sleep(0.05)
    finally:
        store.close()
    t.join(_PROMPT)
    _true(not t.is_alive(), "client close releases a blocked read")
    _eq(out, [b""], "released read returns b''")
    r.close()


def check_concurrent_appends_are_whole(factory: StoreFactory) -> None:
    """Appends from many threads never interleave, and each lands where its result says."""
    with _store(factory) as store:
        store.create("j/threads", _NDJSON)
        results: dict[bytes, AppendResult] = {}
        lock = threading.Lock()

        def writer(k: int) -> None:
            futs = []
            for i in range(50):
                payload = f"{k:02d}:{i:03d}:".encode() + b"x" * ((k * 7 + i) % 40) + b"\n"
                futs.append((payload, store.append("j/threads", payload)))
            for payload, fut in futs:
                res = fut.result(timeout=30)
                with lock:
                    results[payload] = res
            # Each thread's appends land in call order.
            begins = [f.result().begin for _, f in futs]
            _eq(begins, sorted(begins), f"thread {k} append order")

        threads = [threading.Thread(target=writer, args=(k,)) for k in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        content = _read_all(store, "j/threads")
        _eq(len(results), 300, "every append resolved")
        _eq(sum(len(p) for p in results), len(content), "no byte lost or added")
        for payload, res in results.items():
            _eq(content[res.begin : res.end], payload, "bytes at the append's offsets")


def check_append_too_large(factory: StoreFactory) -> None:
    """An append over the maximum raises AppendTooLargeError (a ValueError) and changes nothing."""
    with _store(factory) as store:
        store.create("j/big", _NDJSON)
        store.append("j/big", b"ok\n").result(timeout=10)
        limit = getattr(store, "max_append_size", None)
        _true(isinstance(limit, int), "store exposes max_append_size")
        assert isinstance(limit, int)
        with _raises(AppendTooLargeError, "append over the maximum"):
            store.append("j/big", b"x" * (limit + 1))
        store.flush(timeout=10)
        _eq(store.head("j/big"), 3, "head unchanged")


def check_flush_and_close(factory: StoreFactory) -> None:
    """flush() waits for every issued append; after close() appends raise JournalClosedError."""
    store = factory()
    with store:
        store.create("j/close", _NDJSON)
        futs = [store.append("j/close", b"%d\n" % i) for i in range(200)]
        store.flush(timeout=30)
        _true(all(f.done() and f.exception() is None for f in futs), "flush resolved all")
    with _raises(JournalClosedError, "append after close"):
        store.append("j/close", b"late\n")
    store.close()  # Idempotent.


def check_delete(factory: StoreFactory) -> None:
    """delete() removes the journal: get/append raise JournalNotFoundError; the name is reusable."""
    with _store(factory) as store:
        store.create("j/del", _NDJSON)
        store.append("j/del", b"gone\n").result(timeout=10)
        store.delete("j/del")
        with _raises(JournalNotFoundError, "get after delete"):
            store.get("j/del")
        with _raises(JournalNotFoundError, "append after delete"):
            store.append("j/del", b"x").result(timeout=10)
        with _raises(JournalNotFoundError, "delete twice"):
            store.delete("j/del")
        store.create("j/del", {"content-type": "text/csv"})
        _eq(store.head("j/del"), 0, "re-created journal is empty")
        store.append("j/del", b"new\n").result(timeout=10)
        _eq(_read_all(store, "j/del"), b"new\n", "re-created journal content")


def check_reader_of_deleted_journal(factory: StoreFactory) -> None:
    """Readers of a deleted journal, blocked or not, end with JournalNotFoundError."""
    with _store(factory) as store:
        store.create("j/gone", _NDJSON)
        store.append("j/gone", b"abc\n").result(timeout=10)
        follower = store.read("j/gone", 4, block=True)
        errors: list[BaseException] = []

        def follow() -> None:
            try:
                follower.read(10)
            except JournalNotFoundError as err:
                errors.append(err)

        t = threading.Thread(target=follow)
        t.start()
        time.sleep(0.05)
        with store.read("j/gone") as r:
            store.delete("j/gone")
            with _raises(JournalNotFoundError, "reading a deleted journal"):
                for _ in range(10):  # Bytes it already held may come first.
                    r.read(1)
        t.join(_PROMPT)
        _true(not t.is_alive(), "a blocked reader notices the deletion")
        _eq(len(errors), 1, "the blocked reader raised JournalNotFoundError")
        follower.close()


def check_trim_before_offset(factory: StoreFactory) -> None:
    """trim(before_offset=) drops whole pieces; readers of removed bytes jump ahead and log."""
    with _store(factory) as store:
        store.create("j/trim", _NDJSON)
        records = [b"%031d\n" % i for i in range(64)]  # 32 bytes each
        for rec in records:
            store.append("j/trim", rec)
        store.flush(timeout=10)
        content = b"".join(records)
        first = store.trim("j/trim", before_offset=1000)
        _true(0 < first <= 1000, f"first readable offset {first} within (0, 1000]")
        _eq(first % 32, 0, "removal ends on an append boundary")
        capture = _Capture()
        logger = logging.getLogger("journal")
        logger.addHandler(capture)
        try:
            with store.read("j/trim", 0) as r:
                chunk = r.read(1)
                _eq(r.offset, first + 1, "offset shows the jump")
                rest = chunk + r.read()
        finally:
            logger.removeHandler(capture)
        _eq(rest, content[first:], "content after the jump")
        _true(bool(capture.messages), "a warning was logged on logger 'journal'")
        _eq(store.head("j/trim"), len(content), "head unchanged by trim")
        _eq(store.trim("j/trim", older_than=3600), first, "nothing is an hour old")


def check_trim_older_than(factory: StoreFactory) -> None:
    """trim(older_than=) drops pieces last written longer ago than the age."""
    with _store(factory) as store:
        store.create("j/age", _NDJSON)
        for i in range(64):
            store.append("j/age", b"%031d\n" % i)
        store.flush(timeout=10)
        time.sleep(0.05)
        first = store.trim("j/age", older_than=0.01)
        _true(0 < first <= 64 * 32, "old pieces removed")
        with _raises(ValueError, "trim without a criterion"):
            store.trim("j/age")


def check_offset_since(factory: StoreFactory) -> None:
    """offset_since(t) is an offset from which a replay sees every append made since t."""
    with _store(factory) as store:
        store.create("j/since", _NDJSON)
        for i in range(20):
            store.append("j/since", b"%031d\n" % i)
        store.flush(timeout=10)
        time.sleep(0.05)
        when = time.time()
        time.sleep(0.05)
        late = store.append("j/since", b"late\n").result(timeout=10)
        start = store.offset_since("j/since", when)
        _true(start <= late.begin, "the replay includes the late append")
        _eq(store.offset_since("j/since", 0), 0, "everything is since the epoch")
        _eq(store.offset_since("j/since", time.time() + 60), late.end, "nothing from the future")


def check_errors_are_journal_errors(factory: StoreFactory) -> None:
    """Every error the store raises on purpose is a JournalError."""
    with _store(factory) as store:
        for call in (
            lambda: store.get("nope"),
            lambda: store.create("bad name", _NDJSON),
            lambda: store.list("!!"),
        ):
            with _raises(JournalError, "JournalError base"):
                call()


#: Every conformance check, in a stable order.
CONFORMANCE_CHECKS: Final[tuple[Callable[[StoreFactory], None], ...]] = (
    check_create_get_list,
    check_create_conflicts_and_bad_names,
    check_list_selectors,
    check_append_and_read,
    check_reader_stream_contract,
    check_blocking_follow,
    check_blocking_read_released_by_client_close,
    check_concurrent_appends_are_whole,
    check_append_too_large,
    check_flush_and_close,
    check_delete,
    check_reader_of_deleted_journal,
    check_trim_before_offset,
    check_trim_older_than,
    check_offset_since,
    check_errors_are_journal_errors,
)


#: The checks of ``trim``. They assume that a store can remove any whole
#: piece at once, right after its appends resolved (a ``LocalJournalStore``
#: with a small ``fragment_size`` can). A Gazette cluster cannot: its
#: fragments hold at least 1 KiB, are persisted to the fragment store
#: asynchronously, and only persisted ones can be pruned; its retention is
#: tested on its own terms instead.
RETENTION_CHECKS: Final[tuple[Callable[[StoreFactory], None], ...]] = (
    check_trim_before_offset,
    check_trim_older_than,
)


def run_conformance(factory: StoreFactory, *, retention: bool = True) -> None:
    """Run every check against stores made by ``factory`` (without
    ``RETENTION_CHECKS`` when ``retention`` is False)."""
    for check in CONFORMANCE_CHECKS:
        if retention or check not in RETENTION_CHECKS:
            check(factory)
