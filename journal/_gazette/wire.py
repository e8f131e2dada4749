"""Conversions between this package's values and Gazette's protobuf messages."""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final

from google.protobuf.duration_pb2 import Duration

from .._labels import LabelSelector, LabelSet
from .._spec import Fragment, JournalSpec
from . import broker_pb2 as pb

#: Codec names accepted by ``GazetteClient(compression=...)``.
CODECS: Final = {
    "none": pb.NONE,
    "gzip": pb.GZIP,
    "zstandard": pb.ZSTANDARD,
    "snappy": pb.SNAPPY,
    # gzip, stored with Content-Encoding: gzip, so that an HTTP client of a
    # cloud store (a browser, curl) gets the content decompressed.
    "gzip_offload": pb.GZIP_OFFLOAD_DECOMPRESSION,
}
# Gazette's own bounds (broker/protocol/journal_spec_extensions.go).
MIN_FRAGMENT_LENGTH: Final = 1 << 10
MAX_FRAGMENT_LENGTH: Final = 1 << 34
MAX_REPLICATION: Final = 5
MIN_FLUSH_INTERVAL: Final = timedelta(minutes=1)
MIN_JOURNAL_NAME_LEN: Final = 4
# The ":prefix" suffix of a selector label name (see journal._labels).
_PREFIX_SUFFIX: Final = ":prefix"


def label_set(labels: LabelSet) -> pb.LabelSet:
    # LabelSet iterates (name, value) sorted, as Gazette keeps them.
    return pb.LabelSet(labels=[pb.Label(name=n, value=v) for n, v in labels])


def labels_of(msg: pb.LabelSet) -> LabelSet:
    return LabelSet([(label.name, label.value) for label in msg.labels])


def selector(sel: LabelSelector) -> pb.LabelSelector:
    """A selector for the List RPC; ``name:prefix`` labels become prefix labels."""

    def convert(labels: LabelSet) -> pb.LabelSet:
        out = []
        for name, value in labels:
            prefix = name.endswith(_PREFIX_SUFFIX)
            if prefix:
                name = name[: -len(_PREFIX_SUFFIX)]
            out.append(pb.Label(name=name, value=value, prefix=prefix))
        out.sort(key=lambda label: (label.name, label.value))
        return pb.LabelSet(labels=out)

    return pb.LabelSelector(include=convert(sel.include), exclude=convert(sel.exclude))


def journal_spec(msg: pb.JournalSpec) -> JournalSpec:
    return JournalSpec(msg.name, labels_of(msg.labels))


def duration(td: timedelta) -> Duration:
    d = Duration()
    d.FromTimedelta(td)
    return d


@dataclass(frozen=True, slots=True)
class SpecDefaults:
    """What ``create`` puts in a JournalSpec besides its name and labels."""

    replication: int
    fragment_length: int
    compression: str
    stores: tuple[str, ...]
    flush_interval: timedelta | None
    refresh_interval: timedelta
    retention: timedelta | None

    def overridden(self, **given: Any) -> SpecDefaults:
        """These settings, with those of ``given`` that are not None instead."""
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})

    def check(self) -> None:
        """Raise ``ValueError`` for settings Gazette would refuse."""
        if not 1 <= self.replication <= MAX_REPLICATION:
            raise ValueError(
                f"replication must be 1 to {MAX_REPLICATION} (not {self.replication})"
            )
        if not MIN_FRAGMENT_LENGTH <= self.fragment_length <= MAX_FRAGMENT_LENGTH:
            raise ValueError(
                f"fragment_length must be {MIN_FRAGMENT_LENGTH} to {MAX_FRAGMENT_LENGTH} bytes"
                f" (not {self.fragment_length})"
            )
        if self.compression not in CODECS:
            raise ValueError(
                f"unknown compression {self.compression!r} (use one of {', '.join(CODECS)})"
            )
        if self.flush_interval is not None and self.flush_interval < MIN_FLUSH_INTERVAL:
            raise ValueError(
                f"flush_interval must be at least a minute (not {self.flush_interval})"
            )
        if not timedelta(seconds=1) <= self.refresh_interval <= timedelta(days=1):
            raise ValueError(
                f"refresh_interval must be 1 s to 1 day (not {self.refresh_interval})"
            )
        for store in self.stores:
            if "://" not in store:
                raise ValueError(f"a fragment store is a URL such as file:/// (not {store!r})")

    def spec(self, name: str, labels: LabelSet) -> pb.JournalSpec:
        fragment = pb.JournalSpec.Fragment(
            length=self.fragment_length,
            compression_codec=CODECS[self.compression],
            stores=list(self.stores),
            refresh_interval=duration(self.refresh_interval),
        )
        if self.flush_interval is not None:
            fragment.flush_interval.CopyFrom(duration(self.flush_interval))
        if self.retention is not None:
            fragment.retention.CopyFrom(duration(self.retention))
        return pb.JournalSpec(
            name=name,
            replication=self.replication,
            labels=label_set(labels),
            fragment=fragment,
            flags=pb.JournalSpec.O_RDWR,
        )


def to_timedelta(value: float | timedelta | None) -> timedelta | None:
    if value is None or isinstance(value, timedelta):
        return value
    return timedelta(seconds=float(value))


# Gazette's content name of a fragment file: begin-end-sha1 and its extension.
CONTENT_NAME: Final = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}(\.[a-z]+)?")
# Gazette's fragment file extensions by codec (broker/codecs).
_EXT: Final = {
    pb.INVALID: ".raw",
    pb.NONE: ".raw",
    pb.GZIP: ".gz",
    pb.ZSTANDARD: ".zst",
    pb.SNAPPY: ".sz",
    pb.GZIP_OFFLOAD_DECOMPRESSION: "",
}


def _sha1_bytes(s: pb.SHA1Sum) -> bytes:
    return s.part1.to_bytes(8, "big") + s.part2.to_bytes(8, "big") + s.part3.to_bytes(4, "big")


def _sha1_hex(s: pb.SHA1Sum) -> str:
    return _sha1_bytes(s).hex()


def fragment_of(name: str, f: pb.Fragment, file_root: str | None) -> Fragment:
    """The ``Fragment`` of journal ``name`` that the brokers list as ``f``:
    its URL in the backing store (Gazette's ``Fragment.ContentPath`` under
    the store's URL), a local path for a ``file://`` store under
    ``file_root``."""
    url = ""
    if f.backing_store:
        content = f"{f.begin:016x}-{f.end:016x}-{_sha1_hex(f.sum)}{_EXT[f.compression_codec]}"
        postfix = f"{f.path_postfix}/" if f.path_postfix else ""
        store = f.backing_store if f.backing_store.endswith("/") else f.backing_store + "/"
        url = f"{store}{name}/{postfix}{content}"
    path = url
    if url.startswith("file://") and file_root is not None:
        path = os.path.join(file_root, url[len("file://") :].lstrip("/"))
    return Fragment(name, f.begin, f.end, path, bool(f.backing_store), float(f.mod_time),
                    _sha1_bytes(f.sum))
