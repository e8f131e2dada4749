"""Both shipped JournalStore implementations pass the conformance suite.

The JournalClient and JournalStore contract (docs/api.md) is checked here,
through journal.testing's checks: the
``JournalClient`` protocol (``list`` with selectors, ``get``, ``append``
contiguous and never interleaved across threads, ``read`` with ``offset``,
``end_offset`` and ``block``, ``flush``, ``close``, the context manager) and
``create``, idempotent or ``JournalExistsError``. Elsewhere:
test_journal_labels.py (``JournalSpec``, ``LabelSet``, selectors,
``AppendResult``), test_journal_crash.py (appends from several processes; no
partial frame and no acknowledged append lost across SIGKILL),
test_journal_local.py (the on-disk store), test_gazette_client.py
(docs/gazette.md)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path

import pytest

from journal import JournalStore, LocalJournalStore, MemoryJournalClient
from journal.testing import CONFORMANCE_CHECKS, StoreFactory


def _local_factory(tmp_path: Path) -> StoreFactory:
    counter = itertools.count()

    def make() -> JournalStore:
        # A small fragment size so that retention has sealed fragments to remove.
        return LocalJournalStore(tmp_path / f"store-{next(counter)}", fragment_size=256)

    return make


@pytest.fixture(params=["memory", "local"])
def factory(request: pytest.FixtureRequest, tmp_path: Path) -> StoreFactory:
    if request.param == "memory":
        return MemoryJournalClient
    return _local_factory(tmp_path)


@pytest.mark.parametrize("check", CONFORMANCE_CHECKS, ids=lambda c: c.__name__)
def test_conformance(factory: StoreFactory, check: Callable[[StoreFactory], None]) -> None:
    """Each implementation meets every check of journal.testing."""
    check(factory)
