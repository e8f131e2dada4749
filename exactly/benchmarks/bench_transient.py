"""Transient messages (``LocalJournalStore.emit``) beside appends.

Four follower processes follow one journal with ``transient=True``. Then,
from this process:

- appends, each waited for, one every 2 ms: the follow latency of an
  append (commit to delivery in another process);
- emits, one every 2 ms: the emit-to-follower latency (goal: p99 below the
  append's);
- emits as fast as one thread makes them: emits per second with four
  followers listening.

Each message carries ``time.perf_counter()`` of its sending (a clock every
process of the machine shares); the followers report the delays they saw.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from exactly.benchmarks._harness import Result
from journal import LocalJournalStore
from message import JsonDocument, Publisher

J = "bench/transient"
NDJSON = {"content-type": "application/x-ndjson"}
FOLLOWERS = 4

_FOLLOWER = r"""
import json, sys, time
from journal import LocalJournalStore
from message import JsonDocument, ReadUncommittedIter
with LocalJournalStore(sys.argv[1]) as store:
    it = ReadUncommittedIter(store, "bench/transient", lambda _s: JsonDocument(),
                             block=True, transient=True)
    print("ready", flush=True)
    stored, emitted = [], []
    for env in it:
        now = time.perf_counter()
        doc = env.message
        if doc.get("stop"):
            break
        if "t" in doc:
            (emitted if env.transient else stored).append(now - doc["t"])
    print(json.dumps({"stored": stored, "emitted": emitted, "lost": it.transient_lost}),
          flush=True)
    it.close()
"""


def _to(_msg: object) -> tuple[str, str]:
    return J, "application/x-ndjson"


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * q))]


def run(scale: float) -> list[Result]:
    paced = max(50, int(500 * scale))
    burst = max(1000, int(100_000 * scale))
    root = Path(__file__).resolve().parents[2]
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "PYTHONPATH": path}
    with tempfile.TemporaryDirectory() as tmp, LocalJournalStore(tmp) as store:
        store.create(J, NDJSON)
        followers = [
            subprocess.Popen([sys.executable, "-c", _FOLLOWER, tmp], env=env,
                             stdout=subprocess.PIPE, text=True)
            for _ in range(FOLLOWERS)
        ]
        try:
            for f in followers:
                assert f.stdout is not None
                if f.stdout.readline().strip() != "ready":
                    raise RuntimeError("a follower did not start")
            pub = Publisher(store)
            for _ in range(paced):
                pub.publish_committed(_to, JsonDocument(t=time.perf_counter())).result()
                time.sleep(0.002)
            for _ in range(paced):
                pub.emit(_to, JsonDocument(t=time.perf_counter()))
                time.sleep(0.002)
            frame = b'{"n": 1, "page": "/products/00012"}\n'
            t0 = time.perf_counter()
            for _ in range(burst):
                store.emit(J, frame)
            rate = burst / (time.perf_counter() - t0)
            time.sleep(0.5)
            pub.publish_committed(_to, JsonDocument(stop=True)).result()
            reports = [json.loads(f.communicate(timeout=300)[0].splitlines()[-1])
                       for f in followers]
        finally:
            for f in followers:
                if f.poll() is None:
                    f.kill()
                    f.wait()
    stored = [x for r in reports for x in r["stored"]]
    emitted = [x for r in reports for x in r["emitted"]]
    lost = sum(r["lost"] for r in reports)
    ms = 1e3
    return [
        Result(f"emits/s, {FOLLOWERS} follower processes listening", rate, "msg/s",
               note=f"followers lost {lost:,} of {FOLLOWERS * burst:,} burst emits"),
        Result(f"emit -> follower latency p50 ({FOLLOWERS} followers)",
               statistics.median(emitted) * ms, "ms",
               baseline_name="append p50", baseline=statistics.median(stored) * ms,
               target=1.0, higher_is_better=False),
        Result(f"emit -> follower latency p99 ({FOLLOWERS} followers)",
               _pct(emitted, 0.99) * ms, "ms",
               baseline_name="append p99", baseline=_pct(stored, 0.99) * ms,
               target=1.0, higher_is_better=False),
    ]
