"""Exactly-once streaming sinks: each micro-batch committed once, however
often Spark replays it after a restart (see pipeline/_write.py for how a
batch's rows are published and committed)."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping

from journal import JournalStore
from message import (
    AckIntent,
    write_intents,
)

from ._state import (
    _STATE_LABELS,
    SINKS,
    _append_record,
    _b64,
    _last_record,
    _unb64,
    forget_before,
)
from ._write import (
    PublishedBatch,
    Target,
    _intents,
    _unreported_rollbacks,
    begin_ending,
    end_job,
)

log = logging.getLogger("pipeline")


# -- streaming sinks --------------------------------------------------------------


def sink_id_of(target: Target, query: str | None) -> str:
    """The default identity of a streaming sink: its target and the query
    that writes to it (``query``, see ``query_of``), so that two queries
    writing into one target, at once or in turn, are two sinks, each
    committing its own micro-batches once."""
    what = f"{target.journal}|{target.selector}|{target.key}|{target.mapping}|{target.hash}"
    if query is not None:
        what += f"|{query}"
    return hashlib.sha256(what.encode()).hexdigest()[:16]


def query_of(options: Mapping[str, str]) -> str | None:
    """What identifies a streaming query across its restarts, of a sink's
    options: its checkpoint location, else its name (a location under
    ``spark.sql.streaming.checkpointLocation``); None for a query whose
    checkpoint Spark made up at random, which a restart never resumes."""
    lower = {k.lower(): v for k, v in options.items()}  # (Spark's option names are not cased)
    location = lower.get("checkpointlocation")
    if location:
        return f"checkpoint:{location}"
    name = lower.get("queryname")
    return f"query:{name}" if name else None


class _SinkState:
    """The last micro-batch a streaming sink committed, and the one it is
    committing: records ``{"batch_id", "intents"}`` (being committed) and
    ``{"batch_id", "done": true}`` in the sink's state journal, the last one
    telling where it stands."""

    def __init__(self, client: JournalStore, sink_id: str) -> None:
        self.client = client
        self.name = SINKS + sink_id

    def last_batch(self) -> int:
        doc = _last_record(self.client, self.name)
        return int(doc["batch_id"]) if doc is not None else -1

    def recover(self) -> int:
        """Finish a batch whose commit a crash cut short; returns how many
        intents that wrote."""
        doc = _last_record(self.client, self.name)
        if doc is None or doc.get("done"):
            return 0
        intents = _unb64(doc.get("intents") or [])
        write_intents(self.client, intents)
        done = _append_record(self.client, self.name, {"batch_id": doc["batch_id"], "done": True})
        # Only the last record is read again: retention may take the rest.
        forget_before(self.client, self.name, done.begin)
        return len(intents)

    def commit(self, batch_id: int, intents: list[AckIntent]) -> None:
        self.client.create(self.name, _STATE_LABELS)
        _append_record(self.client, self.name,
                       {"batch_id": batch_id, "intents": _b64((i.journal, i.intent)
                                                              for i in intents)})
        self.recover()


def sink_job(sink_id: str) -> str:
    """The job under which a streaming sink's attempts record their
    roll-backs: one per sink, so that a restarted query cleans up after the
    attempts of the one before."""
    return f"sink-{sink_id}"


def commit_stream_batch(
    client: JournalStore, sink_id: str, batch_id: int, messages: Iterable[PublishedBatch | None],
    *, resumable: bool = True,
) -> bool:
    """Commit micro-batch ``batch_id`` of a streaming sink once: a batch Spark
    replays after a restart, already committed, is rolled back instead.
    Attempts that did not report are rolled back. Returns True if the batch
    was committed now. A sink not ``resumable`` (its query's checkpoint is
    one Spark made up, which no restart resumes) is never replayed to: each
    batch commits, whatever the last batch it committed."""
    messages = list(messages)
    job = sink_job(sink_id)
    begin_ending(client, job)  # attempts still writing roll back themselves
    state = _SinkState(client, sink_id)
    state.recover()
    last = state.last_batch()
    if batch_id == last and resumable:
        write_intents(client, _intents(messages, "rollbacks"))
        log.warning("sink %s: batch %d was already committed; rolled back its replay (another"
                    " query writing here needs a checkpoint location or a sink_id of its own)",
                    sink_id, batch_id)
        committed = False
    else:
        if batch_id < last:
            # Spark only replays its latest batch: a smaller ID means a new
            # query (a new checkpoint location) writing to the same sink.
            log.warning("sink %s: batch %d follows batch %d: a new query, committing",
                        sink_id, batch_id, last)
        state.commit(batch_id, _intents(messages, "intents"))
        committed = True
    write_intents(client, _unreported_rollbacks(client, job, messages))
    end_job(client, job, keep=True)
    return committed
