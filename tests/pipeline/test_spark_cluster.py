"""The ``journal`` source on a real Spark standalone cluster (a master and two
workers, their executors separate JVMs with Python workers of their own)
reading and writing journals of the Gazette cluster: each scenario runs in a
driver process (tests/spark_cluster_job.py), then its journals are checked
from here. After every fault: each row exactly once, or none.

The scenarios that need no application of their own run one after another
in one driver (``shared``): an application's start is most of a short
scenario's time. It is stopped before a scenario that starts its own
application (the cluster has two cores, which an application holds while
it lives)."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from journal import GazetteClient
from message import (
    Flags,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    get_flags,
    get_producer_id,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
NDJSON = {"content-type": "application/x-ndjson"}


class SharedDriver:
    """One driver process (``spark_cluster_job --serve``) running scenarios
    in turn in one application; started at its first scenario."""

    def __init__(self, spark_cluster: Any, gazette_cluster: Any) -> None:
        self.spark_cluster, self.gazette_cluster = spark_cluster, gazette_cluster
        self.proc: subprocess.Popen[str] | None = None
        self.results: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.stderr: IO[str] | None = None
        self.reader: threading.Thread | None = None

    def run(self, scenario: str, prefix: str, file_root: str = "",
            timeout: float = 300) -> dict[str, Any]:
        if self.proc is None:
            self._start()
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(json.dumps([scenario, prefix, file_root]) + "\n")
        self.proc.stdin.flush()
        try:
            line = self.results.get(timeout=timeout)
        except queue.Empty:
            line = None
        assert line is not None, f"the driver gave no result for {scenario}: {self._log()}"
        out = dict(json.loads(line))
        assert "error" not in out, out["error"]
        return out

    def _start(self) -> None:
        self.stderr = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- closed by stop()
        self.proc = job(self, "--serve", stdin=subprocess.PIPE, stderr=self.stderr)
        stdout = self.proc.stdout
        assert stdout is not None

        def results() -> None:
            for line in stdout:
                if line.startswith("RESULT "):
                    self.results.put(line[len("RESULT "):])
            self.results.put(None)  # it exited

        self.reader = threading.Thread(target=results, daemon=True)
        self.reader.start()

    def _log(self) -> str:
        if self.stderr is None:
            return ""
        self.stderr.seek(0)
        return self.stderr.read()[-3000:]

    def stop(self) -> int:
        """End the driver (its application with it), by PID if it does not;
        its exit status (0 if none ran)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return 0
        assert proc.stdin is not None
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        finally:
            if self.reader is not None:
                self.reader.join()  # (it reads until the driver's output ends)
            assert proc.stdout is not None
            proc.stdout.close()
            if self.stderr is not None:
                self.stderr.close()
                self.stderr = None
        self.results = queue.SimpleQueue()
        return proc.returncode


@pytest.fixture(scope="module")
def shared(spark_cluster: Any, gazette_cluster: Any) -> Iterator[SharedDriver]:
    driver = SharedDriver(spark_cluster, gazette_cluster)
    try:
        yield driver
    finally:
        status = driver.stop()
    assert status == 0, f"the shared driver exited {status}"


def job(shared: SharedDriver, *args: str, stdin: Any = None,
        stderr: Any = subprocess.PIPE) -> subprocess.Popen[str]:
    """A driver process (``tests.spark_cluster_job MASTER BROKER *args``) on
    the module's clusters; its standard output is a pipe."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.spark_cluster_job", shared.spark_cluster.master_url,
         shared.gazette_cluster.address, *args],
        cwd=ROOT, stdin=stdin, stdout=subprocess.PIPE, stderr=stderr, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def driver(shared: SharedDriver, scenario: str, prefix: str) -> subprocess.Popen[str]:
    """A driver process of its own for ``scenario`` (the shared one stopped
    first: it would hold the cluster's cores; how it ended is for the tests
    that used it, and the module's end, to say)."""
    shared.stop()
    return job(shared, scenario, prefix)


def finish(proc: subprocess.Popen[str], timeout: float = 300) -> dict[str, Any]:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return dict(json.loads(out.strip().splitlines()[-1]))


def committed(client: GazetteClient, journal: str) -> tuple[list[int], bool]:
    """The committed values of ``n``, and whether a transaction stays open."""
    it = ReadCommittedIter(client, journal, lambda _s: JsonDocument())
    ns = [e.message["n"] for e in it if get_flags(e.message.get_uuid()) != Flags.ACK_TXN]
    return sorted(ns), it.sequencer.has_pending({})


def test_write_and_read_on_the_cluster(shared: SharedDriver, gazette_cluster: Any,
                                       gazette_prefix: str) -> None:
    """Executors in other processes write 2000 rows exactly once and read them
    back committed, through the brokers and from the fragment store."""
    got = shared.run("write_and_read", gazette_prefix, str(gazette_cluster.fragment_root))
    assert got["committed"] == list(range(2000)) == got["direct"]
    assert got["uncommitted"] > 2000  # every frame: ACKs included
    assert got["driver_pid"] not in got["python_pids"] and len(got["python_pids"]) >= 2
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, f"{gazette_prefix}out") == (list(range(2000)), False)


def test_first_attempts_failing_mid_write(shared: SharedDriver, gazette_cluster: Any,
                                          gazette_prefix: str) -> None:
    """First attempts that fail half-way are retried: every row once."""
    shared.run("first_attempts_fail", gazette_prefix)
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, f"{gazette_prefix}out") == (list(range(1000)), False)


def test_a_job_that_fails_for_good(shared: SharedDriver, gazette_cluster: Any,
                                   gazette_prefix: str) -> None:
    """A task failing on every attempt fails the job: no row visible, none open."""
    assert shared.run("job_fails", gazette_prefix)["failed"]
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, f"{gazette_prefix}out") == ([], False)


def test_a_stream_on_the_cluster(shared: SharedDriver, gazette_cluster: Any,
                                 gazette_prefix: str) -> None:
    """A streaming query run by executors, with a read limit: every committed
    message of the source once in the sink, none of an open transaction."""
    src, dst = f"{gazette_prefix}src", f"{gazette_prefix}dst"
    with GazetteClient(gazette_cluster.address) as c:
        c.create(src, NDJSON)
        c.create(dst, NDJSON)
        pub = Publisher(c)
        to_src = lambda _d: (src, "application/x-ndjson")  # noqa: E731
        for n in range(300):
            pub.publish_committed(to_src, JsonDocument(n=n))
        Publisher(c).publish_uncommitted(to_src, JsonDocument(n=999))  # never committed
        c.flush()
    got = shared.run("stream", gazette_prefix)
    assert got["batches"] > 1
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, dst) == (list(range(300)), False)


def test_an_executor_sigkilled_mid_write(shared: SharedDriver, spark_cluster: Any,
                                         gazette_cluster: Any, gazette_prefix: str) -> None:
    """SIGKILL an executor JVM (and its Python workers with it) while its
    tasks publish: Spark runs them again elsewhere, and every row is
    committed exactly once, with no transaction left open."""
    journal = f"{gazette_prefix}out"
    proc = driver(shared, "slow_write", gazette_prefix)
    killed: list[int] = []

    def kill_when_writing() -> None:
        with GazetteClient(gazette_cluster.address) as c:
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    if c.head(journal) > 20_000:  # a few hundred rows published
                        killed.append(spark_cluster.kill_executor())
                        return
                except Exception:  # the journal is not created yet
                    pass
                time.sleep(0.05)

    t = threading.Thread(target=kill_when_writing)
    t.start()
    finish(proc)
    t.join()
    assert killed, "no executor was killed while the job wrote"
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, journal) == (list(range(3000)), False)


def test_speculative_copies_of_a_slow_task(shared: SharedDriver, gazette_cluster: Any,
                                           gazette_prefix: str) -> None:
    """With speculation, a slow task's copy runs beside it and one of the two
    is killed: its rows are committed once, the loser's rolled back."""
    finish(driver(shared, "speculation", gazette_prefix))
    with GazetteClient(gazette_cluster.address) as c:
        assert committed(c, f"{gazette_prefix}out") == (list(range(160_000)), False)
        producers = {get_producer_id(e.message.get_uuid()) for e in ReadUncommittedIter(
            c, f"{gazette_prefix}out", lambda _s: JsonDocument())}
    assert len(producers) > 4  # more attempts published than the 4 tasks: a copy ran
