"""A property of the runtime: for any messy input, any transaction bounds and
any sequence of crashes at any point of a transaction, the committed output
and state are those of processing each committed input message once.

A crash is played in one process: at the chosen point the journal client
starts refusing every append (the process is gone: nothing more reaches the
journals, not even a roll-back) and the shard fails; a new Runner, with a
new client view, is the restarted process.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from consumer import JSONFileStore, Runner, Shard, ShardSpec, SQLiteStore, Store
from journal import AppendResult, JournalError, MemoryJournalClient
from message import Checkpoint, Envelope
from tests.consumer_support import (
    NDJSON,
    CountingApp,
    committed_by_key,
    committed_state,
    expected_output,
    expected_state,
    make_input,
    output_by_key,
)

SOURCES = ["in/part-0", "in/part-1"]
OUTPUTS = ["out/part-0", "out/part-1"]
POINTS = ("mid-consume", "before-commit", "after-commit", "between-acks")


class CrashError(Exception):
    """The process died here."""


class Process:
    """One life of the consumer process: a view of the journals that dies
    at the fault's point, and a store that plays the fault's commit-side
    points."""

    def __init__(self, journals: MemoryJournalClient, fault: tuple[str, int] | None) -> None:
        self.journals = journals
        self.point, self.at = fault or ("", -1)
        self.dead = False
        self.commits = 0
        self.messages = 0
        self.acks_left: int | None = None

    # the journal client of this life
    def append(self, name: str, data: bytes) -> Future[AppendResult]:
        if self.acks_left is not None:
            if self.acks_left == 0:
                self.die()
            self.acks_left -= 1
        if self.dead:
            raise JournalError("the process is dead")
        return self.journals.append(name, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.journals, name)

    def die(self) -> None:
        self.dead = True
        raise CrashError(f"{self.point} at {self.at}")

    def on_message(self, shard: Shard, env: Envelope) -> None:
        self.messages += 1
        if self.point == "mid-consume" and self.messages == self.at:
            self.die()

    def wrap(self, store: Any) -> Store:
        commit = store.start_commit

        def start_commit(shard: Shard, checkpoint: Checkpoint) -> None:
            self.commits += 1
            if self.point == "before-commit" and self.commits == self.at:
                self.die()
            commit(shard, checkpoint)
            if self.point == "after-commit" and self.commits == self.at:
                self.die()
            if self.point == "between-acks" and self.commits == self.at:
                self.acks_left = 1  # the first ACK is appended, not the second

        store.start_commit = start_commit
        return store  # type: ignore[no-any-return]


faults = st.lists(st.tuples(st.sampled_from(POINTS), st.integers(1, 6)), max_size=4)


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), count=st.integers(5, 120), faults=faults,
       max_txn=st.floats(0.0005, 0.03), min_share=st.floats(0, 1),
       sqlite=st.booleans())
def test_any_crashes_keep_exactly_once(
        tmp_path_factory: Any, seed: int, count: int, faults: list[tuple[str, int]],
        max_txn: float, min_share: float, sqlite: bool) -> None:
    """Random input, random transaction bounds, random crash points: the
    outcome equals the model (each committed input once, in order)."""
    journals = MemoryJournalClient()
    for name in SOURCES + OUTPUTS:
        journals.create(name, NDJSON)
    make_input(journals, SOURCES, count, seed=seed)
    work = tmp_path_factory.mktemp("prop")
    spec = ShardSpec("count", sources=SOURCES, max_txn_duration=max_txn,
                     min_txn_duration=max_txn * min_share * 0.5)

    def new_store(shard: Shard) -> Store:
        if sqlite:
            return SQLiteStore(Path(work) / "state.db")
        return JSONFileStore(Path(work) / "state")

    for fault in [*faults, None]:
        life = Process(journals, fault)
        app = CountingApp(lambda shard, life=life: life.wrap(new_store(shard)),  # type: ignore[misc]
                          {"count": OUTPUTS}, on_message=life.on_message)
        runner = Runner(life, app, [spec])  # type: ignore[arg-type]
        try:
            runner.run_until_idle(timeout=60)
            runner.stop()  # a fault whose point was never reached: a clean life
        except Exception as exc:
            # The crash, as the runtime reports it: itself, or the store's
            # or the journal's failure that it caused.
            assert life.dead, f"no crash was played, yet: {exc!r}"
            with contextlib.suppress(Exception):  # raised once already
                runner.stop()
    want = committed_by_key(journals, SOURCES)
    assert output_by_key(journals, OUTPUTS) == expected_output(want)
    kind = f"sqlite:{work}/state.db" if sqlite else f"json:{work}/state"
    assert committed_state(kind, Shard(spec, journals)) == expected_state(want)
