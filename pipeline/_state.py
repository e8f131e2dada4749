"""The pipeline's state journals: NDJSON records in journals of the store
under ``.exactly/pipeline/`` (a write job's intents, its attempts' roll-backs,
a streaming sink's last micro-batch), read whole or by their tail, and
appended durably."""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any, Final

import orjson

from framing import CONTENT_TYPE_JSON_LINES
from journal import (
    AppendResult,
    JournalClient,
    JournalNotFoundError,
    JournalStore,
    LocalJournalStore,
    read_all,
)
from message import AckIntent

from ._stores import STATE_PREFIX

log = logging.getLogger("pipeline")

INTENTS: Final = STATE_PREFIX + "intents/"
ATTEMPTS: Final = STATE_PREFIX + "attempts/"
SINKS: Final = STATE_PREFIX + "sinks/"
_STATE_LABELS: Final = {"content-type": CONTENT_TYPE_JSON_LINES, "exactly.state": "pipeline"}


def _records(client: JournalClient, name: str, offset: int = 0) -> list[dict[str, Any]]:
    """The NDJSON records of state journal ``name`` from ``offset`` on
    (``JournalNotFoundError`` if it does not exist)."""
    with client.read(name, offset) as r:
        return _parsed(name, read_all(r))


def _parsed(name: str, data: bytes) -> list[dict[str, Any]]:
    out = []
    for line in data.splitlines():
        if not line.strip():
            continue
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("ignoring an unreadable record of %s: %r", name, line[:80])
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def _tail_records(
    client: JournalStore, name: str, enough: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The whole records at the end of state journal ``name``: read from its
    head back, in growing windows, until ``enough`` of them, or all
    (``JournalNotFoundError`` if it does not exist). A journal kept across a
    stream's micro-batches grows with each: its tail is what is read."""
    head = client.head(name)
    floor = _first_offset(client, name)
    window = 1 << 16
    while True:
        start = max(floor, head - window)
        with client.read(name, start, head) as r:
            data = read_all(r)
        if start > floor:
            data = data[data.find(b"\n") + 1:]  # (a line that began before the window)
        docs = _parsed(name, data)
        if start == floor or enough(docs):
            return docs
        window *= 4


def _first_offset(client: JournalStore, name: str) -> int:
    """Where state journal ``name`` begins: past what retention removed
    (``forget_before``), so that reading its tail jumps over nothing."""
    if isinstance(client, LocalJournalStore):
        fragments = client.fragments(name)
        return fragments[0].begin if fragments else client.head(name)
    return 0


def forget_before(client: JournalStore, name: str, offset: int) -> None:
    """Retention of a state journal kept across a stream's micro-batches,
    whose records before ``offset`` are settled and never read again: on
    the embedded store, its sealed fragments that end by ``offset`` are
    removed, so that it holds about a fragment, not every batch since the
    stream began. (A Gazette cluster's journals keep the retention of their
    fragment store.)"""
    if isinstance(client, LocalJournalStore):
        with contextlib.suppress(JournalNotFoundError):
            client.trim(name, before_offset=offset)


def _last_record(client: JournalStore, name: str) -> dict[str, Any] | None:
    """The last record of state journal ``name``, reading only its tail."""
    try:
        docs = _tail_records(client, name, bool)
    except JournalNotFoundError:
        return None
    return docs[-1] if docs else None


def _records_after_last(
    client: JournalStore, name: str, marks: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The records of state journal ``name`` after the last one that
    ``marks`` (all of them if none does), reading only as much of its tail
    as that takes (``JournalNotFoundError`` if it does not exist)."""
    docs = _tail_records(client, name, lambda found: any(marks(d) for d in found))
    last = max((i for i, doc in enumerate(docs) if marks(doc)), default=None)
    return docs if last is None else docs[last + 1:]


def _append_record(client: JournalClient, name: str, doc: dict[str, Any]) -> AppendResult:
    """Append ``doc`` to state journal ``name`` and wait until it is durable;
    returns where it landed."""
    return client.append(name, orjson.dumps(doc) + b"\n").result()


def _b64(pairs: Iterable[tuple[str, bytes]]) -> list[list[str]]:
    return [[j, base64.b64encode(b).decode()] for j, b in pairs]


def _unb64(pairs: Iterable[Any]) -> list[AckIntent]:
    return [AckIntent(str(j), base64.b64decode(b)) for j, b in pairs]
