"""The demo behind ``exactly demo`` runs end to end and verifies itself."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from pipeline.demo import run_demo


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

    from pipeline.demo import _Progress

    out = io.StringIO()
    with _Progress(out, time.monotonic(), "starting Spark", every=0.05):
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 3 and all("... starting Spark (" in line for line in lines)
