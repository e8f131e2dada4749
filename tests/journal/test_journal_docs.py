"""The journal documentation's examples run."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path

import journal
from tests.docblocks import code_blocks

ROOT = Path(__file__).resolve().parents[2]


def test_journal_package_doctest() -> None:
    """The example in the journal package docstring runs and prints what it shows."""
    failures, tried = doctest.testmod(journal)
    assert tried > 0 and failures == 0


def test_journal_store_doc_examples_run(tmp_path: Path) -> None:
    """Every Python block of docs/journal-store.md runs as written (in a scratch directory)."""
    blocks = code_blocks("docs/journal-store.md")
    assert blocks
    for code in blocks:
        result = subprocess.run(
            [sys.executable, "-c", code],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
            check=False,
        )
        assert result.returncode == 0, result.stderr
