"""Documentation stays true: the API reference is current, and the code in the
README and the package docstrings runs."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import pytest

import message
from tests.docblocks import code_blocks

ROOT = Path(__file__).resolve().parent.parent


def test_api_reference_is_current() -> None:
    """docs/api.md is what docs/gen_api.py generates from the docstrings."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "gen_api.py"), "--check"], cwd=ROOT
    )
    assert result.returncode == 0, "docs/api.md is stale: run python docs/gen_api.py"


def test_message_tour_doctests() -> None:
    """The examples of the message package's guided tour run."""
    failures, tried = doctest.testmod(message, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


def test_consumer_tour_doctests() -> None:
    """The examples of the consumer package's guided tour run."""
    import consumer

    failures, tried = doctest.testmod(consumer, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0


def _run_readme_blocks(tmp_path: Path, *, spark: bool) -> None:
    blocks = code_blocks("README.md")
    assert blocks
    if not spark:
        blocks = [b for b in blocks if "import pipeline" not in b]
        assert blocks
    for code in blocks:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert result.returncode == 0, result.stderr


def test_readme_python_example_runs(tmp_path: Path) -> None:
    """The README's Python example runs as written (in a scratch directory)."""
    _run_readme_blocks(tmp_path, spark=False)


@pytest.mark.spark
def test_readme_spark_example_runs(tmp_path: Path) -> None:
    """The README's Spark example runs as written, on what its Python
    example stored."""
    _run_readme_blocks(tmp_path, spark=True)


def test_operations_python_example_runs(tmp_path: Path) -> None:
    """docs/operations.md's metrics example runs as written (its Spark
    listener's lines go in a driver program, beside its session)."""
    pytest.importorskip("prometheus_client")
    blocks = [b for b in code_blocks("docs/operations.md") if "spark.streams" not in b]
    assert blocks
    for code in blocks:
        result = subprocess.run(
            [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120,
        )
        assert result.returncode == 0, result.stderr


def test_spark_tests_skip_without_the_spark_extra(tmp_path: Path) -> None:
    """Without pyspark and pyarrow, Spark tests are skipped with one reason
    and the modules importing the pipeline are not collected: no error."""
    (tmp_path / "sitecustomize.py").write_text(
        "import importlib.abc, sys\n"
        "class _Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name.split('.')[0] in ('pyspark', 'pyarrow'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, _Hide())\n"
    )
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests",
         "-k", "test_uuid or spark_cluster or spark_source"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"},
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    assert "4 Spark test modules not collected" in r.stdout
    assert "skipped" in r.stdout and "error" not in r.stdout.lower()


def test_journal_store_python_examples_run(tmp_path: Path) -> None:
    """docs/journal-store.md's examples run as written, and again (each
    makes a store of its own)."""
    blocks = code_blocks("docs/journal-store.md")
    assert len(blocks) >= 3
    for _ in range(2):
        for code in blocks:
            result = subprocess.run(
                [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)},
                timeout=120,
            )
            assert result.returncode == 0, result.stderr
