"""Committed reads as Arrow (``message.arrow.ReadCommittedArrow``) against
Arrow's own JSON reader.

Workload (``_workload.mixed_frames``, one journal): 500k NDJSON frames at
scale 1 from 100 producers, 90% OUTSIDE_TXN, 10% in transactions of 1 to 8
messages, each then its ACK, and 1% of the frames appended twice.

- ``committed read / pyarrow.json.read_json``: rows/s of the committed
  reader over the journal in a ``LocalJournalStore`` (reading, parsing,
  sequencing, ACKs and duplicates dropped, rows in commit order) beside
  ``pyarrow.json.read_json`` parsing the same bytes, already in memory, with
  one thread (target 0.7: Arrow's parse is the floor of NDJSON to Arrow).
- memory: peak RSS of a fresh process reading a journal committed as
  Arrow batches, and one 10 times larger (bounded by the batch size, not
  the journal: target within 1.5 times).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from exactly.benchmarks._harness import Result, interleaved
from exactly.benchmarks._workload import mixed_frames
from journal import LocalJournalStore

NDJSON = {"content-type": "application/x-ndjson"}
JOURNAL = "bench/arrow"

_RSS_SCRIPT = """
import resource, sys
from journal import LocalJournalStore
from message.arrow import ReadCommittedArrow
rows = 0
with LocalJournalStore(sys.argv[1]) as store:
    for batch in ReadCommittedArrow(store, sys.argv[2]):
        rows += batch.num_rows
# VmHWM is this program's alone; ru_maxrss would count the pages of the
# (large) benchmark process it was started from.
try:
    with open("/proc/self/status") as status:
        kb = [line.split()[1] for line in status if line.startswith("VmHWM:")][0]
except (OSError, IndexError):
    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(rows, kb)
"""


def _write(root: Path, frames: list[bytes], copies: int = 1) -> None:
    with LocalJournalStore(root) as store:
        store.create(JOURNAL, NDJSON)
        for _ in range(copies):
            for start in range(0, len(frames), 20_000):  # whole frames per append
                store.append(JOURNAL, b"".join(frames[start : start + 20_000]))
        store.flush()


def _peak_rss(root: Path) -> tuple[int, float]:
    """Rows read and peak RSS (MB) of a fresh process reading the journal."""
    out = subprocess.run(
        [sys.executable, "-c", _RSS_SCRIPT, str(root), JOURNAL],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    return int(out[0]), int(out[1]) / 1024


def run(scale: float) -> list[Result]:
    import pyarrow as pa
    import pyarrow.json as pa_json

    from message.arrow import ReadCommittedArrow

    n = max(20_000, int(500_000 * scale))
    frames, _ = mixed_frames(n, journals=1)
    data = b"".join(frames[0])
    tmp = Path(tempfile.mkdtemp(prefix="bench-arrow-"))
    try:
        _write(tmp / "one", frames[0])
        schema = pa.schema([("n", pa.int64()), ("page", pa.string()), ("session", pa.string())])
        rows: dict[str, int] = {}
        with LocalJournalStore(tmp / "one") as store:

            def ours() -> None:
                rows["ours"] = ReadCommittedArrow(store, JOURNAL, schema=schema).read_all().num_rows

            def arrow() -> None:
                table = pa_json.read_json(
                    pa.BufferReader(data),
                    read_options=pa_json.ReadOptions(use_threads=False, block_size=8 << 20),
                )
                rows["arrow"] = table.num_rows

            ours()  # warm up: imports and the page cache are not throughput
            times = interleaved({"ours": ours, "arrow": arrow}, repeat=5 if scale >= 0.5 else 2)
        # Memory: the same frames, and ten times as many.
        small_n = max(20_000, n // 5)
        _write(tmp / "small", frames[0][:small_n])
        _write(tmp / "large", frames[0][:small_n], copies=10)
        small_rows, small_rss = _peak_rss(tmp / "small")
        large_rows, large_rss = _peak_rss(tmp / "large")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    frames_n = len(frames[0])
    return [
        Result("arrow: committed read vs pyarrow.json.read_json (same bytes, 1 thread)",
               frames_n / times["ours"], "frames/s", baseline_name="read_json",
               baseline=frames_n / times["arrow"], target=0.7,
               note=f"{rows['ours']:,} of {frames_n:,} rows committed"),
        Result("arrow: peak RSS, journal 10x larger",
               large_rss, "MB", baseline_name=f"{small_rows:,} rows",
               baseline=small_rss, target=1.5, higher_is_better=False,
               note=f"{large_rows:,} rows"),
    ]
