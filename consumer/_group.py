"""``ShardGroup``: a consumer application's shards, members and claims, as
kept in etcd under one prefix.

::

    PREFIX/specs/SHARD      the ShardSpec, JSON        written by `exactly shards apply`
    PREFIX/members/MEMBER   {"host", "pid", "since"}   under the member's lease
    PREFIX/claims/SHARD     {"member", "host"}         under the claiming member's lease
    PREFIX/homes/SHARD      {"host", "store", "path"}  where a store on local disk lives

A claim is created by an etcd transaction that holds only while no claim
of the shard exists and the member's own key is still under its lease, so
that two members never hold one shard at once. A claim, like the member
key, goes with its lease: a member that dies loses them within the lease's
TTL, and its shards are claimed by others.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from journal import parse_duration

from ._errors import ConsumerError
from ._etcd import EtcdClient
from ._shard import ShardSpec

#: Where a group's keys live in etcd unless told otherwise.
DEFAULT_ETCD_PREFIX: Final = "/exactly/consumer"
#: etcd's default --max-txn-ops: larger applies are cut into transactions of this many.
_MAX_TXN_OPS: Final = 128


class SpecFileError(ConsumerError):
    """A file of shard specs that cannot be applied: it says where and why."""


def _prefix(prefix: str) -> str:
    if not prefix.startswith("/") or prefix.rstrip("/") == "":
        raise ValueError(f"etcd prefix {prefix!r}: give a path such as {DEFAULT_ETCD_PREFIX}")
    return prefix.rstrip("/")


@dataclass(frozen=True, slots=True)
class Keys:
    """The etcd keys of a group under ``prefix``."""

    prefix: str

    def spec(self, shard: str) -> str:
        return f"{self.prefix}/specs/{shard}"

    def member(self, member: str) -> str:
        return f"{self.prefix}/members/{member}"

    def claim(self, shard: str) -> str:
        return f"{self.prefix}/claims/{shard}"

    def home(self, shard: str) -> str:
        return f"{self.prefix}/homes/{shard}"

    def split(self, key: str) -> tuple[str, str] | None:
        """``(kind, name)`` of one of the group's keys: kind is ``specs``,
        ``members``, ``claims`` or ``homes``."""
        if not key.startswith(self.prefix + "/"):
            return None
        kind, sep, name = key[len(self.prefix) + 1:].partition("/")
        return (kind, name) if sep and name else None


@dataclass(frozen=True, slots=True)
class Claim:
    """A shard claimed by ``member`` (on ``host``) at etcd ``revision``, under ``lease``."""

    shard: str
    member: str
    host: str
    revision: int
    lease: int


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """A live member of the group: its ``id``, ``host``, ``pid`` and ``lease``."""

    id: str
    host: str
    pid: int
    lease: int


@dataclass(frozen=True, slots=True)
class GroupView:
    """The whole group as etcd held it at ``revision``."""

    revision: int
    specs: dict[str, ShardSpec]
    members: dict[str, MemberInfo]
    claims: dict[str, Claim]
    homes: dict[str, dict[str, Any]]
    #: Keys under the prefix that could not be read, and why.
    unreadable: list[str]

    def held(self) -> dict[str, int]:
        """How many shards each live member holds claims of (0 for none)."""
        counts = dict.fromkeys(self.members, 0)
        for claim in self.claims.values():
            if claim.member in counts:
                counts[claim.member] += 1
        return counts


def spec_to_json(spec: ShardSpec) -> bytes:
    return orjson.dumps({
        "id": spec.id, "sources": list(spec.sources),
        "max_txn_duration": spec.max_txn_duration, "min_txn_duration": spec.min_txn_duration,
    })


def _seconds(value: Any, field: str) -> float:
    """A number of seconds, or a duration such as ``500ms``, ``2s``, ``1m30s``."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{field} must be a number of seconds or a duration such as 2s")
    if isinstance(value, str):
        try:
            return parse_duration(value)
        except ValueError:
            raise ValueError(f"{field}: {value!r} is not a number of seconds or a duration"
                             " such as 2s") from None
    return float(value)


def spec_from_mapping(doc: Mapping[str, Any]) -> ShardSpec:
    """A ShardSpec of a JSON or YAML mapping (``id``, ``sources``,
    ``max_txn_duration``, ``min_txn_duration``); ``ValueError`` says what is wrong."""
    known = {"id", "sources", "max_txn_duration", "min_txn_duration"}
    unknown = sorted(set(doc) - known)
    if unknown:
        raise ValueError(f"unknown field {unknown[0]!r} (a shard has {', '.join(sorted(known))})")
    if "id" not in doc or "sources" not in doc:
        raise ValueError("a shard needs an id and its sources")
    kwargs: dict[str, Any] = {"id": doc["id"], "sources": doc["sources"]}
    for field in ("max_txn_duration", "min_txn_duration"):
        if field in doc:
            kwargs[field] = _seconds(doc[field], field)
    if not isinstance(kwargs["sources"], list | tuple):
        raise ValueError(f"sources must be a list of journal names, not {kwargs['sources']!r}")
    return ShardSpec(**kwargs)


def spec_from_json(data: bytes) -> ShardSpec:
    doc = orjson.loads(data)
    if not isinstance(doc, dict):
        raise ValueError("not a JSON object")
    return spec_from_mapping(doc)


def read_spec_file(path: str | Path, text: str | None = None) -> tuple[list[ShardSpec], list[str]]:
    """The shards a YAML or JSON file names: those to apply, and the ids of
    those marked ``delete: true``. The file holds ``shards:``, a list of
    shards, and may hold ``common:``, values every shard takes unless it sets
    its own (as ``gazctl shards apply`` reads them)::

        common:
          max_txn_duration: 2s
        shards:
          - id: count-1
            sources: [words-1]
          - id: count-2
            sources: [words-2]
          - id: old
            delete: true
    """
    name = str(path)
    if text is None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise SpecFileError(f"{name}: {exc.strerror or exc}") from exc
    try:
        import yaml  # a JSON document is YAML too
    except ImportError as exc:  # pragma: no cover - a dependency
        raise SpecFileError("reading shard specs needs PyYAML (pip install pyyaml)") from exc
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        # The parser's own text spans lines (with a copy of the line and a
        # caret): what is wrong, and where, is enough.
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise SpecFileError(f"{name}: not YAML or JSON: {problem}{where}") from exc
    if isinstance(doc, list):
        doc = {"shards": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("shards"), list):
        raise SpecFileError(f"{name}: expected a mapping with a list of 'shards'")
    extra = sorted(set(doc) - {"shards", "common"})
    if extra:
        raise SpecFileError(f"{name}: unknown field {extra[0]!r} (expected shards and common)")
    common = doc.get("common") or {}
    if not isinstance(common, dict):
        raise SpecFileError(f"{name}: common must be a mapping")
    specs: list[ShardSpec] = []
    deletes: list[str] = []
    seen: set[str] = set()
    for i, entry in enumerate(doc["shards"]):
        where = f"{name}: shard {i + 1}"
        if not isinstance(entry, dict):
            raise SpecFileError(f"{where}: expected a mapping, not {entry!r}")
        if "id" in entry:
            where += f" ({entry['id']})"
            if entry["id"] in seen:
                raise SpecFileError(f"{where}: the id is given twice")
            seen.add(entry["id"])
        if entry.get("delete") is True:
            if not isinstance(entry.get("id"), str):
                raise SpecFileError(f"{where}: delete needs the shard's id")
            deletes.append(entry["id"])
            continue
        fields = {**common, **{k: v for k, v in entry.items() if k != "delete"}}
        try:
            specs.append(spec_from_mapping(fields))
        except (ValueError, TypeError) as exc:
            raise SpecFileError(f"{where}: {exc}") from None
    return specs, deletes


def quotas(members: Iterable[str], shards: int) -> dict[str, int]:
    """How many of ``shards`` each member should serve: an even share, the
    remainder going to the first members in sorted order."""
    order = sorted(members)
    if not order:
        return {}
    base, extra = divmod(shards, len(order))
    return {m: base + (1 if i < extra else 0) for i, m in enumerate(order)}


class ShardGroup:
    """The shards of one consumer application, kept in etcd under
    ``prefix`` (see the module docstring): what ``exactly shards apply``,
    ``list`` and ``delete`` change and show, and what ``Member`` serves."""

    def __init__(self, etcd: EtcdClient, prefix: str = DEFAULT_ETCD_PREFIX) -> None:
        self.etcd = etcd
        self.keys = Keys(_prefix(prefix))

    @property
    def prefix(self) -> str:
        return self.keys.prefix

    #: How many of N shards each member should serve (see ``quotas``).
    quotas = staticmethod(quotas)

    def apply(self, specs: Sequence[ShardSpec], delete: Sequence[str] = ()) -> dict[str, str]:
        """Create or update ``specs`` and delete the shards ``delete`` names,
        in one etcd transaction (of at most 128 changes each); return what
        happened to each shard: ``created``, ``updated``, ``unchanged``,
        ``deleted`` or ``absent`` (deleted, but there was no such shard)."""
        named = Counter([*(s.id for s in specs), *delete])
        twice = sorted(i for i, n in named.items() if n > 1)
        if twice:
            raise ValueError(f"shard {twice[0]} is named twice")
        current = self.view().specs
        result: dict[str, str] = {}
        ops = []
        for spec in specs:
            old = current.get(spec.id)
            if old == spec:
                result[spec.id] = "unchanged"
                continue
            result[spec.id] = "created" if old is None else "updated"
            ops.append(EtcdClient.put_op(self.keys.spec(spec.id), spec_to_json(spec)))
        for shard in delete:
            result[shard] = "deleted" if shard in current else "absent"
            if shard in current:
                ops.append(EtcdClient.delete_op(self.keys.spec(shard)))
        for i in range(0, len(ops), _MAX_TXN_OPS):
            self.etcd.txn([], ops[i:i + _MAX_TXN_OPS])
        return result

    def delete(self, shards: Sequence[str]) -> dict[str, str]:
        """Delete these shards' specs (their members stop serving them);
        see ``apply`` for what is returned."""
        return self.apply([], shards)

    def view(self) -> GroupView:
        """Specs, live members, claims and homes, read at one revision."""
        revision, kvs = self.etcd.get(self.prefix + "/", prefix=True)
        specs: dict[str, ShardSpec] = {}
        members: dict[str, MemberInfo] = {}
        claims: dict[str, Claim] = {}
        homes: dict[str, dict[str, Any]] = {}
        bad: list[str] = []
        for kv in kvs:
            split = self.keys.split(kv.key)
            if split is None:
                continue
            kind, name = split
            try:
                doc = orjson.loads(kv.value)
                if kind == "specs":
                    specs[name] = spec_from_json(kv.value)
                elif kind == "members":
                    members[name] = MemberInfo(name, str(doc["host"]), int(doc["pid"]), kv.lease)
                elif kind == "claims":
                    claims[name] = Claim(name, str(doc["member"]), str(doc["host"]),
                                         kv.create_revision, kv.lease)
                elif kind == "homes":
                    homes[name] = dict(doc)
            except (ValueError, TypeError, KeyError) as exc:
                bad.append(f"{kv.key}: {exc}")
        return GroupView(revision, specs, members, claims, homes, bad)

