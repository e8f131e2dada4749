"""Metrics (journal.metrics): scraped over HTTP from a real process that
publishes, reads and runs a consumer shard, and checked against what that
process did; off, they cost an import of nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("prometheus_client")
from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parent.parent


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample served at /metrics: (name, sorted labels) -> value."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def sampler(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float]
            ) -> Callable[..., Any]:
    """``value(name, **labels)``: the sample served (asserted to be), or,
    with ``served=False``, None (asserted not to be)."""
    def value(name: str, served: bool = True, **labels: str) -> Any:
        key = (name, tuple(sorted(labels.items())))
        if not served:
            assert key not in samples, f"{name}{labels} served: {samples[key]}"
            return None
        assert key in samples, f"{name}{labels} not served"
        return samples[key]

    return value


def run_child(args: list[str], check: Callable[[dict[str, Any], Callable[..., Any]], None],
              ) -> None:
    """Run tests/metrics_child.py, then ``check(facts, value)`` while it is
    up; ``value(name, **labels)`` reads one scraped sample (scraped anew
    until ``check`` passes, for values that settle: appends still queued)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.metrics_child", *args], cwd=REPO,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, f"the child failed: {proc.communicate(timeout=30)[1]}"
        facts = json.loads(line)
        deadline = time.monotonic() + 20
        while True:
            value = sampler(scrape(facts["port"]))
            try:
                check(facts, value)
                break
            except AssertionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        _, err = proc.communicate("", timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def check_scenario(prefix: str, client: str) -> Callable[[dict[str, Any], Any], None]:
    a, inp, out = prefix + "a/p0", prefix + "in/p0", prefix + "out/p0"

    def check(facts: dict[str, Any], value: Any) -> None:
        # Appends, per journal and client: a/p0 had 10 + 3 + ACK + 2 +
        # roll-back + 4 duplicates + 1, in/p0 2000, out/p0 the shard's
        # messages and one ACK per commit.
        assert value("exactly_journal_appends_total", client=client, journal=a) == 22
        assert value("exactly_journal_append_bytes_total", client=client,
                     journal=a) == facts["a_head"]
        assert value("exactly_journal_appends_total", client=client, journal=inp) == 2000
        assert value("exactly_journal_append_bytes_total", client=client,
                     journal=inp) == facts["in_head"]
        assert value("exactly_journal_appends_total", client=client, journal=out) == (
            facts["published_by_app"] + facts["commits"])
        batches = value("exactly_journal_append_batch_seconds_count", client=client, journal=a)
        assert 1 <= batches <= 22
        assert value("exactly_journal_append_batch_seconds_sum", client=client, journal=a) > 0
        # Publishers: every message, and each transaction the shard began
        # (one per finalize, the fenced one too) besides a/p0's three.
        assert value("exactly_messages_published_total") == (
            16 + 2000 + facts["published_by_app"])
        assert value("exactly_transactions_begun_total") == 3 + facts["finalized"]
        assert value("exactly_transactions_committed_total") == 1 + facts["finalized"]
        assert value("exactly_transactions_rolled_back_total") == 1
        # The committed reader of a/p0: 4 duplicates, 1 roll-back, a replay,
        # and the transaction left open.
        assert value("exactly_sequencer_duplicates_total") == 4
        assert value("exactly_sequencer_rollbacks_total") == 1
        assert facts["replays"] == 1
        assert value("exactly_sequencer_replays_total", journal=a) == 1
        assert 0 < value("exactly_sequencer_replay_bytes_total", journal=a) < facts["a_head"]
        assert facts["open_spans"] == 1
        assert value("exactly_sequencer_open_spans", journal=a) == 1
        assert value("exactly_sequencer_producers", journal=a) == facts["producers"] == 2
        assert 0 < value("exactly_sequencer_oldest_open_span_seconds", journal=a) < 120
        # The consumer shard: its commits, the messages in them, the fence;
        # it fell behind, and its lag went with it when it stopped serving.
        assert facts["commits"] >= 2 and facts["fenced"]
        assert value("exactly_consumer_transactions_total", shard="s1") == facts["commits"]
        assert value("exactly_consumer_transaction_messages_count",
                     shard="s1") == facts["commits"]
        assert value("exactly_consumer_transaction_messages_sum",
                     shard="s1") == facts["consumed_committed"]
        assert value("exactly_consumer_commit_seconds_count", shard="s1") == facts["commits"]
        assert value("exactly_consumer_fenced_total", shard="s1") == 1
        assert facts["lag_bytes"] > 0 and facts["lag_seen"] > 0
        for name in ("exactly_consumer_source_lag_bytes", "exactly_consumer_source_lag_seconds"):
            value(name, served=False, shard="s1", journal=inp)

    return check


@pytest.mark.slow
def test_metrics_scraped_from_a_process_agree_with_what_it_did(tmp_path: Path) -> None:
    run_child([str(tmp_path)], check_scenario("", "local"))


def test_metrics_on_a_gazette_cluster(gazette_cluster: Any, gazette_prefix: str,
                                      tmp_path: Path) -> None:
    run_child([str(tmp_path), gazette_cluster.address, gazette_prefix],
              check_scenario(gazette_prefix, "gazette"))


def test_metrics_off_record_nothing_and_import_nothing(tmp_path: Path) -> None:
    """Without enable(), prometheus_client is never imported, and reading
    and publishing leave no trace but the components' own counts."""
    code = f"""
import sys
from journal import LocalJournalStore, metrics
from message import JsonDocument, Publisher, ReadCommittedIter
with LocalJournalStore({str(tmp_path)!r}) as store:
    store.create("j", {{"content-type": "application/x-ndjson"}})
    pub = Publisher(store)
    for i in range(10):
        pub.publish_committed(lambda m: ("j", "application/x-ndjson"), JsonDocument(n=i))
    store.flush()
    with ReadCommittedIter(store, "j", lambda spec: JsonDocument()) as it:
        assert sum(1 for _ in it) == 10
        it.checkpoint()
assert not metrics.enabled()
assert "prometheus_client" not in sys.modules, "imported while off"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_enable_without_prometheus_client_says_what_to_install() -> None:
    code = """
import sys
sys.modules["prometheus_client"] = None  # as if not installed
from journal import metrics
try:
    metrics.enable()
except ImportError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert "pip install 'exactly[metrics]'" in out.stdout, out.stderr


def test_enable_disable_in_a_registry_of_ones_own() -> None:
    """enable(registry) registers every instrument there, once however
    often it is called; disable() takes them out again."""
    from prometheus_client import CollectorRegistry

    from journal import metrics

    registry = CollectorRegistry()
    metrics.enable(registry)
    try:
        metrics.enable(registry)  # idempotent
        metrics.record_transaction("t", 5, 0.5, 0.01)
        assert registry.get_sample_value("exactly_consumer_transactions_total",
                                         {"shard": "t"}) == 1
        assert registry.get_sample_value("exactly_messages_published_total") is not None
    finally:
        metrics.disable()
    assert not metrics.enabled()
    assert registry.get_sample_value("exactly_messages_published_total") is None
    metrics.record_transaction("t", 5, 0.5, 0.01)  # off: nothing, and no error


def test_a_stuck_shards_lag_grows_while_it_commits_nothing_and_goes_when_it_stops(
        tmp_path: Path) -> None:
    """A shard's lag is measured when scraped: stuck in consume_message, it
    commits nothing, and yet its lag in bytes follows the write head and its
    lag in seconds grows; once it stops serving, its series are gone."""
    import threading

    from prometheus_client import CollectorRegistry

    from consumer import Application, JSONFileStore, Runner, ShardSpec
    from journal import LocalJournalStore, metrics
    from message import JsonDocument, Publisher

    to = lambda msg: ("in/p0", "application/x-ndjson")  # noqa: E731
    stuck, release = threading.Event(), threading.Event()

    class App(Application):
        def new_store(self, shard: Any) -> JSONFileStore:
            return JSONFileStore(tmp_path / "state")

        def new_message(self, spec: Any) -> JsonDocument:
            return JsonDocument()

        def consume_message(self, shard: Any, store: Any, env: Any, publisher: Any) -> None:
            if env.message["n"] == 5:
                stuck.set()
                release.wait(60)

    registry = CollectorRegistry()
    metrics.enable(registry)
    store = LocalJournalStore(tmp_path / "journals")
    runner = Runner(store, App(), [ShardSpec("s1", ["in/p0"], max_txn_duration=0.01)])
    labels = {"shard": "s1", "journal": "in/p0"}

    def lag() -> tuple[float | None, float | None]:
        return (registry.get_sample_value("exactly_consumer_source_lag_bytes", labels),
                registry.get_sample_value("exactly_consumer_source_lag_seconds", labels))

    try:
        store.create("in/p0", {"content-type": "application/x-ndjson"})
        pub = Publisher(store)
        for n in range(5):
            pub.publish_committed(to, JsonDocument(n=n))
        runner.run_until_idle(timeout=30)
        assert lag() == (0, 0)  # caught up
        committed_head = store.head("in/p0")
        for n in range(5, 8):
            pub.publish_committed(to, JsonDocument(n=n))
        store.flush()
        assert stuck.wait(30)
        time.sleep(1.1)  # (write heads are asked for at most once a second)
        behind, first = lag()
        assert behind == store.head("in/p0") - committed_head > 0
        assert first is not None and first >= 1.0  # message 4, its last commit, is that old
        pub.publish_committed(to, JsonDocument(n=8))
        store.flush()
        time.sleep(1.1)
        more, later = lag()
        assert more == store.head("in/p0") - committed_head > behind  # it follows the head
        assert later is not None and later >= first + 1.0
        release.set()
        runner.run_until_idle(timeout=30)
        assert lag() == (0, 0)
        runner.stop()
        assert lag() == (None, None)  # it no longer serves here
    finally:
        release.set()
        runner.stop()
        store.close()
        metrics.disable()
