"""Mapping messages to journals: the partitions of a topic.

``modulo_mapping`` picks partition ``h(key) % n``: cheap, but adding a
partition moves most keys. ``rendezvous_mapping`` (highest random weight)
picks the partition with the largest ``h(key) ^ h(journal name)``: adding or
removing one moves only the keys that belong to it. With ``hash="fnv1a"``
both reproduce Gazette's Go routing exactly.

The closures below are the definition of both mappings; where the native
core is built, ``message._native.Mapping`` does the same per message without
a Python frame of its own (``EXACTLY_PURE_PYTHON=1`` runs the closures).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import mmh3

from ._core import NATIVE
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


#: ``mmh3.hash``'s arguments after the data: seed 0, unsigned.
_MMH3_ARGS: Final = (0, False)


def mmh3_32(data: bytes) -> int:
    """32-bit unsigned MurmurHash3 with seed 0."""
    return mmh3.hash(data, *_MMH3_ARGS)


class _Hash(NamedTuple):
    """A hash by name: its function, and how the native mapping calls the
    same without that function's frame (``call(data, *args)``)."""

    function: Callable[[bytes], int]
    call: Callable[..., int]
    args: tuple[Any, ...]


_HASHES: Final[dict[str, _Hash]] = {
    "mmh3": _Hash(mmh3_32, mmh3.hash, _MMH3_ARGS), "fnv1a": _Hash(fnv1a_32, fnv1a_32, ()),
}


def _hash(name: str) -> _Hash:
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
    if NATIVE is not None:
        return _native_mapping(modulo_mapping, key, partitions, hash)
    return py_modulo_mapping(key, partitions, hash=hash)


def rendezvous_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """Map a message by highest random weight: the first partition with the
    strictly largest ``h(key(msg)) ^ h(journal name)``.

    Journal-name hashes and routes are derived once while ``partitions()``
    returns the very same object (compared with ``is``).
    """
    if NATIVE is not None:
        return _native_mapping(rendezvous_mapping, key, partitions, hash)
    return py_rendezvous_mapping(key, partitions, hash=hash)


def py_modulo_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """``modulo_mapping``'s definition: what the native ``Mapping`` does."""
    h = _hash(hash).function
    cache = _Partitions(h)

    def mapping(msg: object) -> tuple[str, str]:
        routes = cache.of(partitions())[1]
        k = key(msg)
        return routes[h(k.encode() if isinstance(k, str) else bytes(k)) % len(routes)]

    return mapping


def py_rendezvous_mapping(
    key: MappingKeyFunc, partitions: PartitionsFunc, *, hash: str = "mmh3"
) -> MappingFunc:
    """``rendezvous_mapping``'s definition: what the native ``Mapping`` does."""
    h = _hash(hash).function
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


def _native_mapping(
    make: Callable[..., MappingFunc], key: MappingKeyFunc, partitions: PartitionsFunc,
    hash: str,
) -> MappingFunc:
    """``make``'s mapping (``modulo_mapping`` or ``rendezvous_mapping``) as
    the native core's ``Mapping``: routes derived by a ``_Partitions``, the
    same hash, and pickled as ``make(key, partitions, hash=hash)``."""
    h = _hash(hash)
    cache = _Partitions(h.function)
    mapping: MappingFunc = NATIVE.Mapping(key, partitions, cache.of, h.call, h.args,
                                          make is rendezvous_mapping, partial(make, hash=hash))
    return mapping


def random_mapping(partitions: PartitionsFunc) -> MappingFunc:
    """Map each message to a partition chosen at random."""

    def mapping(msg: object) -> tuple[str, str]:
        parts = partitions()
        if not parts:
            raise EmptyPartitionsError()
        return _route(parts[random.randrange(len(parts))])

    return mapping
