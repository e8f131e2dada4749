"""Every benchmark still runs (at a tiny scale), so none silently rots; and
``exactly bench`` prints the table."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from exactly.benchmarks import BENCHMARKS
from exactly.benchmarks._harness import Result, format_table

# Benchmarks that start Spark run with the Spark tests; the broker benchmark
# starts a Gazette cluster, whose binaries the gazette fixtures provide.
SPARK = {name for name in BENCHMARKS if "spark" in name}
GAZETTE = {"bench_broker", "bench_secured", "bench_members"}


def _check_runs(name: str) -> None:
    results = importlib.import_module(f"exactly.benchmarks.{name}").run(0.01)
    assert results and all(isinstance(r, Result) for r in results)
    for r in results:
        assert r.value > 0, r
        assert r.baseline is None or r.baseline > 0, r
    assert format_table(results).count("\n") == len(results) + 1


@pytest.mark.parametrize("name", sorted(set(BENCHMARKS) - SPARK - GAZETTE))
def test_benchmark_runs_at_small_scale(name: str) -> None:
    """run(0.01) returns rows with positive figures and sane baselines."""
    _check_runs(name)


@pytest.mark.parametrize("name", sorted(GAZETTE))
def test_broker_benchmark_runs_at_small_scale(name: str, gazette_binaries: object,
                                              s3_server: object) -> None:
    """The broker benchmarks start their own clusters (and S3-compatible
    server, built for s3_server) and return their rows."""
    _check_runs(name)


def test_bench_command_prints_a_table() -> None:
    """exactly bench --quick --only NAME prints the table's header and rows."""
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "bench", "--quick", "--only", "bench_sequencer"],
        capture_output=True, text=True, timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[0].split()[:2] == ["benchmark", "value"]
    assert "sequencer" in r.stdout


def test_unknown_benchmark_is_a_clear_error() -> None:
    """Naming a benchmark that does not exist fails with one line."""
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "bench", "--only", "nope"],
        capture_output=True, text=True, timeout=60,
    )
    assert r.returncode == 1 and "unknown benchmark nope" in r.stderr


def test_mixed_workload_rows_say_why_go_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without Go, the rows measured against Gazette's Go Sequencer are still
    there, with no baseline, and say why."""
    import exactly.benchmarks.bench_mixed as mixed

    monkeypatch.setattr(mixed, "_go_program", lambda: (None, "no `go` on PATH"))
    rows = {r.name: r for r in mixed.run(0.001)}
    missing = [name for name in rows if "no Go baseline: no `go` on PATH" in name]
    assert len(missing) == 2 and all(rows[name].baseline is None for name in missing)
