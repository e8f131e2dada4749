"""Prometheus metrics of the whole library (the ``metrics`` extra).

Off until a process turns them on; then every package records into the
instruments below, and a Prometheus server scrapes them::

    from journal import metrics
    metrics.start_http_server(9464)          # enable, and serve /metrics

or, for an application that exposes its own ``prometheus_client`` registry,
``metrics.enable(registry)``. ``docs/operations.md`` lists every metric.

This module is the one owner of the metric names and of the on/off switch.
Each package calls the ``record_*`` functions below at the end of a batch, a
transaction or a replay, never per message; while metrics are off each is
one test of a module global. What does happen per message (a message
published, a duplicate dropped) is counted by the component itself in a
plain integer, as the native core counts it, and read only when scraped
(``counter_source``). What must move while its owner does not (a consumer
shard stuck in its application still falls behind) is measured when scraped
too (``report_source_lag``). ``prometheus_client`` is imported by ``enable``
alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

__all__ = [
    # for a process
    "enable", "disable", "enabled", "start_http_server",
    # for the packages that record
    "counter_source", "record_batch", "record_replay", "record_open_spans",
    "forget_open_spans", "record_transaction", "record_fenced", "report_source_lag",
    "forget_source_lag", "record_spark_progress", "COUNTED", "SCRAPE_WAIT",
]

#: Seconds buckets of append batches and consumer commits: from a cached
#: write (~50 µs) to a slow remote commit (seconds).
LATENCY_BUCKETS: Final = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                          0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: Seconds buckets of consumer transactions (bounded by max_txn_duration).
TXN_BUCKETS: Final = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Message-count buckets of consumer transactions.
COUNT_BUCKETS: Final = (1, 10, 100, 1_000, 10_000, 100_000, 1_000_000)
#: How long a scrape waits, at most, for what is measured when scraped
#: (consumer shards' write heads); past it, what was known before is served.
SCRAPE_WAIT: Final = 2.0

#: The counters that components keep themselves in plain integers (per
#: message, natively where built), read when scraped: name -> help.
COUNTED: Final[Mapping[str, str]] = {
    "exactly_messages_published_total": "Messages published (committed or uncommitted).",
    "exactly_transactions_begun_total": "Publisher transactions begun (a first uncommitted"
                                        " message since the last intents).",
    "exactly_transactions_committed_total": "Publisher transactions committed (ACK intents"
                                            " built).",
    "exactly_transactions_rolled_back_total": "Publisher transactions rolled back (roll-back"
                                              " intents built).",
    "exactly_sequencer_duplicates_total": "Envelopes a Sequencer dropped as duplicates.",
    "exactly_sequencer_rollbacks_total": "Open transactions a Sequencer discarded on a"
                                         " roll-back ACK.",
}


class _Instruments:
    """The instruments of one enabled process, in one registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        from prometheus_client import Counter, Gauge, Histogram

        self._registry = registry
        self._collectors: list[Any] = []

        def keep(collector: Any) -> Any:
            self._collectors.append(collector)
            return collector

        def counter(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return keep(Counter(name, doc, labels, registry=registry))

        def histogram(name: str, doc: str, labels: tuple[str, ...], buckets: tuple[float, ...]
                      ) -> Any:
            return keep(Histogram(name, doc, labels, buckets=buckets, registry=registry))

        def gauge(name: str, doc: str, labels: tuple[str, ...]) -> Any:
            return keep(Gauge(name, doc, labels, registry=registry))

        j = ("client", "journal")
        # prometheus_client adds _total to a counter's name itself.
        self.appends = counter("exactly_journal_appends", "Appends made durable.", j)
        self.append_bytes = counter("exactly_journal_append_bytes",
                                    "Bytes of appends made durable.", j)
        self.append_failures = counter("exactly_journal_append_failures",
                                       "Appends that failed.", j)
        self.append_seconds = histogram(
            "exactly_journal_append_batch_seconds",
            "Time to make one batch of appends durable (one write and sync, or one Append RPC).",
            j, LATENCY_BUCKETS)
        self.replays = counter("exactly_sequencer_replays",
                               "Replays of a journal's offset range by a committed reader.",
                               ("journal",))
        self.replay_bytes = counter("exactly_sequencer_replay_bytes",
                                    "Bytes re-read by replays.", ("journal",))
        s = ("shard",)
        self.txns = counter("exactly_consumer_transactions",
                            "Consumer transactions committed.", s)
        self.txn_seconds = histogram(
            "exactly_consumer_transaction_seconds",
            "Duration of a consumer transaction, from its first message to its commit.",
            s, TXN_BUCKETS)
        self.txn_messages = histogram("exactly_consumer_transaction_messages",
                                      "Messages consumed by one consumer transaction.",
                                      s, COUNT_BUCKETS)
        self.commit_seconds = histogram(
            "exactly_consumer_commit_seconds",
            "Latency of the store commit of a consumer transaction (start_commit).",
            s, LATENCY_BUCKETS)
        self.fenced = counter("exactly_consumer_fenced",
                              "Shards stopped because a newer instance fenced them off.", s)
        q = ("query",)
        self.spark_read = counter("exactly_spark_source_rows",
                                  "Rows a streaming query read from journal sources.", q)
        self.spark_written = counter("exactly_spark_sink_rows",
                                     "Rows a streaming query wrote to a journal sink.", q)
        self.spark_behind = gauge(
            "exactly_spark_source_bytes_behind",
            "Bytes of a streaming query's journal sources past its last micro-batch.", q)
        registry.register(keep(_Pulled()))

    def unregister(self) -> None:
        for collector in self._collectors:
            self._registry.unregister(collector)


# The enabled instruments, or None: the switch every record_* tests.
_on: _Instruments | None = None
_enable_lock: Final = threading.Lock()
_sources: list[Callable[[], Mapping[str, int]]] = []
# Open transactions seen by committed readers: owner -> journal -> (open
# spans, ns since the epoch of the oldest's first message or None, producers).
_spans: dict[object, dict[str, tuple[int, int | None, int]]] = {}
_spans_lock: Final = threading.Lock()
# Consumer shards serving in this process: owner -> (shard, measure), where
# measure(deadline) gives journal -> (lag bytes, lag seconds). Kept while
# metrics are off too (a shard may start before they are turned on).
_lags: dict[object, tuple[str, Callable[[float], Mapping[str, tuple[int, float]]]]] = {}
_lags_lock: Final = threading.Lock()


def enable(registry: CollectorRegistry | None = None) -> None:
    """Turn metrics on for this process, in ``registry`` (by default
    ``prometheus_client``'s global one). Idempotent; raises ``ImportError``
    with what to install when ``prometheus-client`` is missing."""
    global _on
    with _enable_lock:
        if _on is not None:
            return
        try:
            import prometheus_client
        except ImportError as exc:
            raise ImportError(
                "exactly's metrics need prometheus-client: pip install 'exactly[metrics]'"
            ) from exc
        _on = _Instruments(prometheus_client.REGISTRY if registry is None else registry)


def disable() -> None:
    """Turn metrics off again: the instruments leave their registry, and
    nothing is recorded until the next ``enable``."""
    global _on
    with _enable_lock:
        on, _on = _on, None
        if on is not None:
            on.unregister()
        with _spans_lock:
            _spans.clear()


def enabled() -> bool:
    """Whether metrics are on."""
    return _on is not None


def start_http_server(port: int, addr: str = "127.0.0.1") -> int:
    """Turn metrics on and serve them at ``http://addr:port/metrics`` from a
    daemon thread (``prometheus_client.start_http_server``); returns the
    port (the one chosen, with ``port=0``). Loopback by default: pass
    ``addr="0.0.0.0"`` for a Prometheus on another host."""
    enable()
    import prometheus_client

    server, _ = prometheus_client.start_http_server(port, addr)
    bound: int = server.server_port
    return bound


def counter_source(source: Callable[[], Mapping[str, int]]) -> None:
    """Register what reads counters a package keeps itself: ``source()``
    returns the current totals of names of ``COUNTED`` (summed over every
    source). Registered once, at import, by the package that counts."""
    _sources.append(source)


# -- recording: called by the packages, cheap while metrics are off ------------------


def record_batch(client: str, journal: str, count: int, nbytes: int, seconds: float,
                 failed: int) -> None:
    """A batch of ``count`` appends (``nbytes``) made durable in ``seconds``
    by a client of kind ``client``; ``failed`` appends of it failed."""
    on = _on
    if on is None:
        return
    if count:
        on.appends.labels(client, journal).inc(count)
        on.append_bytes.labels(client, journal).inc(nbytes)
        on.append_seconds.labels(client, journal).observe(seconds)
    if failed:
        on.append_failures.labels(client, journal).inc(failed)


def record_replay(journal: str, nbytes: int) -> None:
    """A committed reader replays ``nbytes`` of ``journal``."""
    on = _on
    if on is None:
        return
    on.replays.labels(journal).inc()
    on.replay_bytes.labels(journal).inc(nbytes)


def record_open_spans(owner: object, spans: Mapping[str, tuple[int, int | None, int]]) -> None:
    """What a committed reader (``owner``) knows, per journal: open
    transactions, when the oldest began (ns since the epoch, None if
    unknown) and producers tracked. Replaces what ``owner`` said before;
    ``forget_open_spans`` drops it."""
    if _on is None:
        return
    with _spans_lock:
        _spans[owner] = dict(spans)


def forget_open_spans(owner: object) -> None:
    """``owner`` reads no more (closed)."""
    if _on is None:
        return
    with _spans_lock:
        _spans.pop(owner, None)


def record_transaction(shard: str, messages: int, seconds: float, commit_seconds: float) -> None:
    """A consumer transaction of ``shard`` committed."""
    on = _on
    if on is None:
        return
    on.txns.labels(shard).inc()
    on.txn_seconds.labels(shard).observe(seconds)
    on.txn_messages.labels(shard).observe(messages)
    on.commit_seconds.labels(shard).observe(commit_seconds)


def record_fenced(shard: str) -> None:
    """``shard`` stopped: a newer instance fenced it off."""
    on = _on
    if on is not None:
        on.fenced.labels(shard).inc()


def report_source_lag(owner: object, shard: str,
                      measure: Callable[[float], Mapping[str, tuple[int, float]]]) -> None:
    """A consumer shard (``owner``) serves here: each scrape calls
    ``measure(deadline)`` for its lag, source journal -> (bytes, seconds),
    and ``measure`` returns by ``deadline`` (``time.monotonic()``) what it
    knows then. ``forget_source_lag`` drops it when the shard stops."""
    with _lags_lock:
        _lags[owner] = (shard, measure)


def forget_source_lag(owner: object) -> None:
    """The shard ``owner`` stopped serving here: its lag is no longer served."""
    with _lags_lock:
        _lags.pop(owner, None)


def record_spark_progress(query: str, read: int, written: int, behind: int | None) -> None:
    """A micro-batch of streaming ``query``: rows it read from journal
    sources and wrote to a journal sink, and the bytes its sources are
    behind (None if not reported)."""
    on = _on
    if on is None:
        return
    on.spark_read.labels(query).inc(read)
    on.spark_written.labels(query).inc(written)
    if behind is not None:
        on.spark_behind.labels(query).set(behind)


class _Pulled:
    """The collector of what is read when scraped: the components' own
    counters, the open transactions committed readers reported, and the lag
    of the consumer shards serving."""

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        totals = dict.fromkeys(COUNTED, 0)
        for source in _sources:
            for name, value in source().items():
                totals[name] += value
        for name, doc in COUNTED.items():
            yield CounterMetricFamily(name.removesuffix("_total"), doc, value=totals[name])
        with _spans_lock:
            reports = [dict(r) for r in _spans.values()]
        per: dict[str, list[Any]] = {}  # journal -> [spans, oldest, producers]
        for report in reports:
            for journal, (n, oldest, producers) in report.items():
                acc = per.setdefault(journal, [0, None, 0])
                acc[0] += n
                acc[2] += producers
                if oldest is not None and (acc[1] is None or oldest < acc[1]):
                    acc[1] = oldest
        spans = GaugeMetricFamily("exactly_sequencer_open_spans",
                                  "Open (uncommitted) transactions committed readers hold.",
                                  labels=("journal",))
        age = GaugeMetricFamily(
            "exactly_sequencer_oldest_open_span_seconds",
            "Age of the oldest open transaction committed readers hold (0 when none).",
            labels=("journal",))
        tracked = GaugeMetricFamily("exactly_sequencer_producers",
                                      "Producers committed readers track.", labels=("journal",))
        now = time.time_ns()
        for journal, (n, oldest, count) in sorted(per.items()):
            spans.add_metric((journal,), n)
            age.add_metric((journal,), 0.0 if oldest is None else max(0, now - oldest) / 1e9)
            tracked.add_metric((journal,), count)
        yield spans
        yield age
        yield tracked
        yield from _lag_families()


def _lag_families() -> Iterator[Any]:
    from prometheus_client.core import GaugeMetricFamily

    with _lags_lock:
        serving = list(_lags.values())
    deadline = time.monotonic() + SCRAPE_WAIT
    lags: dict[tuple[str, str], tuple[int, float]] = {}
    for shard, measure in serving:
        try:
            measured = measure(deadline)
        except Exception:
            continue  # a scrape serves what it can
        for journal, lag in measured.items():
            lags[(shard, journal)] = lag
    labels = ("shard", "journal")
    nbytes = GaugeMetricFamily("exactly_consumer_source_lag_bytes",
                               "Bytes of a source journal past a shard's last commit.",
                               labels=labels)
    seconds = GaugeMetricFamily(
        "exactly_consumer_source_lag_seconds",
        "While a shard is behind a source, the age of the last message it committed from it"
        " (0 once caught up).", labels=labels)
    for key, (b, s) in sorted(lags.items()):
        nbytes.add_metric(key, b)
        seconds.add_metric(key, s)
    yield nbytes
    yield seconds
