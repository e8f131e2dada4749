"""docs/consumer.md stays true: its word count (a module, ``wordcount.py``,
and a program, ``count.py``) runs as written and prints what its comments
say, and its application serves several shards at once correctly."""

from __future__ import annotations

import importlib.util
import os
import random
import re
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import pytest

from consumer import Runner, ShardSpec
from journal import LocalJournalStore
from message import JsonDocument, Publisher, modulo_mapping
from tests.docblocks import code_blocks

ROOT = Path(__file__).resolve().parents[2]


def _blocks() -> dict[str, str]:
    """The doc's Python blocks that name their file on their first line."""
    out = {}
    for block in code_blocks("docs/consumer.md"):
        first = block.splitlines()[0]
        if re.fullmatch(r"# \w+\.py", first):
            out[first[2:]] = block
    return out


def _wordcount(tmp_path: Path) -> ModuleType:
    path = tmp_path / "wordcount.py"
    path.write_text(_blocks()["wordcount.py"])
    spec = importlib.util.spec_from_file_location("doc_wordcount", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_word_count_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    """The example counts each word once, and a second run only the new line."""
    blocks = _blocks()
    assert set(blocks) == {"wordcount.py", "count.py"}
    (tmp_path / "wordcount.py").write_text(blocks["wordcount.py"])
    (tmp_path / "count.py").write_text(blocks["count.py"])
    expected = [line[2:] for line in blocks["count.py"].splitlines()
                if re.match(r"# [\[{]", line)]
    r = subprocess.run([sys.executable, "count.py"], cwd=tmp_path, capture_output=True,
                       text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == expected


def test_word_count_application_serves_two_shards_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One WordCount serves two shards, each on its own thread, as
    ``exactly serve`` would with the doc's shards.yaml: each shard's table
    holds exactly the words of its own partition, however their
    transactions interleave."""
    monkeypatch.setenv("WORDCOUNT_STATE", str(tmp_path / "state"))
    app = _wordcount(tmp_path).WordCount()
    rng = random.Random(7)
    words = [f"w{i}" for i in range(50)]
    expected = [Counter(), Counter()]
    ndjson = {"content-type": "application/x-ndjson"}
    with LocalJournalStore(tmp_path / "journals") as journals:
        parts = [journals.create(f"lines/part-{i}", ndjson) for i in range(2)]
        journals.create("counts", ndjson)
        pub = Publisher(journals)
        to_part = [modulo_mapping(lambda d: "", lambda p=p: [p]) for p in parts]
        for n in range(20_000):
            i = n % 2
            text = " ".join(rng.choices(words, k=3))
            expected[i].update(text.split())
            pub.publish_committed(to_part[i], JsonDocument(text=text))
        journals.flush()
        specs = [ShardSpec(f"count-{i + 1}", sources=[f"lines/part-{i}"]) for i in range(2)]
        # The shards' threads take turns often, as on a busy host.
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-5)
        try:
            with Runner(journals, app, specs) as runner:
                runner.run_until_idle(timeout=120)
        finally:
            sys.setswitchinterval(interval)
    for i in range(2):
        with sqlite3.connect(tmp_path / "state" / f"count-{i + 1}.db") as db:
            assert Counter(dict(db.execute("SELECT word, n FROM words"))) == expected[i]
