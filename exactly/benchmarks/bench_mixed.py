"""The mixed workload, side by side with Gazette's Go ``message`` package.

Workload (``_workload.mixed_frames``): 1M envelopes at scale 1, 100
producers, 2 journals, 90% OUTSIDE_TXN messages, 10% in transactions of 1 to
8 messages (each then its ACK), 1% of frames duplicated (a retried append).
The same frames are written to a ``LocalJournalStore`` for this side and to
files for the Go program ``exactly/benchmarks/go_sequencer`` (built on the fly with
``exactly.localcluster.build_go_program``; one core: ``GOMAXPROCS=1``). Runs
alternate: Go, then ours, three times; the best of each is kept.

Rows:

- Sequencer alone: ``queue_uncommitted`` then ``deque_committed`` until None,
  per envelope (decoded beforehand: ``JsonDocument``), beside Go's
  ``QueueUncommitted`` + ``Step`` on the same envelopes (target 0.5: each
  call crosses into CPython, so 1.0 is out of reach through this API);
- ``ReadCommittedIter`` over the store's journals, beside Go's JSON framing
  and Sequencer over the same bytes in memory (target 1.5);
- read uncommitted over a bare ``orjson.loads`` loop of the same lines
  (target 0.8), and read committed over read uncommitted (target 0.9);
- memory: peak RSS of a fresh process reading committed a journal, and
  one 10 times larger (O(ring), not O(journal): within a few MB).

Without Go, the Go rows say why their baseline is missing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

from exactly.benchmarks._harness import Result, interleaved
from exactly.benchmarks._workload import mixed_frames
from journal import LocalJournalStore, read_all
from message import (
    Envelope,
    JsonDocument,
    MustStartReplay,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
)

NDJSON = {"content-type": "application/x-ndjson"}
JOURNALS = ("bench/mixed-0", "bench/mixed-1")
GO_SOURCE = Path(__file__).resolve().parent / "go_sequencer"


def _new_doc(_spec: object) -> JsonDocument:
    return JsonDocument()


def _write(base: Path, n: int, seed: int = 1) -> tuple[Path, list[list[bytes]], bytes]:
    """The workload in a store (and, for Go, in files under ``base``)."""
    frames, order = mixed_frames(n, seed=seed)
    root = base / "store"
    with LocalJournalStore(root) as store:
        for j, name in enumerate(JOURNALS):
            store.create(name, NDJSON)
            data = b"".join(frames[j])
            (base / f"j{j}.ndjson").write_bytes(data)
            for start in range(0, len(frames[j]), 20_000):  # whole frames per append
                store.append(name, b"".join(frames[j][start : start + 20_000]))
        store.flush()
    (base / "order").write_bytes(order)
    return root, frames, order


def _sequence_alone(envs: list[Envelope], by_journal: dict[str, list[Envelope]]) -> int:
    seq = Sequencer(buffer=4096)
    queue, deque = seq.queue_uncommitted, seq.deque_committed
    n = 0
    for env in envs:
        queue(env)
        while True:
            try:
                if deque() is None:
                    break
            except MustStartReplay as need:  # served from memory, as Go's are
                seq.start_replay(e for e in by_journal[need.journal]
                                 if need.begin <= e.begin and e.end <= need.end)
                continue
            n += 1
    return n


def _read_committed(store: LocalJournalStore) -> int:
    n = 0
    for name in JOURNALS:
        for _ in ReadCommittedIter(store, name, _new_doc):
            n += 1
    return n


def _read_uncommitted(store: LocalJournalStore) -> int:
    n = 0
    for name in JOURNALS:
        for _ in ReadUncommittedIter(store, name, _new_doc):
            n += 1
    return n


def _loads(lines: list[list[bytes]]) -> None:
    loads = orjson.loads
    for journal in lines:
        for line in journal:
            loads(line)


def _go_program() -> tuple[Path | None, str]:
    """The Go baseline program, built on the fly, or None and why not."""
    from exactly.localcluster import ClusterError, build_go_program

    try:
        return build_go_program(GO_SOURCE, "go-sequencer-bench"), ""
    except ClusterError as exc:
        return None, str(exc).splitlines()[0]


def _run_go(program: Path, base: Path) -> dict[str, float]:
    out = subprocess.run([str(program), str(base)], capture_output=True, text=True, check=True,
                         env={**os.environ, "GOMAXPROCS": "1"}, timeout=600)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def peak_rss(root: Path, journal: str) -> None:
    """In a fresh process: read ``journal`` committed, print the peak RSS (kB).

    Linux's VmHWM is that of this program alone; ``ru_maxrss`` would count
    the pages of the (large) benchmark process it was started from."""
    import resource

    with LocalJournalStore(root) as store:
        for _ in ReadCommittedIter(store, journal, _new_doc):
            pass
    try:
        with open("/proc/self/status") as status:
            hwm = [line.split()[1] for line in status if line.startswith("VmHWM:")]
        print(hwm[0])
    except (OSError, IndexError):
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)


def _rss_of(root: Path, journal: str) -> float:
    code = ("import sys; from exactly.benchmarks.bench_mixed import peak_rss;"
            " peak_rss(*sys.argv[1:])")
    out = subprocess.run([sys.executable, "-c", code, str(root), journal], capture_output=True,
                         text=True, check=True, timeout=600)
    return int(out.stdout.split()[-1]) / 1024


def _memory_row(base: Path, n: int) -> Result:
    small, large = max(2000, n // 10), max(20_000, n)
    sizes = {}
    for name, count in (("small", small), ("large", large)):
        frames, _ = mixed_frames(count, producers=100, journals=1, seed=7)
        root = base / f"rss-{name}"
        with LocalJournalStore(root) as store:
            store.create("bench/rss", NDJSON)
            for start in range(0, len(frames[0]), 20_000):
                store.append("bench/rss", b"".join(frames[0][start : start + 20_000]))
            store.flush()
        sizes[name] = min(_rss_of(root, "bench/rss") for _ in range(2))
    # Within a few MB: a ratio of at most 1.1 (the interpreter and the
    # libraries alone take about 40 MB).
    return Result(
        f"memory: peak RSS reading committed {large:,} envelopes",
        sizes["large"], "MB",
        baseline_name=f"{small:,} envelopes", baseline=sizes["small"], target=1.1,
        higher_is_better=False, note=f"{sizes['large'] - sizes['small']:+.1f} MB",
    )


def run(scale: float) -> list[Result]:
    n = max(5000, int(1_000_000 * scale))
    program, why = _go_program()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        root, _, order = _write(base, n)
        with LocalJournalStore(root) as store:
            envs_of = {name: list(ReadUncommittedIter(store, name, _new_doc))
                       for name in JOURNALS}
            pos = [0, 0]
            envs = []
            for j in order:
                envs.append(envs_of[JOURNALS[j]][pos[j]])
                pos[j] += 1
            go: dict[str, float] = {"sequencer": 0.0, "read_per_sec": 0.0}
            ours = {"sequencer": float("inf"), "read": float("inf")}
            for _ in range(3):
                if program is not None:
                    g = _run_go(program, base)
                    go = {k: max(go.get(k, 0.0), v) for k, v in g.items()}
                t0 = time.perf_counter()
                _sequence_alone(envs, envs_of)
                ours["sequencer"] = min(ours["sequencer"], time.perf_counter() - t0)
                t0 = time.perf_counter()
                _read_committed(store)
                ours["read"] = min(ours["read"], time.perf_counter() - t0)
            del envs, envs_of
            # The baseline's lines as a reader of the journal gets them:
            # split from its bytes (contiguous in memory), as in bench_journal_io.
            lines = []
            for name in JOURNALS:
                with store.read(name) as r:
                    lines.append(read_all(r).splitlines(keepends=True))
            reads = interleaved({
                "uncommitted": lambda: _read_uncommitted(store),
                "committed": lambda: _read_committed(store),
                "loads": lambda: _loads(lines),
            }, repeat=3)
        memory = _memory_row(base, n)

    total = len(order)

    def against_go(name: str, value: float, key: str, baseline_name: str,
                   target: float) -> Result:
        if program is None:
            return Result(f"{name} (no Go baseline: {why})", value, "env/s")
        return Result(name, value, "env/s", baseline_name=baseline_name, baseline=go[key],
                      target=target)

    return [
        against_go("mixed: Sequencer alone, queue + deque per envelope",
                   total / ours["sequencer"], "sequencer", "Go QueueUncommitted + Step", 0.5),
        against_go("mixed: ReadCommittedIter, NDJSON journals (store)",
                   total / ours["read"], "read_per_sec",
                   "Go JSON framing + Sequencer, memory", 1.5),
        Result("mixed: read uncommitted vs orjson.loads", total / reads["uncommitted"], "msg/s",
               baseline_name="orjson.loads loop", baseline=total / reads["loads"], target=0.8),
        Result("mixed: read committed vs read uncommitted", total / reads["committed"], "env/s",
               baseline_name="read uncommitted", baseline=total / reads["uncommitted"],
               target=0.9),
        memory,
    ]


def _describe(results: list[Any]) -> str:
    from exactly.benchmarks._harness import format_table

    return format_table(results)


if __name__ == "__main__":
    t0 = time.perf_counter()
    print(_describe(run(float(os.environ.get("BENCH_SCALE", "1")))))
    print(f"({time.perf_counter() - t0:.1f} s)")
