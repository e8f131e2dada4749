"""docs/guide.md runs: its Python blocks, in order, in one namespace."""

from __future__ import annotations

from pathlib import Path

from tests.docblocks import code_blocks

GUIDE = Path(__file__).resolve().parent.parent / "docs" / "guide.md"


def test_guide_blocks_run_in_order(capsys) -> None:
    """Every ```python block of the guide runs, and its assertions hold."""
    blocks = code_blocks(GUIDE)
    assert len(blocks) >= 6
    namespace: dict[str, object] = {}
    for block in blocks:
        exec(compile(block, str(GUIDE), "exec"), namespace)
    out = capsys.readouterr().out
    assert "orders/part-0" in out and "frames:" in out
