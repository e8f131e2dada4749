"""Mapping messages to journals: the partitions of a topic.

``modulo_mapping`` picks partition ``h(key) % n``: cheap, but adding a
partition moves most keys. ``rendezvous_mapping`` (highest random weight)
picks the partition with the largest ``h(key) ^ h(journal name)``: adding or
removing one moves only the keys that belong to it. With ``hash="fnv1a"``
both reproduce Gazette's Go routing exactly.
"""

from __future__ import annotations

import random
import threading
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
    return mmh3.hash(data, 0, signed=False)


_HASHES: Final[dict[str, Callable[[bytes], int]]] = {"mmh3": mmh3_32, "fnv1a": fnv1a_32}


def _hasher(name: str) -> Callable[[bytes], int]:
    try:
        return _HASHES[name]
    except KeyError:
        raise ValueError(f"unknown hash {name!r}: use one of {sorted(_HASHES)}") from None


def _key_bytes(key: bytes | str) -> bytes:
    return key.encode() if isinstance(key, str) else bytes(key)


def _route(spec: JournalSpec) -> tuple[str, str]:
    return spec.name, spec.content_type or ""


def modulo_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """Map a message to partition ``h(key(msg)) % len(partitions())``."""
    h = _hasher(hash)

    def mapping(msg: object) -> tuple[str, str]:
        parts = partitions()
        if not parts:
            raise EmptyPartitionsError()
        return _route(parts[h(_key_bytes(key(msg))) % len(parts)])

    return mapping


def rendezvous_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """Map a message by highest random weight: the first partition with the
    strictly largest ``h(key(msg)) ^ h(journal name)``.

    Journal-name hashes are cached while ``partitions()`` returns the very
    same object (compared with ``is``).
    """
    h = _hasher(hash)
    lock = threading.Lock()
    cache: list[object] = [None, ()]  # [last partitions result, its name hashes]

    def hashes_of(parts: Sequence[JournalSpec]) -> Sequence[int]:
        with lock:
            if cache[0] is not parts:
                cache[0], cache[1] = parts, [h(p.name.encode()) for p in parts]
            return cache[1]  # type: ignore[return-value]

    def mapping(msg: object) -> tuple[str, str]:
        parts = partitions()
        if not parts:
            raise EmptyPartitionsError()
        hashes = hashes_of(parts)
        s = h(_key_bytes(key(msg)))
        best, index = 0, 0
        for i, jh in enumerate(hashes):
            w = s ^ jh
            if w > best:
                best, index = w, i
        return _route(parts[index])

    return mapping


def random_mapping(partitions: PartitionsFunc) -> MappingFunc:
    """Map each message to a partition chosen at random."""

    def mapping(msg: object) -> tuple[str, str]:
        parts = partitions()
        if not parts:
            raise EmptyPartitionsError()
        return _route(parts[random.randrange(len(parts))])

    return mapping
