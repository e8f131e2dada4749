"""The demo behind ``exactly demo`` runs end to end and verifies itself."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from exactly._demo import run_demo


@pytest.mark.spark
def test_demo_computes_what_the_producers_committed(spark: Any, tmp_path: Path) -> None:
    """Every computed figure matches the producers' reports; the naive counts do not."""
    out = io.StringIO()
    assert run_demo(tmp_path / "demo", out=out, progress_every=0.2) == 0, out.getvalue()
    text = out.getvalue()
    assert "MISMATCH" not in text and "demo passed" in text
    # Spark is never silent for long: its stages' progress is shown as it works.
    assert any(line.split("] ", 1)[1].startswith("Spark: stage") for line in text.splitlines())
    assert (tmp_path / "demo" / "parquet" / "latest_per_session").is_dir()
    naive = next(line for line in text.splitlines() if "naive read-uncommitted" in line)
    assert "(+0:" not in naive


def test_demo_refuses_to_replace_a_directory_it_did_not_create(tmp_path: Path) -> None:
    """A non-empty directory without the demo's marker is left alone."""
    (tmp_path / "precious.txt").write_text("keep me")
    with pytest.raises(ValueError, match="not a demo store"):
        run_demo(tmp_path, out=io.StringIO())
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_progress_lines_say_what_is_going_on() -> None:
    """While a slow step runs, a line every few seconds says it is still going on."""
    import time

    from exactly._demo import Progress

    out = io.StringIO()
    with Progress(out, time.monotonic(), "starting Spark", every=0.05):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all("... starting Spark (" in line for line in lines)


@pytest.mark.spark
@pytest.mark.slow
def test_cluster_demo_runs_and_stops_everything(gazette_binaries: Any, tmp_path: Path) -> None:
    """`exactly demo --cluster` starts a Gazette and a Spark standalone cluster,
    tells the same story on them, passes its verification, shows progress, and
    stops every process it started."""
    import json
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    store = tmp_path / "demo-cluster"
    r = subprocess.run(
        [sys.executable, "-m", "exactly", "demo", "--cluster", "--store", str(store)],
        capture_output=True, text=True, timeout=900, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "demo passed" in r.stdout and "MISMATCH" not in r.stdout
    assert "Gazette cluster up" in r.stdout and "Spark standalone cluster up" in r.stdout
    assert "clusters stopped" in r.stdout
    pids = []
    gazette = json.loads((store / "gazette" / "cluster.json").read_text())
    pids += [p["pid"] for p in [gazette["etcd"], *gazette["brokers"]]]
    spark = json.loads((store / "spark" / "spark-cluster.json").read_text())
    pids += [p["pid"] for p in [spark["master"], *spark["workers"]]]
    for pid in pids:  # gone, or the PID reused by something else
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        assert not any(w in cmdline for w in (b"gazette", b"etcd", b"spark")), pid


@pytest.mark.spark
@pytest.mark.slow
def test_ctrl_c_while_spark_works_stops_the_demo_quietly(tmp_path: Path) -> None:
    """Ctrl-C while the demo's Spark job runs: its jobs are cancelled and it
    stops within seconds, status 130, with no traceback of py4j's (PySpark's
    own handler interrupts the JVM call it runs in), and its JVM ends."""
    import os
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen([sys.executable, "-m", "exactly", "demo"], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(root),
                                 "EXACTLY_PROGRESS_EVERY": "0.5"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        # A progress line of the Spark job's block: its active stages, or, between
        # two jobs, that Spark is still working (either means a job is under way).
        for line in proc.stdout:
            if "Spark working" in line or "Spark: stage" in line:
                break
        else:
            raise AssertionError(f"no Spark job: {proc.communicate()[1]}")
        jvms = _descendants(proc.pid)
        assert jvms, "Spark's JVM is not a child of the demo"
        proc.send_signal(signal.SIGINT)
        began = time.monotonic()
        out, err = proc.communicate(timeout=60)
        assert time.monotonic() - began < 30
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "py4j" not in err, err
    assert "demo passed" not in out
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{pid}").exists() for pid in jvms):
        assert time.monotonic() < deadline, f"left running: {jvms}"
        time.sleep(0.2)


def _descendants(pid: int) -> list[int]:
    """The processes under ``pid`` (Linux's /proc)."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            found += [child, *_descendants(child)]
    return found
