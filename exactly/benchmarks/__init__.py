"""Reproducible benchmarks. ``exactly bench`` runs them all and prints a table.

Each benchmark measures a candidate against a baseline side by side in one
run and reports the ratio, since the machines are shared and noisy. To add
one, write ``exactly/benchmarks/bench_<name>.py`` with ``run(scale) -> list[Result]``
and list its module name in ``BENCHMARKS``.
"""

BENCHMARKS: tuple[str, ...] = (
    "bench_mixed",
    "bench_arrow",
    "bench_sequencer",
    "bench_journal_io",
    "bench_transient",
    "bench_framing",
    "bench_journal",
    "bench_consumer",
    "bench_broker",
    "bench_secured",
    "bench_members",
    "bench_spark",
    "bench_spark_broker",
    # Module names under ``benchmarks``, run in this order.
)
