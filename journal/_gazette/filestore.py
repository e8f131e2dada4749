"""A cluster's ``file://`` fragment store: whether the brokers have one
and, where a client has it mounted (``file_root``), the retention
``gazctl journals prune`` applies and the removal of a deleted journal's
fragments. Brokers offer no RPC that removes
content: what is persisted belongs to the store."""

from __future__ import annotations

import contextlib
import os
from typing import Final

from .._errors import BrokerError
from .._spec import Fragment
from . import broker_pb2 as pb
from .brokers import Brokers, Stub
from .wire import CONTENT_NAME

#: The fragment store ``create`` uses where the cluster has one.
FILE_STORE: Final = "file:///"


def has_file_store(brokers: Brokers, what: str) -> bool:
    """Whether the cluster's brokers have a ``file://`` fragment store
    (asked on the way to ``what``, which errors name)."""
    request = pb.FragmentStoreHealthRequest(fragment_store=FILE_STORE)

    def attempt(stub: Stub, endpoint: str) -> bool:
        resp = stub.store_health(request, timeout=brokers.rpc_timeout)
        return bool(resp.status == pb.OK)

    try:
        return brokers.call(what, None, attempt)
    except BrokerError as err:
        if err.status == "UNIMPLEMENTED":  # An older broker: assume none.
            return False
        raise


def under(file_root: str | None, path: str) -> bool:
    """Is ``path`` (a fragment's, from ``fragments()``) a file under ``file_root``?"""
    return file_root is not None and path.startswith(file_root + os.sep)


def prune(fragments: list[Fragment], file_root: str | None, before_offset: int | None,
          cutoff: float | None) -> int:
    """Remove from the store, oldest first, each persisted fragment of
    ``fragments`` (in offset order) that ends at or before ``before_offset``
    and/or was persisted before ``cutoff`` (seconds since the epoch),
    stopping at the first to keep, not yet persisted, or not under
    ``file_root``; returns how many were removed."""
    removed = 0
    for f in fragments:
        if not f.sealed or not under(file_root, f.path):
            break  # Not persisted yet, or in a store this client cannot reach.
        if before_offset is not None and f.end > before_offset:
            break
        if cutoff is not None and f.mtime >= cutoff:
            break
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f.path)
        removed += 1
    return removed


def remove_persisted(file_root: str, name: str) -> None:
    """Remove the fragment files of journal ``name`` from the file store
    under ``file_root`` (all of them: brokers list a persisted fragment
    only at their next refresh). Child journals' directories stay."""
    directory = os.path.join(file_root, *name.split("/"))
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            if entry.is_file(follow_symlinks=False) and CONTENT_NAME.fullmatch(entry.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
