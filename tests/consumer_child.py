"""A consumer process for the runtime's fault tests: runs the counting
application of tests/consumer_support.py on the shards a JSON config names,
until idle (or, with ``serve``, until SIGTERM), and can SIGKILL itself at an
exact point of a transaction.

    python -m tests.consumer_child '{"root": ..., "store": "json:DIR/{shard}",
        "shards": [{"id": "a", "sources": [...], "outputs": [...],
                    "max_txn": 0.02, "min_txn": 0}],
        "kill": {"point": "after-publish" | "after-commit" | "between-acks", "at": K},
        "slow": 0.0, "serve": false}'

It prints ``restored SHARD`` once the shard's store is restored (and so
fences off every earlier instance), ``committed SHARD N consumed M`` after
each commit (M: messages consumed so far by this process) and ``idle`` when
done.
Exit status: 0 done, 3 fenced off (FencedError), 1 any other failure.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from consumer import FencedError, PreparedCommit, Runner, Shard, ShardSpec, Store
from journal import AppendResult, JournalClient, LocalJournalStore
from message import Checkpoint
from tests.consumer_support import CountingApp, open_store


def die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


class KillingClient:
    """The journal client, which SIGKILLs the process on the second append
    after commit number ``at`` (the second ACK of that transaction), once
    the first is durable."""

    def __init__(self, client: JournalClient, kill: dict[str, Any] | None) -> None:
        self._client = client
        self.armed = False
        self.after_commit: list[Future[AppendResult]] = []

    def append(self, name: str, data: bytes) -> Future[AppendResult]:
        if self.armed:
            if self.after_commit:
                self.after_commit[0].result()  # the first ACK is durable
                die()
            fut = self._client.append(name, data)
            self.after_commit.append(fut)
            return fut
        return self._client.append(name, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._client, name)


def main() -> int:
    config = json.loads(sys.argv[1])
    if config.get("broker"):
        from journal import GazetteClient
        client: Any = GazetteClient(config["broker"])
    else:
        client = LocalJournalStore(config["root"])
    kill = config.get("kill")
    killing = KillingClient(client, kill)
    commits = {"n": 0}
    slow = float(config.get("slow", 0))

    def on_commit(shard: Shard) -> None:
        commits["n"] += 1
        print(f"committed {shard.id} {commits['n']} consumed {app.consumed}", flush=True)
        if kill and kill["at"] == commits["n"]:
            if kill["point"] == "after-commit":
                die()
            if kill["point"] == "between-acks":
                killing.armed = True

    def make_store(shard: Shard) -> Store:
        store = open_store(config["store"], shard)
        restore: Callable[[Shard], Checkpoint] = store.restore_checkpoint
        prepare = getattr(store, "prepare_commit", None)
        if prepare is not None:
            # A store that commits in two steps: the commit is the second.
            def prepare_commit(shard: Shard, checkpoint: Checkpoint) -> PreparedCommit:
                prepared = prepare(shard, checkpoint)

                class Hooked:
                    def commit(self) -> None:
                        prepared.commit()
                        on_commit(shard)

                    def abort(self) -> None:
                        prepared.abort()

                return Hooked()

            store.prepare_commit = prepare_commit  # type: ignore[attr-defined]
        else:
            commit: Callable[[Shard, Checkpoint], None] = store.start_commit

            def start_commit(shard: Shard, checkpoint: Checkpoint) -> None:
                commit(shard, checkpoint)
                on_commit(shard)

            store.start_commit = start_commit  # type: ignore[method-assign]

        def restore_checkpoint(shard: Shard) -> Checkpoint:
            restored = restore(shard)
            print(f"restored {shard.id}", flush=True)
            return restored

        store.restore_checkpoint = restore_checkpoint  # type: ignore[method-assign]
        return store

    finalized = {"n": 0}

    def on_finalize(shard: Shard) -> None:
        finalized["n"] += 1
        if kill and kill["point"] == "after-publish" and kill["at"] == finalized["n"]:
            time.sleep(0.05)  # let the publishes reach the journals
            die()

    def on_message(shard: Shard, env: Any) -> None:
        if slow:
            time.sleep(slow)

    specs = [ShardSpec(s["id"], sources=s["sources"], max_txn_duration=s.get("max_txn", 0.05),
                       min_txn_duration=s.get("min_txn", 0.0)) for s in config["shards"]]
    app = CountingApp(make_store, {s["id"]: s["outputs"] for s in config["shards"]},
                      on_message=on_message, on_finalize=on_finalize)
    runner = Runner(killing, app, specs)
    try:
        if config.get("serve"):
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda *_: stop.set())
            runner.start()
            print("serving", flush=True)
            while not stop.wait(0.05):
                pass
            runner.stop()
        else:
            runner.run_until_idle(timeout=float(config.get("timeout", 300)))
            runner.stop()
    except FencedError as exc:
        print(f"fenced {exc}", flush=True)
        runner_stop_quietly(runner)
        return 3
    except BaseException as exc:
        print(f"failed {type(exc).__name__}: {exc}", flush=True)
        runner_stop_quietly(runner)
        return 1
    finally:
        client.close()
    print("idle", flush=True)
    return 0


def runner_stop_quietly(runner: Runner) -> None:
    try:
        runner.stop()
    except BaseException as exc:  # already failed: say it, keep the exit status
        print(f"while stopping: {type(exc).__name__}: {exc}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
