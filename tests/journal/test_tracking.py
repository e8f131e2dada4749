"""PendingAppends and TrackingClient: a writer waits for its own appends and
sees its own failures, whoever else shares the client. The native scan and
recorder (journal/_native.c) are held to the Python definitions."""

from __future__ import annotations

import random
import threading
from concurrent.futures import CancelledError, Future
from pathlib import Path
from typing import Any

import pytest

import journal._tracking as tracking
from journal import JournalError, LocalJournalStore, MemoryJournalClient
from journal._future import AppendFuture
from journal._pending import NATIVE


@pytest.fixture(params=["native", "python"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Each test runs with the native scan and recorder, then the Python ones."""
    if request.param == "python":
        monkeypatch.setattr(tracking, "NATIVE", None)
        monkeypatch.setattr(tracking, "scan_futures", tracking.py_scan_futures)
    elif NATIVE is None:
        pytest.skip("the native core is not in use here")
    return str(request.param)


def _future(kind: str) -> Future[Any]:
    """A future in one of the states an append future can be in."""
    f: Future[Any] = AppendFuture() if not kind.startswith("plain") else Future()
    if kind.endswith("cond"):
        f.done()  # a plain Future; AppendFuture: makes no Condition ...
        _ = f._condition  # ... this does
    state = kind.split("-")[-2] if kind.endswith("cond") else kind.split("-")[-1]
    if state == "running":
        f.set_running_or_notify_cancel()
    elif state == "ok":
        f.set_running_or_notify_cancel()
        f.set_result(("j", 0, 1))
    elif state == "failed":
        f.set_running_or_notify_cancel()
        f.set_exception(JournalError(f"failed {id(f)}"))
    elif state == "cancelled":
        f.cancel()
    return f


KINDS = [f"{t}-{s}{c}" for t in ("append", "plain") for s in
         ("pending", "running", "ok", "failed", "cancelled") for c in ("", "-cond")]


def test_native_scan_agrees_with_the_definition() -> None:
    """scan_futures gives the first failure (list order) and the futures not
    done, natively as in py_scan_futures, for futures in every state."""
    if NATIVE is None:
        pytest.skip("the native core is not in use here")
    rng = random.Random(5)
    for _ in range(300):
        futures = [_future(rng.choice(KINDS)) for _ in range(rng.randint(0, 12))]
        want_error, want_pending = tracking.py_scan_futures(futures)
        got_error, got_pending = tracking.scan_futures(futures)
        assert got_pending == want_pending
        if isinstance(want_error, CancelledError):
            assert isinstance(got_error, CancelledError)
        else:
            assert got_error is want_error


def test_settle_waits_for_every_append_and_forgets_them(impl: str, tmp_path: Path) -> None:
    """settle() returns once every append through the client is durable."""
    with LocalJournalStore(tmp_path) as store:
        store.create("a", {"content-type": "application/x-ndjson"})
        tracked = tracking.TrackingClient(store)
        futures = [tracked.append("a", b'{"n": %d}\n' % i) for i in range(10_000)]
        tracked.pending.settle()
        assert all(f.done() and f.exception() is None for f in futures)
        assert not tracked.pending.outstanding
        assert store.head("a") == sum(len(b'{"n": %d}\n' % i) for i in range(10_000))


class _Controlled:
    """A client whose appends resolve when the test says so."""

    def __init__(self) -> None:
        self.futures: list[Future[Any]] = []

    def append(self, name: str, data: bytes) -> Future[Any]:
        f: Future[Any] = AppendFuture()
        f.set_running_or_notify_cancel()
        self.futures.append(f)
        return f


def test_a_failure_is_raised_even_if_pruned_long_before(impl: str) -> None:
    """Futures done without failure are dropped as they pile up; the first
    failure is kept and raised by settle(), then forgotten."""
    client = _Controlled()
    tracked = tracking.TrackingClient(client)  # type: ignore[arg-type]
    first = tracked.append("a", b"x")
    first.set_exception(JournalError("disk full"))
    for _ in range(3 * tracking.PRUNE_AT):
        tracked.append("a", b"x").set_result(("a", 0, 1))
    assert len(tracked.pending) < tracking.PRUNE_AT  # pruned
    with pytest.raises(JournalError, match="disk full"):
        tracked.pending.settle()
    assert not tracked.pending.outstanding
    tracked.pending.settle()  # raised once


def test_settle_times_out_and_keeps_the_appends(impl: str) -> None:
    """Past its timeout, settle() raises TimeoutError; a later one still waits."""
    client = _Controlled()
    tracked = tracking.TrackingClient(client)  # type: ignore[arg-type]
    f = tracked.append("a", b"x")
    with pytest.raises(TimeoutError):
        tracked.pending.settle(timeout=0.05)
    assert tracked.pending.outstanding
    threading.Timer(0.05, lambda: f.set_result(("a", 0, 1))).start()
    tracked.pending.settle(timeout=10)
    assert not tracked.pending.outstanding


def test_two_writers_on_one_client_see_their_own_failures(impl: str) -> None:
    """Each tracking view settles its own appends: one's failure is not the
    other's, and a client flush elsewhere takes nothing from either."""
    client = _Controlled()
    a = tracking.TrackingClient(client)  # type: ignore[arg-type]
    b = tracking.TrackingClient(client)  # type: ignore[arg-type]
    a.append("x", b"1").set_result(("x", 0, 1))
    b.append("x", b"2").set_exception(JournalError("b's append failed"))
    a.pending.settle()
    with pytest.raises(JournalError, match="b's"):
        b.pending.settle()


def test_tracking_client_is_a_journal_client(impl: str) -> None:
    """The rest of the JournalClient protocol is the client's; closing the
    view leaves the client open."""
    from journal import JournalClient

    client = MemoryJournalClient()
    client.create("a", {"content-type": "application/x-ndjson"})
    with tracking.TrackingClient(client) as tracked:
        assert isinstance(tracked, JournalClient)
        tracked.append("a", b"{}\n")
        tracked.flush()
        assert [s.name for s in tracked.list()] == ["a"] and tracked.get("a").name == "a"
        with tracked.read("a") as r:
            assert r.read() == b"{}\n"
    assert client.append("a", b"{}\n").result().begin == 3


def test_recorder_passes_any_arguments_through_and_keeps_each_future(impl: str) -> None:
    """A recorder wraps any callable that returns a future (a Publisher's
    publish_uncommitted(mapping, msg) too): arguments, keyword arguments and
    errors pass through as they are; each future returned is settled."""
    pending = tracking.PendingAppends()
    calls: list[tuple[Any, ...]] = []
    futures: list[Future[Any]] = []

    def publish(mapping: Any, msg: Any, *, flag: int = 0) -> Future[Any]:
        if msg == "bad":
            raise ValueError("bad message")
        calls.append((mapping, msg, flag))
        f: Future[Any] = Future()
        futures.append(f)
        return f

    record = pending.recorder(publish)
    assert record("m", 1) is futures[0]
    assert record("m", 2, flag=3) is futures[1]
    with pytest.raises(ValueError, match="bad message"):
        record("m", "bad")
    assert calls == [("m", 1, 0), ("m", 2, 3)]
    assert len(pending) == 2
    with pytest.raises(TimeoutError):
        pending.settle(timeout=0.05)  # neither is done: both are waited for
    futures[0].set_result(("j", 0, 1))
    futures[1].set_exception(JournalError("lost"))
    with pytest.raises(JournalError, match="lost"):
        pending.settle()
    assert len(pending) == 0


def test_a_closed_recorder_refuses_every_later_call(impl: str) -> None:
    """close(message): later calls raise RuntimeError(message) without
    calling what it records (the first message stays); the futures kept
    before are still settled."""
    pending = tracking.PendingAppends()
    calls: list[Any] = []

    def append(name: str, data: bytes) -> Future[Any]:
        calls.append((name, data))
        f: Future[Any] = Future()
        f.set_result((name, 0, len(data)))
        return f

    record = pending.recorder(append)
    assert not record.closed
    record("a", b"x")
    record.close("ended here")
    record.close("a second message is not kept")
    assert record.closed
    for _ in range(2):
        with pytest.raises(RuntimeError, match=r"^ended here$"):
            record("a", b"y")
    assert calls == [("a", b"x")]
    assert len(pending) == 1
    pending.settle()
