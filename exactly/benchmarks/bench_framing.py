"""Framing throughput: messages decoded and encoded per second on one core.

The headline is NDJSON decoding on the bulk path the journal readers take:
``read_frames`` over an in-memory reader, then ``unmarshal_frame`` into a new
dict per frame, over 100-byte lines. Its baseline is the least any Python
NDJSON reader must do: ``orjson.loads`` of each line, the lines already split
(target: at least 0.6 of it). The other rows put the per-frame path, the
encoders, CSV and the fixed protobuf framing beside their bare codecs.
"""

from __future__ import annotations

import csv
import io
from typing import Any

import orjson
from google.protobuf import struct_pb2

from exactly.benchmarks._harness import Result, interleaved
from framing import (
    CONTENT_TYPE_CSV,
    CONTENT_TYPE_JSON_LINES,
    CONTENT_TYPE_PROTO_FIXED,
    framing_by_content_type,
)

LINE_LENGTH = 100


def documents(n: int) -> list[dict[str, Any]]:
    """``n`` JSON objects of a few typed fields, each exactly 99 bytes of
    compact JSON (100 with its newline)."""
    docs = []
    for i in range(n):
        doc: dict[str, Any] = {
            "id": i,
            "user": f"user{i % 10007:06d}",
            "score": (i * 7919 % 10000) / 100,
            "ok": i % 3 == 0,
            "tags": ["a", "bb"],
            "pad": "",
        }
        doc["pad"] = "x" * (LINE_LENGTH - 1 - len(orjson.dumps(doc)))
        docs.append(doc)
    return docs


def _drain_bulk(f: Any, data: bytes, new_message: Any) -> int:
    unmarshal = f.unmarshal_frame
    n = 0
    for _, _, frame in f.read_frames(io.BytesIO(data)):
        unmarshal(frame, new_message())
        n += 1
    return n


def _drain_bulk_into_dicts(f: Any, data: bytes) -> int:
    # ``{}``, not ``dict()``: the cost of making the message is not the framing's.
    unmarshal = f.unmarshal_frame
    n = 0
    for _, _, frame in f.read_frames(io.BytesIO(data)):
        unmarshal(frame, {})
        n += 1
    return n


def _drain_per_frame(f: Any, data: bytes, new_message: Any) -> int:
    unmarshal = f.new_unmarshal_func(io.BytesIO(data))
    n = 0
    while True:
        try:
            unmarshal(new_message())
        except EOFError:
            return n
        n += 1


def _loads_each(lines: list[bytes]) -> None:
    loads = orjson.loads
    for line in lines:
        loads(line)


def _each(fn: Any, items: list[Any]) -> None:
    # Results are dropped, as a publisher drops a frame once appended: this
    # measures the encoder, not how the heap copes with 100k live buffers.
    for item in items:
        fn(item)


def _ndjson(n: int) -> list[Result]:
    f = framing_by_content_type(CONTENT_TYPE_JSON_LINES)
    docs = documents(n)
    lines = [orjson.dumps(d, option=orjson.OPT_APPEND_NEWLINE) for d in docs]
    assert all(len(line) == LINE_LENGTH for line in lines)
    data = b"".join(lines)
    assert _drain_bulk_into_dicts(f, data) == n

    decode = interleaved(
        {
            "bulk": lambda: _drain_bulk_into_dicts(f, data),
            "loads": lambda: _loads_each(lines),
        },
        repeat=7,
    )
    others = interleaved(
        {
            "per-frame": lambda: _drain_per_frame(f, data, dict),
            "marshal": lambda: _each(f.marshal, docs),
            "dumps": lambda: _each(orjson.dumps, docs),
        },
        repeat=3,
    )
    baseline = n / decode["loads"]
    return [
        Result(
            "framing: NDJSON decode, read_frames + unmarshal_frame (100 B lines)",
            n / decode["bulk"],
            "msg/s",
            baseline_name="orjson.loads loop",
            baseline=baseline,
            target=0.6,
        ),
        Result(
            "framing: NDJSON decode, new_unmarshal_func (per frame)",
            n / others["per-frame"],
            "msg/s",
            baseline_name="orjson.loads loop",
            baseline=baseline,
        ),
        Result(
            "framing: NDJSON encode, marshal(dict)",
            n / others["marshal"],
            "msg/s",
            baseline_name="orjson.dumps loop",
            baseline=n / others["dumps"],
        ),
    ]


def _csv(n: int) -> list[Result]:
    f = framing_by_content_type(CONTENT_TYPE_CSV)
    rows = [[str(v) for v in d.values()] for d in documents(n)]
    rows[::10] = [[*r[:-1], 'with "quotes", commas\nand a newline'] for r in rows[::10]]
    data = b"".join(f.marshal(r) for r in rows)
    text = data.decode()
    assert _drain_bulk(f, data, list) == n
    times = interleaved(
        {
            "bulk": lambda: _drain_bulk(f, data, list),
            "csv.reader": lambda: list(csv.reader(io.StringIO(text, newline=""))),
        },
        repeat=3,
    )
    return [
        Result(
            "framing: CSV decode, read_frames + unmarshal_frame",
            n / times["bulk"],
            "msg/s",
            baseline_name="csv.reader",
            baseline=n / times["csv.reader"],
        )
    ]


def _fixed(n: int) -> list[Result]:
    f = framing_by_content_type(CONTENT_TYPE_PROTO_FIXED)
    msgs = []
    for d in documents(n):
        s = struct_pb2.Struct()
        s.update(d)
        msgs.append(s)
    frames = [f.marshal(m) for m in msgs]
    payloads = [frame[8:] for frame in frames]
    data = b"".join(frames)
    assert _drain_bulk(f, data, struct_pb2.Struct) == n

    def parse_each() -> None:
        for p in payloads:
            struct_pb2.Struct().ParseFromString(p)

    times = interleaved(
        {
            "bulk": lambda: _drain_bulk(f, data, struct_pb2.Struct),
            "parse": parse_each,
            "marshal": lambda: _each(f.marshal, msgs),
            "serialize": lambda: _each(struct_pb2.Struct.SerializeToString, msgs),
        },
        repeat=3,
    )
    return [
        Result(
            "framing: fixed protobuf decode, read_frames + unmarshal_frame",
            n / times["bulk"],
            "msg/s",
            baseline_name="ParseFromString loop",
            baseline=n / times["parse"],
        ),
        Result(
            "framing: fixed protobuf encode, marshal",
            n / times["marshal"],
            "msg/s",
            baseline_name="SerializeToString loop",
            baseline=n / times["serialize"],
        ),
    ]


def run(scale: float) -> list[Result]:
    n = max(1000, int(300_000 * scale))
    return [*_ndjson(n), *_csv(max(1000, n // 3)), *_fixed(max(1000, n // 3))]


if __name__ == "__main__":
    from exactly.benchmarks._harness import format_table

    print(format_table(run(1.0)))
