"""Properties of the Sequencer against the reference model (tests/sequencer_model.py).

(a) The committed output, and queue_uncommitted's results, equal the model's
    for every buffer size; replays are served from the whole log.
(b) Checkpoints: a Sequencer restored from ``producer_states()`` at any cut
    and fed the rest of the log continues the output exactly (none twice,
    none lost), including cuts in the middle of a committed sequence.
(c) producer_states() equals the model's states; has_pending and pruning.

Resume procedure for exactly-once, which (b) pins:

- Between sequences (``deque_committed`` returned None): save, per journal,
  the end offset of the last envelope queued from it, and
  ``producer_states()``. To resume, build ``Sequencer(states)`` and read each
  journal from its offset. An open span's ``begin`` may lie before that
  offset: the restored Sequencer asks for a replay starting there, which the
  reader serves by reading the journal back from ``begin`` (so a reader must
  be able to read journals from before its checkpoint's offsets, down to the
  smallest ``begin`` of an open span).
- In the middle of a committed sequence (some of its envelopes yielded, the
  rest not): save the offset of the *committing* envelope (so that it is read
  again) and the states from before it was queued, with the committing
  producer's state replaced by ``last_ack = clock(next) - 1`` and
  ``begin = next.begin``, where ``next`` is the first envelope of the
  sequence not yet yielded -- or ``begin = -1`` when ``next`` is the
  committing envelope itself. Re-reading the committing envelope then
  commits exactly the remainder: the replay from ``next.begin`` drops every
  clock ``<= last_ack``. (Gazette instead saves the clock of the last yielded
  envelope; that loses the ACK when a span message has the ACK's own clock.)
  The states from before the committing envelope are those after it for every
  other producer, so a reader may drain a whole sequence at once and patch
  the one state.
"""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from framing import framing_by_content_type
from journal import MemoryJournalClient
from message import (
    Envelope,
    MustStartReplay,
    ProducerState,
    ReadCommittedIter,
    ReadUncommittedIter,
    Sequencer,
    build_uuid,
)
from tests.sequencer_model import SequencerModel, decode, envelope_clock
from tests.strategies import (
    NDJSON,
    Msg,
    Workload,
    chaos_workloads,
    key,
    producer,
    publisher_workloads,
    state_key,
    workloads,
)

BUFFERS = (0, 1, 2, 3, 5, 8, 4096)

SETTINGS = settings(
    deadline=None,
    max_examples=200,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


class Reader:
    """Feeds a Sequencer one envelope at a time, serving replays from the whole log."""

    def __init__(self, seq: Sequencer, log: Sequence[Envelope]) -> None:
        self.seq = seq
        self.replays = 0
        self.limit = 3 * len(log) + 10
        self.journals: dict[str, list[Envelope]] = {}
        for env in log:
            self.journals.setdefault(env.journal.name, []).append(env)

    def queue(self, env: Envelope) -> tuple[bool, list[Envelope]]:
        result = self.seq.queue_uncommitted(env)
        return result, self.drain(env)

    def drain(self, last: Envelope) -> list[Envelope]:
        out: list[Envelope] = []
        for _ in range(self.limit):
            try:
                got = self.seq.deque_committed()
            except MustStartReplay:
                begin, end = self.seq.replay_range()
                assert 0 <= begin <= end <= last.begin, (begin, end, last.begin)
                self.replays += 1
                self.seq.start_replay(
                    e for e in self.journals[last.journal.name] if begin <= e.begin and e.end <= end
                )
                continue
            if got is None:
                return out
            out.append(got)
        raise AssertionError("deque_committed never returned None")


def keys(envs: Sequence[Any]) -> list[tuple[str, int, int, str]]:
    return [key(e) for e in envs]


def model_run(
    envs: Sequence[Envelope], states: Sequence[Any] = (), start: int = 0
) -> tuple[list[bool | None], list[list[Envelope]], list[set[Any]]]:
    """The model's results, per-step outputs and states after each step of envs[start:]."""
    model = SequencerModel(envs, states)
    results, outputs, snapshots = [], [], []
    for env in envs[start:]:
        r, out = model.queue(env)
        results.append(r)
        outputs.append(out)
        snapshots.append(model.producer_states())
    return results, outputs, snapshots


def flatten(outputs: Sequence[Sequence[Envelope]]) -> list[Envelope]:
    return [e for out in outputs for e in out]


@SETTINGS
@given(workloads())
def test_output_equals_model_for_every_buffer(w: Workload) -> None:
    """(a) Per step, results, committed output and producer states equal the model's, any buffer."""
    results, outputs, snapshots = model_run(w.envelopes)
    for buffer in BUFFERS:
        reader = Reader(Sequencer(buffer=buffer), w.envelopes)
        for i, env in enumerate(w.envelopes):
            r, out = reader.queue(env)
            assert keys(out) == keys(outputs[i]), (buffer, i)
            if results[i] is not None:
                assert r is results[i], (buffer, i)
            assert {state_key(s) for s in reader.seq.producer_states()} == snapshots[i], (buffer, i)
        if buffer >= len(w.envelopes):
            assert reader.replays == 0


@SETTINGS
@given(chaos_workloads(max_size=40, max_journals=1))
def test_output_is_ring_independent_single_journal(w: Workload) -> None:
    """(a) On one busy journal, every buffer size gives the same output, with fewer replays."""
    outputs = []
    replays = []
    for buffer in BUFFERS:
        reader = Reader(Sequencer(buffer=buffer), w.envelopes)
        outputs.append(keys(flatten([reader.queue(env)[1] for env in w.envelopes])))
        replays.append(reader.replays)
    assert all(o == outputs[0] for o in outputs)
    assert outputs[0] == keys(flatten(model_run(w.envelopes)[1]))
    # A larger ring never needs more replays (0 and 1 are the same ring).
    assert replays == sorted(replays, reverse=True)


def _uninterrupted(
    w: Workload, buffer: int
) -> tuple[list[list[Envelope]], list[list[ProducerState]], list[set[Any]]]:
    """Per-step outputs and producer_states() before each step (index i: before envs[i])."""
    reader = Reader(Sequencer(buffer=buffer), w.envelopes)
    outputs, snapshots, frozen = [], [reader.seq.producer_states()], [set()]
    for env in w.envelopes:
        outputs.append(reader.queue(env)[1])
        snapshots.append(reader.seq.producer_states())
        frozen.append({state_key(s) for s in snapshots[-1]})
    return outputs, snapshots, frozen


def _resume(w: Workload, states: Sequence[ProducerState], start: int, buffer: int) -> list[Any]:
    reader = Reader(Sequencer(states, buffer=buffer), w.envelopes)
    return flatten([reader.queue(env)[1] for env in w.envelopes[start:]])


@SETTINGS
@given(workloads(), st.sampled_from((1, 3, 4096)))
def test_resume_from_every_cut(w: Workload, buffer: int) -> None:
    """(b) Restored from producer_states() after any drained step, output continues exactly."""
    outputs, snapshots, frozen = _uninterrupted(w, buffer)
    full = keys(flatten(outputs))
    for cut in range(len(w.envelopes) + 1):
        # A snapshot is a snapshot: later queueing did not change it.
        assert {state_key(s) for s in snapshots[cut]} == frozen[cut]
        before = keys(flatten(outputs[:cut]))
        model_after = keys(flatten(model_run(w.envelopes, snapshots[cut], cut)[1]))
        assert before + model_after == full, ("model", cut)
        assert before + keys(_resume(w, snapshots[cut], cut, buffer)) == full, cut


def mid_sequence_states(
    before: Sequence[ProducerState], committing: Envelope, next_env: Envelope
) -> list[ProducerState]:
    """The checkpoint states of a reader which has yielded part of a committed sequence."""
    producer = decode(committing.message.get_uuid())[0]
    journal = committing.journal.name
    states = [s for s in before if (s.journal, bytes(s.producer)) != (journal, producer)]
    begin = -1 if key(next_env) == key(committing) else next_env.begin
    states.append(ProducerState(journal, producer, envelope_clock(next_env) - 1, begin))
    return states


@SETTINGS
@given(workloads(), st.sampled_from((1, 4096)))
def test_resume_in_the_middle_of_a_sequence(w: Workload, buffer: int) -> None:
    """(b) The mid-sequence resume procedure (see module docstring) is exactly-once."""
    outputs, snapshots, _ = _uninterrupted(w, buffer)
    full = keys(flatten(outputs))
    for i, out in enumerate(outputs):
        for yielded in range(1, len(out)):
            prefix = keys(flatten(outputs[:i])) + keys(out[:yielded])
            states = mid_sequence_states(snapshots[i], w.envelopes[i], out[yielded])
            model_after = keys(flatten(model_run(w.envelopes, states, i)[1]))
            assert prefix + model_after == full, ("model", i, yielded)
            assert prefix + keys(_resume(w, states, i, buffer)) == full, (i, yielded)


def _pending_expected(states: set[Any], since: dict[str, int]) -> bool:
    return any(begin != -1 and begin >= since.get(j, 0) for j, _, _, begin in states)


@SETTINGS
@given(workloads())
def test_has_pending(w: Workload) -> None:
    """(c) has_pending(since) is True iff an open span begins at or after since[journal] (or 0)."""
    _, _, snapshots = model_run(w.envelopes)
    reader = Reader(Sequencer(buffer=2), w.envelopes)
    for i, env in enumerate(w.envelopes):
        reader.queue(env)
        states = snapshots[i]
        variants: list[dict[str, int]] = [{}, {env.journal.name: env.end}, {"nowhere": 1}]
        for j, _, _, begin in states:
            if begin != -1:
                variants += [{j: begin}, {j: begin + 1}, {j: begin - 1}]
        variants.append(dict.fromkeys(w.journals, 10**12))
        for since in variants:
            assert reader.seq.has_pending(since) == _pending_expected(states, since), since


@SETTINGS
@given(
    publisher_workloads(),
    st.data(),
)
def test_prune_horizon(w: Workload, data: st.DataObject) -> None:
    """(c) producer_states(h) drops producers whose last_ack is > h older than their journal's
    newest, keeps the rest, and a Sequencer continuing after pruning behaves as one restored
    from the pruned states."""
    cut = data.draw(st.integers(0, len(w.envelopes)))
    horizon = data.draw(
        st.one_of(
            st.integers(0, 3000).map(lambda us: datetime.timedelta(microseconds=us)),
            st.sampled_from((1e-9, 1e-3, 0.0, -1.0)),
        )
    )
    reader = Reader(Sequencer(buffer=4), w.envelopes)
    for env in w.envelopes[:cut]:
        reader.queue(env)
    states = {state_key(s) for s in reader.seq.producer_states()}

    if isinstance(horizon, datetime.timedelta):
        units = (horizon // datetime.timedelta(microseconds=1)) * 10
        positive = horizon > datetime.timedelta(0)
    else:
        units, positive = round(horizon * 10**7), horizon > 0
    newest: dict[str, int] = {}
    for j, _, last_ack, _ in states:
        newest[j] = max(newest.get(j, 0), last_ack)
    expect = {s for s in states if not positive or newest[s[0]] - s[2] <= units << 4}

    pruned = reader.seq.producer_states(horizon)
    assert {state_key(s) for s in pruned} == expect
    assert {state_key(s) for s in reader.seq.producer_states()} == expect

    # Continuing equals restoring from the pruned states.
    rest = flatten([reader.queue(env)[1] for env in w.envelopes[cut:]])
    assert keys(rest) == keys(_resume(w, pruned, cut, 4))
    assert keys(rest) == keys(flatten(model_run(w.envelopes, pruned, cut)[1]))


def _journal_of(w: Workload) -> tuple[Any, list[Envelope]]:
    """The workload's first journal written to an in-memory journal, and read back uncommitted."""
    client = MemoryJournalClient()
    client.create("it/journal", {"content-type": NDJSON})
    framing = framing_by_content_type(NDJSON)
    for env in w.envelopes:
        if env.journal.name == w.journals[0]:
            client.append("it/journal", framing.marshal(Msg(env.message.get_uuid()))).result()
    return client, list(ReadUncommittedIter(client, "it/journal", lambda _: Msg()))


@settings(SETTINGS, max_examples=60)
@given(workloads())
def test_read_committed_iter_checkpoint_at_every_yield(w: Workload) -> None:
    """(b) ReadCommittedIter.checkpoint() between any two yields: none twice, none lost."""
    client, log = _journal_of(w)
    expect = keys(flatten(model_run(log)[1]))

    def ids(envs: Sequence[Envelope]) -> list[tuple[int, int, str]]:
        return [(e.begin, e.end, str(e.message.get_uuid())) for e in envs]

    expected = [(b, e, u) for _, b, e, u in expect]
    it = ReadCommittedIter(client, "it/journal", lambda _: Msg(), Sequencer(buffer=2))
    cuts = [it.checkpoint()]
    got: list[Envelope] = []
    for env in it:
        got.append(env)
        cuts.append(it.checkpoint())
    assert ids(got) == expected
    for n, cp in enumerate(cuts):
        restored = ReadCommittedIter(client, "it/journal", lambda _: Msg(), checkpoint=cp)
        assert ids(got[:n]) + ids(list(restored)) == expected, n


def test_read_committed_iter_checkpoint_span_message_with_the_acks_clock() -> None:
    """A checkpoint after a span message whose clock equals its ACK's, which is duplicated
    before the ACK: the resumed reader yields the ACK only (none twice)."""
    client = MemoryJournalClient()
    client.create("it/journal", {"content-type": NDJSON})
    framing = framing_by_content_type(NDJSON)
    a = producer(1)
    for clock, flags in ((5, 1), (7, 1), (7, 1), (7, 2)):
        client.append("it/journal", framing.marshal(Msg(build_uuid(a, clock, flags)))).result()
    it = ReadCommittedIter(client, "it/journal", lambda _: Msg())
    first, second = next(it), next(it)
    assert [envelope_clock(first), envelope_clock(second)] == [5, 7]
    cp = it.checkpoint()
    rest = list(ReadCommittedIter(client, "it/journal", lambda _: Msg(), checkpoint=cp))
    assert [(e.begin, envelope_clock(e)) for e in rest] == [
        (e.begin, envelope_clock(e)) for e in it
    ]
