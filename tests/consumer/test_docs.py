"""docs/consumer.md stays true: its word-count program runs as written and
prints what its comments say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_word_count_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    """The example counts each word once, and a second run only the new line."""
    text = (ROOT / "docs" / "consumer.md").read_text()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S)
              if "class WordCount" in b]
    assert len(blocks) == 1
    expected = [line[2:] for line in blocks[0].splitlines()
                if re.match(r"# [\[{]", line)]
    r = subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == expected
