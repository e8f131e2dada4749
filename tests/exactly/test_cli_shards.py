"""``exactly shards show``: a shard's checkpoint from its store, beside the
write heads of its sources (run as a user would, in subprocesses)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from consumer import Runner, ShardSpec
from journal import LocalJournalStore
from tests.consumer_support import NDJSON, CountingApp, make_input

SOURCES = ["in/part-0", "in/part-1"]
OUTPUTS = ["out/part-0", "out/part-1"]


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "exactly", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.fixture
def served(tmp_path: Path) -> Path:
    """A store of journals and a shard "count" that consumed them, in JSON
    and SQLite stores; then 20 more messages that it has not consumed."""
    with LocalJournalStore(tmp_path / "journals") as j:
        for name in SOURCES + OUTPUTS:
            j.create(name, NDJSON)
        make_input(j, SOURCES, 200, seed=1)
        for kind in (f"json:{tmp_path}/state/{{shard}}", f"sqlite:{tmp_path}/state.db"):
            app = CountingApp(kind, {"count": OUTPUTS})
            with Runner(j, app, [ShardSpec("count", SOURCES)]) as runner:
                runner.run_until_idle(timeout=60)
        make_input(j, SOURCES[:1], 20, seed=2, messy=False)
    return tmp_path


@pytest.mark.parametrize("store", ["state/count", "json:state/count", "state.db",
                                   "sqlite:state.db"])
def test_shows_offsets_lag_producers_and_intents(served: Path, store: str) -> None:
    """Offsets and lag per source, producers with open transactions, the ACK
    intents of the last commit; as JSON too."""
    r = run("--root", "journals", "shards", "show", "--store", store, "--json", cwd=served)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["shard"] == "count"
    with LocalJournalStore(served / "journals") as j:
        heads = {s: j.head(s) for s in SOURCES}
    lags = {s["journal"]: s["lag"] for s in doc["sources"]}
    assert lags["in/part-1"] == 0 and lags["in/part-0"] > 0  # 20 messages behind
    assert all(s["head"] == heads[s["journal"]] for s in doc["sources"])
    assert set(doc["ack_intents"]) == set(OUTPUTS)
    # make_input leaves some transactions never acknowledged: open spans
    assert any(p["open_since"] is not None for p in doc["producers"])
    text = run("--root", "journals", "shards", "show", "--store", store, cwd=served)
    assert text.returncode == 0, text.stderr
    assert "shard count" in text.stdout and "with a transaction open" in text.stdout
    assert f"{lags['in/part-0']:,}" in text.stdout


def test_without_journals_the_lag_is_unknown(served: Path) -> None:
    """With no journal store at hand, offsets are shown and the heads are '?'."""
    r = run("shards", "show", "--store", str(served / "state.db"), cwd=served / "state")
    assert r.returncode == 0, r.stderr
    assert "?" in r.stdout and "write heads unknown" in r.stdout


@pytest.mark.parametrize(("args", "error"), [
    (["--store", "nowhere.db"], "no store at nowhere.db"),
    (["--store", "state.db", "other"], "no shard other in state.db (it holds: count)"),
    (["--store", "journals"], "journals holds no JSONFileStore state file"),
])
def test_mistakes_are_one_line(served: Path, args: list[str], error: str) -> None:
    """A store that is not there, a shard it does not hold: one line, exit 1."""
    r = run("shards", "show", *args, cwd=served)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.splitlines() == [f"exactly: error: {error}"], r.stderr
