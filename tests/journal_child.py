"""A child process for the journal tests: appends or follows, until killed.

    python -m tests.journal_child append ROOT JOURNAL CHILD_ID FRAGMENT_SIZE REPORT [COUNT]
    python -m tests.journal_child follow ROOT JOURNAL REPORT

``append`` appends self-checking records (see ``encode_record``) in bursts,
many in flight at once, and writes ``"<child> <seq> <begin> <end>\\n"`` to
REPORT as each append's future resolves, so a parent that kills it knows
exactly which appends were acknowledged. With COUNT it stops after COUNT
records and exits 0.

``follow`` reads the journal from offset 0 with ``block=True``, checks each
record, and writes the offset reached to REPORT after each chunk.
"""

from __future__ import annotations

import hashlib
import os
import random
import struct
import sys
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Final

# Record: magic, child id, seq, payload length; payload; CRC-32 of all before it.
HEADER: Final = struct.Struct(">4sHII")
MAGIC: Final = b"REC!"
CRC: Final = struct.Struct(">I")


def payload(child: int, seq: int, size: int) -> bytes:
    pattern = hashlib.sha256(b"%d:%d" % (child, seq)).digest()
    return (pattern * (size // len(pattern) + 1))[:size]


def encode_record(child: int, seq: int, size: int) -> bytes:
    body = HEADER.pack(MAGIC, child, seq, size) + payload(child, seq, size)
    return body + CRC.pack(zlib.crc32(body))


def decode_records(data: bytes, base: int = 0) -> Iterator[tuple[int, int, int, int]]:
    """Yield ``(child, seq, begin, end)`` of each record; raise ValueError at
    anything that is not a whole, intact record."""
    pos = 0
    while pos < len(data):
        if len(data) - pos < HEADER.size:
            raise ValueError(f"truncated header at offset {base + pos}")
        magic, child, seq, size = HEADER.unpack_from(data, pos)
        if magic != MAGIC:
            raise ValueError(f"no record magic at offset {base + pos}")
        end = pos + HEADER.size + size + CRC.size
        if end > len(data):
            raise ValueError(f"truncated record at offset {base + pos}")
        body = data[pos : end - CRC.size]
        (crc,) = CRC.unpack_from(data, end - CRC.size)
        if crc != zlib.crc32(body) or body[HEADER.size :] != payload(child, seq, size):
            raise ValueError(f"corrupt record at offset {base + pos}")
        yield child, seq, base + pos, base + end
        pos = end


def _append(
    root: str, journal: str, child: int, fragment_size: int, report: str, count: int
) -> None:
    from journal import AppendResult, LocalJournalStore

    out = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    rng = random.Random(child)

    def reporter(seq: int) -> Callable[[Future[AppendResult]], None]:
        def done(fut: Future[AppendResult]) -> None:
            res = fut.result()
            # One small write per line: a kill cannot split it.
            os.write(out, b"%d %d %d %d\n" % (child, seq, res.begin, res.end))

        return done

    store = LocalJournalStore(root, fragment_size=fragment_size)
    os.write(out, b"ready\n")
    seq = 0
    while count <= 0 or seq < count:
        n = rng.randrange(1, 60)
        if count > 0:
            n = min(n, count - seq)
        burst = [
            store.append(journal, encode_record(child, seq + i, rng.randrange(0, 300)))
            for i in range(n)
        ]
        for i, fut in enumerate(burst):
            fut.add_done_callback(reporter(seq + i))
        seq += len(burst)
        burst[-1].result()
    store.close()
    os.close(out)


def _follow(root: str, journal: str, report: str) -> None:
    from journal import LocalJournalStore

    out = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    store = LocalJournalStore(root)
    os.write(out, b"ready\n")
    pending = b""
    with store.read(journal, 0, block=True) as reader:
        base = 0
        while chunk := reader.read(1 << 16):
            pending += chunk
            # Check every whole record received so far.
            good = 0
            try:
                for _, _, _, end in decode_records(pending, base):
                    good = end - base
            except ValueError as err:
                if "truncated" not in str(err):
                    raise
            pending = pending[good:]
            base += good
            os.write(out, b"%d\n" % base)


def main(argv: list[str]) -> None:
    mode = argv[0]
    if mode == "append":
        root, journal, child, fragment_size, report = argv[1:6]
        count = int(argv[6]) if len(argv) > 6 else 0
        _append(root, journal, int(child), int(fragment_size), report, count)
    elif mode == "follow":
        _follow(*argv[1:4])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
