"""Both shipped JournalStore implementations pass the conformance suite."""

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
