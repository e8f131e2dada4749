"""Sequencer throughput: envelopes sequenced per second on one core.

Traffic: 1M envelopes (at scale 1) from 100 producers, half committed
messages and half transactions (see ``_workload``). The baseline is the
least any reader must do per envelope — fetch its UUID — so the ratio says
how many times that floor sequencing costs.
"""

from __future__ import annotations

from exactly.benchmarks._harness import Result, interleaved
from exactly.benchmarks._workload import envelopes
from message import Envelope, MustStartReplay, Sequencer


def _sequence(envs: list[Envelope], buffer: int) -> int:
    seq = Sequencer(buffer=buffer)
    queue, deque = seq.queue_uncommitted, seq.deque_committed
    frame = envs[0].end - envs[0].begin  # replays are served from the list
    n = 0
    for env in envs:
        queue(env)
        while True:
            try:
                if deque() is None:
                    break
            except MustStartReplay as need:
                seq.start_replay(iter(envs[need.begin // frame : need.end // frame]))
                continue
            n += 1
    return n


def _floor(envs: list[Envelope]) -> int:
    n = 0
    for env in envs:
        n += env.message.get_uuid().int & 1
    return n


def run(scale: float) -> list[Result]:
    n = max(1000, int(1_000_000 * scale))
    envs = envelopes(n)
    times = interleaved(
        {
            "sequencer": lambda: _sequence(envs, 4096),
            "small ring": lambda: _sequence(envs, 16),
            "floor": lambda: _floor(envs),
        },
        repeat=3,
    )
    floor = n / times["floor"]
    return [
        Result("sequencer: envelopes/s (ring 4096)", n / times["sequencer"], "env/s",
               target=1_000_000),
        Result("sequencer vs. get_uuid() floor", n / times["sequencer"], "env/s",
               baseline_name="get_uuid loop", baseline=floor),
        Result("sequencer: envelopes/s (ring 16, replays)", n / times["small ring"], "env/s"),
    ]
