"""docs/spark.md stays true: its Python examples run, in order, as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.docblocks import code_blocks

DOC = Path(__file__).resolve().parents[2] / "docs" / "spark.md"


@pytest.mark.spark
def test_spark_guide_examples_run(spark: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """Every ```python block of docs/spark.md runs, sharing one namespace."""
    blocks = code_blocks(DOC)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "spark_guide"}
    for i, code in enumerate(blocks):
        exec(compile(code, f"docs/spark.md block {i + 1}", "exec"), namespace)
