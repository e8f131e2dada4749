"""Mapping messages to journals: the partitions of a topic.

``modulo_mapping`` picks partition ``h(key) % n``: cheap, but adding a
partition moves most keys. ``rendezvous_mapping`` (highest random weight)
picks the partition with the largest ``h(key) ^ h(journal name)``: adding or
removing one moves only the keys that belong to it. With ``hash="fnv1a"``
both reproduce Gazette's Go routing exactly.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

import mmh3

from ._errors import EmptyPartitionsError
from ._interfaces import MappingFunc, MappingKeyFunc, PartitionsFunc

if TYPE_CHECKING:
    from journal import JournalSpec

_FNV_OFFSET: Final = 0x811C9DC5
_FNV_PRIME: Final = 0x01000193


def fnv1a_32(data: bytes) -> int:
    """32-bit FNV-1a, as Go's ``hash/fnv.New32a``."""
    h = _FNV_OFFSET
    for b in data:
        h = ((h ^ b) * _FNV_PRIME) & 0xFFFFFFFF
    return h


def mmh3_32(data: bytes) -> int:
    """32-bit unsigned MurmurHash3 with seed 0."""
    return mmh3.hash(data, 0, False)


_HASHES: Final[dict[str, Callable[[bytes], int]]] = {"mmh3": mmh3_32, "fnv1a": fnv1a_32}


def _hasher(name: str) -> Callable[[bytes], int]:
    try:
        return _HASHES[name]
    except KeyError:
        raise ValueError(f"unknown hash {name!r}: use one of {sorted(_HASHES)}") from None


def _route(spec: JournalSpec) -> tuple[str, str]:
    return spec.name, spec.content_type or ""


class _Partitions:
    """What a mapping derives from the partitions: each one's route (name,
    content type) and the hash of its name, kept while ``partitions()``
    returns the very same object (compared with ``is``) of the same length.

    One tuple is replaced whole, so threads need no lock: two that see a new
    object at once both derive the same thing."""

    __slots__ = ("_h", "entry")

    def __init__(self, h: Callable[[bytes], int]) -> None:
        self._h = h
        # (partitions object, routes, name hashes)
        self.entry: tuple[object, Sequence[tuple[str, str]], Sequence[int]] = (None, (), ())

    def of(self, parts: Sequence[JournalSpec]) -> tuple[object, Sequence[tuple[str, str]],
                                                        Sequence[int]]:
        entry = self.entry
        # A list grown or shrunk in place is seen too.
        if entry[0] is not parts or len(entry[1]) != len(parts):
            if not parts:
                raise EmptyPartitionsError()
            entry = self.entry = (parts, [_route(p) for p in parts],
                                  [self._h(p.name.encode()) for p in parts])
        return entry


def modulo_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """Map a message to partition ``h(key(msg)) % len(partitions())``.

    The partitions' routes are derived once while ``partitions()`` returns
    the very same object (compared with ``is``): return a new sequence when
    they change, as ``journal.WatchedList`` does."""
    h = _hasher(hash)
    cache = _Partitions(h)

    def mapping(msg: object) -> tuple[str, str]:
        routes = cache.of(partitions())[1]
        k = key(msg)
        return routes[h(k.encode() if isinstance(k, str) else bytes(k)) % len(routes)]

    return mapping


def rendezvous_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """Map a message by highest random weight: the first partition with the
    strictly largest ``h(key(msg)) ^ h(journal name)``.

    Journal-name hashes and routes are derived once while ``partitions()``
    returns the very same object (compared with ``is``).
    """
    h = _hasher(hash)
    cache = _Partitions(h)

    def mapping(msg: object) -> tuple[str, str]:
        _, routes, hashes = cache.of(partitions())
        k = key(msg)
        s = h(k.encode() if isinstance(k, str) else bytes(k))
        best, index = 0, 0
        for i, jh in enumerate(hashes):
            w = s ^ jh
            if w > best:
                best, index = w, i
        return routes[index]

    return mapping


def random_mapping(partitions: PartitionsFunc) -> MappingFunc:
    """Map each message to a partition chosen at random."""

    def mapping(msg: object) -> tuple[str, str]:
        parts = partitions()
        if not parts:
            raise EmptyPartitionsError()
        return _route(parts[random.randrange(len(parts))])

    return mapping
