"""``exactly journals create|list|trim``."""

from __future__ import annotations

import argparse
import sys
from typing import Any

import orjson

from exactly._common import (
    CONTENT_TYPES,
    ArgumentsError,
    UsageError,
    broker_of,
    counted,
    open_store,
    parse_duration,
    root_of,
)


def cmd_journals_create(args: argparse.Namespace) -> int:
    labels: dict[str, list[str]] = {}
    for item in args.label or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UsageError(f"a label is name=value, not {item!r}")
        labels.setdefault(key, []).append(value)
    if "content-type" in labels:
        raise UsageError("give the content type with --content-type, not as a label")
    ct = _content_type(args.content_type)
    labels["content-type"] = [ct]
    options: dict[str, int] = {}
    if args.replication is not None:
        if broker_of(args) is None:
            raise ArgumentsError("--replication is for journals of a Gazette cluster (--broker)")
        options["replication"] = args.replication
    if broker_of(args) is None:
        root = root_of(args)
        if root.exists() and not root.is_dir():
            raise UsageError(f"the store {root} is not a directory")
        root.mkdir(parents=True, exist_ok=True)
    from journal import JournalNotFoundError

    with open_store(args) as store:
        for name in args.names:
            try:
                existed = store.get(name) is not None
            except JournalNotFoundError:
                existed = False
            spec = store.create(name, labels, **options)  # other labels: JournalExistsError
            if existed:
                print(f"{spec.name} already exists ({spec.content_type}): left as it is")
            else:
                print(f"created {spec.name} ({spec.content_type})")
    return 0


def _content_type(text: str) -> str:
    """The content type that ``--content-type`` names (a short name or a full
    type), refused as ``create`` refuses it (``journal.check_content_type``)."""
    from framing import registered_content_types
    from journal import InvalidLabelError, check_content_type

    if not text.strip():
        raise ArgumentsError("--content-type cannot be empty (ndjson, csv, proto, or a full type)")
    ct = CONTENT_TYPES.get(text, text)
    try:
        check_content_type(ct)
    except InvalidLabelError:
        short = {v: k for k, v in reversed(CONTENT_TYPES.items())}
        known = ", ".join(
            f"{short[c]} ({c})" if c in short else c for c in registered_content_types()
        )
        raise UsageError(f"unknown content type {text!r}: no framing reads it; use one of"
                         f" {known}") from None
    return ct


def cmd_journals_list(args: argparse.Namespace) -> int:
    from journal import JournalError, LocalJournalStore, parse_label_selector

    damaged: list[str] = []
    with open_store(args) as store:
        selector = parse_label_selector(args.selector or "")
        if isinstance(store, LocalJournalStore):
            # One journal whose spec cannot be read does not hide the others
            # (list() refuses the whole listing for it).
            specs: list[Any] = []
            for name in store.names():
                try:
                    spec = store.get(name)
                except JournalError as exc:
                    damaged.append(f"exactly: error: {exc}")
                    specs.append(name)
                    continue
                if selector.matches(spec):
                    specs.append(spec)
        else:
            specs = store.list(selector)
        for spec in specs:
            if isinstance(spec, str):  # its spec is unreadable: no labels, no size
                if args.json:
                    print(orjson.dumps({"name": spec, "head": None, "labels": None}).decode())
                else:
                    print(f"{spec}\t?\tdamaged")
                continue
            try:
                head: int | None = store.head(spec.name)
            except JournalError as exc:
                # One damaged journal does not hide the others.
                head = None
                damaged.append(f"exactly: error: {exc}")
            if args.json:
                doc = {"name": spec.name, "head": head, "labels": spec.labels.to_dict()}
                print(orjson.dumps(doc).decode())
            else:
                size = f"{head} bytes" if head is not None else "damaged"
                print(f"{spec.name}\t{spec.content_type or '-'}\t{size}")
        if not specs and not args.json:
            print("no journals", file=sys.stderr)
    for line in damaged:
        print(line, file=sys.stderr)
    if damaged:
        print("exactly: `exactly fsck` says more; `exactly fsck --repair` repairs",
              file=sys.stderr)
    return 1 if damaged else 0


def cmd_journals_trim(args: argparse.Namespace) -> int:
    if args.before is None and args.older_than is None:
        raise ArgumentsError("say what to trim: --before OFFSET and/or --older-than DURATION")
    older = parse_duration(args.older_than) if args.older_than else None
    with open_store(args) as store:
        before = store.fragments(args.name)
        first = store.trim(args.name, before_offset=args.before, older_than=older)
        # (Counted from the listing before: a cluster's brokers list the
        # fragment store again only every refresh interval.)
        removed = sum(1 for f in before if f.end <= first)
        print(f"{args.name}: removed {counted(removed, 'fragment')}; first readable offset is"
              f" now {first}")
        if not removed:
            print("  (only whole sealed fragments are removed, never the one being written)",
                  file=sys.stderr)
    return 0
