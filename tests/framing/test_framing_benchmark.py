"""The framing benchmark runs, quickly, and reports what it promises."""

from __future__ import annotations

from exactly.benchmarks import BENCHMARKS, bench_framing


def test_benchmark_is_listed() -> None:
    """``exactly bench`` runs the framing benchmark."""
    assert "bench_framing" in BENCHMARKS


def test_benchmark_runs_at_small_scale() -> None:
    """run(0.01) returns positive figures, and the NDJSON decode row carries
    its orjson baseline and 0.6 target."""
    results = bench_framing.run(0.01)
    assert results
    for r in results:
        assert r.value > 0 and r.unit == "msg/s"
        assert r.baseline is None or r.baseline > 0
    headline = results[0]
    assert "NDJSON decode" in headline.name
    assert headline.baseline_name == "orjson.loads loop"
    assert headline.target == 0.6 and headline.higher_is_better


def test_documents_are_100_byte_lines() -> None:
    """The NDJSON workload is lines of exactly 100 bytes."""
    import orjson

    for doc in bench_framing.documents(50):
        assert len(orjson.dumps(doc)) + 1 == bench_framing.LINE_LENGTH
