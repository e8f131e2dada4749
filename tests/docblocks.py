"""The fenced code blocks of the project's docs, for the tests that run them."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def code_blocks(doc: str | Path, lang: str = "python") -> list[str]:
    """The ```` ```lang ```` blocks of ``doc`` (a Path, or a path from the
    repository's root such as ``"docs/consumer.md"``), in order."""
    path = doc if isinstance(doc, Path) else ROOT / doc
    return re.findall(rf"```{re.escape(lang)}\n(.*?)```", path.read_text(), re.S)
