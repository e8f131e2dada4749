"""The end-to-end demo behind ``exactly demo`` (and ``exactly demo --cluster``).

1. Creates four ``clicks/part-*`` journals: in a journal store
   (``./demo-store`` by default), or on a Gazette cluster (``where``; the
   command line's ``--cluster`` starts a local one, and a Spark standalone
   cluster for the job, and stops them afterwards).
2. Runs producer *processes* at once: two publishing committed clicks, one
   publishing transactions (a third of them aborted), and one killed with
   SIGKILL in the middle of a transaction. Then re-appends a few hundred
   frames, as an at-least-once client retrying appends would.
3. Runs the Spark job: read committed, views per page and per session,
   latest state per session (a logout deletes it), written as Parquet. On the
   clusters, its executors are processes of the Spark workers, reading the
   journals through the brokers and the fragment store.
4. Prints what each producer says it committed against what Spark computed,
   and what a naive read would have said.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final, TextIO

import orjson

from exactly._common import stop_requests
from pipeline import StoreOptions

_MARKER = "@demo"  # marks a directory this demo created, so a re-run may replace it
_PARTS = 4


#: While something slow runs (Spark starting, its jobs), a line this often.
PROGRESS_SECONDS: Final = 5.0
_SAY = threading.Lock()


def say(out: TextIO, t0: float, text: str) -> None:
    """One line of the demo's story, with the seconds since ``t0``."""
    with _SAY:  # lines come from the progress thread too
        out.write(f"[{time.monotonic() - t0:5.1f}s] {text}\n")
        out.flush()


class Progress:
    """Says every ``every`` seconds, while its block runs, what is going on: the
    progress of Spark's active stages (from its status tracker) when there
    are any, else that ``what`` is still going on. Never a silent minute."""

    def __init__(
        self, out: TextIO, t0: float, what: str, *, spark: Any = None, every: float
    ) -> None:
        self.out, self.t0, self.what, self.spark, self.every = out, t0, what, spark, every
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="demo-progress", daemon=True)

    def __enter__(self) -> Progress:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            stages = self._stages()
            waited = time.monotonic() - self.started
            say(self.out, self.t0, stages or f"... {self.what} ({waited:.0f}s so far)")

    def _stages(self) -> str:
        if self.spark is None:
            return ""
        try:
            tracker = self.spark.sparkContext.statusTracker()
            parts = []
            for sid in sorted(tracker.getActiveStageIds()):
                info = tracker.getStageInfo(sid)
                if info is None:
                    continue
                # A stage's name is where it comes from, often an internal closure.
                name = info.name.split(" at ")[0]
                what = f" ({name})" if name and not name.startswith("$") else ""
                parts.append(f"stage {sid}{what}: {info.numCompletedTasks}/{info.numTasks}"
                             f" tasks done, {info.numActiveTasks} running")
        except Exception:  # the progress line must never break the demo
            return ""
        return ("Spark: " + "; ".join(parts)) if parts else ""


def prepare(root: Path) -> None:
    """Make ``root`` the demo's directory (replacing a demo's earlier one)."""
    if root.exists() and any(root.iterdir()):
        # Either demo's store (`--quick` marks its own with @quick-demo) may go.
        if not ((root / _MARKER).exists() or (root / "@quick-demo").exists()):
            raise ValueError(f"{root} exists and is not a demo store: pass another --store")
        shutil.rmtree(root)
    root.mkdir(parents=True, exist_ok=True)
    (root / _MARKER).write_text("created by `exactly demo`; safe to delete\n")


def _create_journals(where: StoreOptions) -> None:
    with where.open(create=True) as store:
        for i in range(_PARTS):
            store.create(
                f"clicks/part-{i}", {"content-type": "application/x-ndjson", "app": "clicks"}
            )


def _producer(where: StoreOptions, role: str, seed: int) -> subprocess.Popen[str]:
    target = where.broker or str(where.root)
    # A secured cluster's settings reach the producer as gazctl's do.
    env = {**os.environ, **{f"BROKER_{k.upper()}": v for k, v in where.security}}
    return subprocess.Popen(
        [sys.executable, "-m", "exactly._demo_producer", target, role, str(seed)],
        stdout=subprocess.PIPE, text=True, env=env,
    )


def _duplicate_frames(where: StoreOptions, rng: random.Random, count: int) -> int:
    """Append ``count`` copies of existing frames (whole transactions' runs
    included): what a client retrying appends it was unsure of would do."""
    n = 0
    with where.open() as store:
        for spec in store.list("app=clicks"):
            with store.read(spec.name, 0, store.head(spec.name)) as r:
                data = r.read(1 << 30) if store.head(spec.name) else b""
                while len(data) < store.head(spec.name):
                    more = r.read(1 << 30)
                    if not more:
                        break
                    data += more
            lines = data.splitlines(keepends=True)
            for _ in range(count // _PARTS):
                start = rng.randrange(len(lines))
                run = b"".join(lines[start : start + rng.randrange(1, 6)])
                store.append(spec.name, run)
                n += 1
        store.flush()
    return n


def run_demo(
    store: Path | None = None,
    *,
    where: StoreOptions | None = None,
    master: str | None = None,
    out: TextIO = sys.stdout,
    progress_every: float = PROGRESS_SECONDS,
    prepared: bool = False,
) -> int:
    """Run the demo in ``store`` (default ``./demo-store``); returns an exit
    status (0 when every computed figure matches what the producers
    committed). The journals live in a store under ``store``, or where
    ``where`` says (a Gazette cluster); Spark runs locally, or on the
    cluster at ``master``. While anything slow runs, a line says what it is
    doing every ``progress_every`` seconds. ``prepared``: ``store`` was made
    ready by the caller (``prepare``)."""
    t0 = time.monotonic()
    # Absolute: Spark's JVM and workers resolve relative paths on their own.
    root = (Path(store) if store is not None else Path("demo-store")).resolve()
    if not prepared:
        prepare(root)
    if where is None:
        where = StoreOptions(root=str(root / "journals"))
        say(out, t0, f"journal store: {where.root}")
    return _story(where, root, out, t0, progress_every, master=master)


def _story(where: StoreOptions, root: Path, out: TextIO, t0: float, progress_every: float,
           master: str | None) -> int:
    """Producers, a SIGKILL, duplicates, then the Spark job and its check."""
    _create_journals(where)

    # -- producers ---------------------------------------------------------
    killed = _producer(where, "killed", 99)
    procs = {
        "committed #1": _producer(where, "committed", 1),
        "committed #2": _producer(where, "committed", 2),
        "transactions": _producer(where, "transactions", 3),
    }
    say(out, t0, f"started {len(procs) + 1} producer processes (pids "
         f"{', '.join(str(p.pid) for p in [*procs.values(), killed])})")
    try:
        reports = _await_producers(killed, procs, out, t0, progress_every)
    finally:
        # Stopped (Ctrl-C, SIGTERM) or failed: no producer outlives the demo.
        for proc in [killed, *procs.values()]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return _after_producers(where, root, out, t0, progress_every, master, reports)


def _await_producers(killed: subprocess.Popen[str], procs: dict[str, subprocess.Popen[str]],
                     out: TextIO, t0: float, progress_every: float) -> dict[str, Any]:
    """SIGKILL the producer in its transaction; the others' reports."""
    assert killed.stdout is not None
    if killed.stdout.readline().strip() != "ready":
        raise RuntimeError("the producer to kill did not start its transaction")
    os.kill(killed.pid, signal.SIGKILL)
    killed.wait()
    killed.stdout.close()
    say(out, t0, f"killed producer {killed.pid} with SIGKILL in the middle of a "
         "500-click transaction")
    reports: dict[str, Any] = {}
    with Progress(out, t0, "producers publishing", every=progress_every):
        for name, proc in procs.items():
            stdout, _ = proc.communicate(timeout=300)
            if proc.returncode != 0:
                raise RuntimeError(f"producer {name} failed with status {proc.returncode}")
            reports[name] = orjson.loads(stdout.strip().splitlines()[-1])
            say(out, t0, f"producer {name} done: {sum(reports[name]['pages'].values())} "
                 "clicks committed")
    return reports


def _after_producers(where: StoreOptions, root: Path, out: TextIO, t0: float,
                     progress_every: float, master: str | None,
                     reports: dict[str, Any]) -> int:
    dups = _duplicate_frames(where, random.Random(5), 200)
    say(out, t0, f"re-appended {dups} runs of existing frames (at-least-once retries)")

    expected_pages: Counter[str] = Counter()
    expected_sessions: Counter[str] = Counter()
    final: dict[str, Any] = {}
    for r in reports.values():
        expected_pages.update(r["pages"])
        expected_sessions.update(r["sessions"])
        final.update(r["final"])
    live = {s: p for s, p in final.items() if p is not None}

    # -- the Spark job -----------------------------------------------------
    import pipeline

    if master is None:
        say(out, t0, "starting Spark (local, 2 cores; its JVM takes a while to start)")
    else:
        say(out, t0, "starting the Spark application (its executors are the workers'"
             " JVMs; they take a while to start)")
    with Progress(out, t0, "starting Spark", every=progress_every):
        from pyspark.sql import functions as F  # noqa: N812 -- the usual alias

        spark = (
            pipeline.local_session("local[2]", app="exactly-demo") if master is None
            else pipeline.cluster_session(
                master, app="exactly-demo", driver_host="127.0.0.1",
                conf={"spark.executor.memory": "512m", "spark.cores.max": "2"})
        )
    say(out, t0, "Spark is up; reading committed clicks")
    try:
        with Progress(out, t0, "Spark working", spark=spark, every=progress_every), \
                _interruptible(spark):
            return _spark_job(spark, F, where, root, out, t0, expected_pages,
                              expected_sessions, live)
    finally:
        if master is not None:
            spark.stop()


@contextlib.contextmanager
def _interruptible(spark: Any) -> Iterator[None]:
    """Ctrl-C or SIGTERM while Spark works: its jobs are cancelled from a
    thread of their own, and the stop goes on (KeyboardInterrupt, through the
    handler that was there before) once the main thread is back from the
    JVM. PySpark's own handler cancels from the main thread, inside the call
    it interrupts, and py4j then prints the tracebacks of a reentrant read."""
    left = threading.Event()

    def cancel() -> None:  # each job, as it starts, until the main thread is back
        while not left.is_set():
            with contextlib.suppress(Exception):  # stopping anyway: they end with the JVM
                spark.sparkContext.cancelAllJobs()
            left.wait(0.1)

    cancelling = threading.Thread(target=cancel, name="exactly demo: cancel Spark jobs",
                                  daemon=True)

    def on_request(_signal: signal.Signals) -> None:
        if len(asked) == 1:  # (the first)
            cancelling.start()

    before = signal.getsignal(signal.SIGTERM)
    with stop_requests(on_request) as asked:
        try:
            yield
        except Exception:
            if not asked:
                raise
        finally:
            left.set()
    if asked:
        if asked[0] == signal.SIGTERM and callable(before):
            before(asked[0], None)  # the command's own: it records the status to end with
        raise KeyboardInterrupt


def _spark_job(
    spark: Any,
    F: Any,  # noqa: N803 -- pyspark.sql.functions, as usually named
    where: StoreOptions,
    root: Path,
    out: TextIO,
    t0: float,
    expected_pages: Counter[str],
    expected_sessions: Counter[str],
    live: dict[str, Any],
) -> int:
    """The Spark job, then the verification of what it computed."""
    import pipeline

    store = ({"root": where.root} if where.root is not None
             else {"broker": where.broker, "file_root": where.file_root or "",
                   **dict(where.security)})
    opts = {**store, "selector": "app=clicks", "schema": "session string, page string, ms long"}
    committed = spark.read.format("journal").options(**opts).load()  # no ACK rows
    committed = committed.cache()
    views = committed.where(F.col("page").isNotNull())
    per_page = views.groupBy("page").count()
    per_session = views.groupBy("session").count()
    out_dir = root / "parquet"
    per_page.write.mode("overwrite").parquet(str(out_dir / "views_per_page"))
    per_session.write.mode("overwrite").parquet(str(out_dir / "views_per_session"))
    say(out, t0, f"wrote views per page and per session to {out_dir}")
    latest = pipeline.materialize_latest(
        committed.select("session", "page", "ms", "journal", "commit_offset", "begin",
                         "publish_time"),
        "session", str(out_dir / "latest_per_session"),
    )
    say(out, t0, f"wrote the latest state per session to {out_dir / 'latest_per_session'}")

    got_pages = {r["page"]: r["count"] for r in per_page.collect()}
    got_sessions = {r["session"]: r["count"] for r in per_session.collect()}
    got_latest = {r["session"]: r["page"] for r in latest.collect()}
    uncommitted = (
        spark.read.format("journal").options(**opts, isolation="read_uncommitted").load()
        .where(F.col("page").isNotNull())
    )
    naive = uncommitted.count()
    naive_dedup = uncommitted.dropDuplicates(["uuid"]).count()
    committed.unpersist()

    # -- verification ------------------------------------------------------
    total = sum(expected_pages.values())
    checks = [
        ("views in total", total, sum(got_pages.values())),
        ("pages with the right count", len(expected_pages),
         sum(got_pages.get(p) == n for p, n in expected_pages.items())),
        ("sessions with the right count", len(expected_sessions),
         sum(got_sessions.get(s) == n for s, n in expected_sessions.items())),
        ("live sessions (latest state)", len(live), len(got_latest)),
        ("sessions whose latest page matches", len(live),
         sum(got_latest.get(s) == p for s, p in live.items())),
    ]
    out.write("\nverification                          expected   computed\n")
    ok = True
    for label, want, got in checks:
        ok &= want == got
        out.write(f"  {label:<34} {want:>8}   {got:>8}  {'ok' if want == got else 'MISMATCH'}\n")
    out.write(
        f"\n  a naive read-uncommitted count says  {naive:>8}"
        f"   (+{naive - total}: duplicates, aborted and killed transactions)\n"
        f"  read-uncommitted + dropDuplicates    {naive_dedup:>8}"
        f"   (+{naive_dedup - total}: aborted and killed transactions remain)\n\n"
    )
    if where.root is not None:
        say(out, t0, "demo " + ("passed" if ok else "FAILED") + f"; store left in {root}"
             f" (its journals: exactly --root {where.root} journals list)")
    else:
        say(out, t0, "demo " + ("passed" if ok else "FAILED") + f"; Parquet output in"
             f" {root / 'parquet'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(run_demo(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
