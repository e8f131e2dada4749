"""A deliberately simple reference model of the Sequencer's committed output.

Written straight from the rules of docs/concepts.md ("Sequencing": Gazette's
Sequencer, made independent of the ring), as an oracle for the
property tests. It has no ring and never replays: it keeps the whole log of
every journal and, when a transaction commits, re-reads the span from that log.

Per (journal, producer), with ``last_ack`` the clock of its last ACK_TXN or
OUTSIDE_TXN (a producer first seen with clock ``c`` starts at ``c - 1``):

- OUTSIDE_TXN and unknown flags: ``clock <= last_ack`` is a duplicate;
  otherwise it commits itself, discards any open span and sets ``last_ack``.
- CONTINUE_TXN: ``clock <= last_ack`` or ``<=`` the largest clock of the open
  span is a duplicate; otherwise it opens (``begin`` = its offset) or extends
  the span.
- ACK_TXN: ``clock <= last_ack`` rolls back to ``clock``. Otherwise it
  commits: the producer's envelopes in ``[begin, ack.begin)`` are emitted in
  offset order, each only if its clock exceeds every clock of the producer
  seen earlier in the span (starting from ``last_ack``) and is ``<=`` the
  ACK's clock; then the ACK itself, unless the last message emitted has the
  ACK's own clock (as Gazette's ``Sequencer.Step`` does; the plain wording says
  "then the ACK itself" without that exception).
- Clock 0 (the nil UUID included) always commits and is never tracked.

Note that the committed output depends only on ``(last_ack, begin)`` of each
producer and on the journal's log: the largest clock of a span only decides
whether a CONTINUE_TXN is reported as a duplicate. That is why a
``ProducerState`` is enough to resume.

UUIDs are decoded here independently of the ``message`` package.
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

OUTSIDE_TXN = 0
CONTINUE_TXN = 1
ACK_TXN = 2

_HEAD = struct.Struct(">IHHH")


def decode(u: uuid.UUID) -> tuple[bytes, int, int]:
    """Return ``(producer, clock, flags)`` of a UUID laid out as Gazette's BuildUUID."""
    raw = u.bytes
    time_low, time_mid, time_hi, seq = _HEAD.unpack_from(raw)
    clock = (time_low << 4) | (time_mid << 36) | ((time_hi & 0x0FFF) << 52) | ((seq >> 10) & 0xF)
    return raw[10:], clock, seq & 0x3FF


def envelope_clock(env: Any) -> int:
    """The clock of an envelope's message UUID."""
    return decode(env.message.get_uuid())[1]


@dataclass
class ModelState:
    """What the model knows of one (journal, producer)."""

    last_ack: int
    begin: int = -1
    # Largest clock of the open span, or None when it is unknown (a span
    # restored from a ProducerState) or there is no open span.
    span_max: int | None = None


class SequencerModel:
    """Applies envelopes one by one and returns what each one commits.

    ``log`` is every envelope of the journals that may be referenced by a
    span (at least all envelopes queued so far, and those before the resume
    point of restored states), in any order; spans are looked up in it by
    journal and offsets.
    """

    def __init__(self, log: Iterable[Any], states: Iterable[Any] = ()) -> None:
        self._log: dict[str, list[Any]] = {}
        for env in log:
            self._log.setdefault(env.journal.name, []).append(env)
        for envs in self._log.values():
            envs.sort(key=lambda e: e.begin)
        self.states: dict[tuple[str, bytes], ModelState] = {
            (s.journal, bytes(s.producer)): ModelState(s.last_ack, s.begin) for s in states
        }

    def queue(self, env: Any) -> tuple[bool | None, list[Any]]:
        """Apply one envelope: return (queue_uncommitted's result, envelopes it commits).

        The result is None where the rules leave it open: a CONTINUE_TXN extending a
        span restored from a ProducerState, whose largest clock is unknown.
        """
        producer, clock, flags = decode(env.message.get_uuid())
        if clock == 0:
            return True, [env]
        key = (env.journal.name, producer)
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = ModelState(last_ack=clock - 1)

        if flags == CONTINUE_TXN:
            if clock <= st.last_ack:
                return True, []
            if st.begin == -1:
                st.begin, st.span_max = env.begin, clock
                return False, []
            if st.span_max is None:
                return None, []
            if clock <= st.span_max:
                return True, []
            st.span_max = clock
            return False, []

        if flags == ACK_TXN:
            if clock <= st.last_ack:
                st.last_ack, st.begin, st.span_max = clock, -1, None
                return True, []
            out = self._span(env, producer, st.begin, st.last_ack, clock) if st.begin != -1 else []
            # The ACK follows its span, unless the last message emitted has
            # the ACK's own clock (a producer that reused it): Gazette's
            # Sequencer.Step drops that ACK, and so do we.
            if not out or decode(out[-1].message.get_uuid())[1] < clock:
                out.append(env)
            st.last_ack, st.begin, st.span_max = clock, -1, None
            return True, out

        # OUTSIDE_TXN, or unknown flags handled as OUTSIDE_TXN.
        if clock <= st.last_ack:
            return True, []
        st.last_ack, st.begin, st.span_max = clock, -1, None
        return True, [env]

    def _span(self, ack: Any, producer: bytes, begin: int, last_ack: int, limit: int) -> list[Any]:
        out = []
        seen = last_ack
        for env in self._log.get(ack.journal.name, ()):
            if env.begin < begin or env.begin >= ack.begin:
                continue
            p, clock, _ = decode(env.message.get_uuid())
            if p != producer or clock <= seen:
                continue
            seen = clock
            if clock <= limit:
                out.append(env)
        return out

    def producer_states(self) -> set[tuple[str, bytes, int, int]]:
        """The model's producer states as ``{(journal, producer, last_ack, begin)}``."""
        return {(j, p, s.last_ack, s.begin) for (j, p), s in self.states.items()}


def committed_output(
    envelopes: Sequence[Any], states: Iterable[Any] = (), *, start: int = 0
) -> list[Any]:
    """Committed envelopes, in output order, of reading ``envelopes[start:]``.

    ``envelopes`` is the whole read order (one or several journals, each in
    offset order); ``states`` are the ProducerStates to start from.
    """
    model = SequencerModel(envelopes, states)
    out: list[Any] = []
    for env in envelopes[start:]:
        out.extend(model.queue(env)[1])
    return out
