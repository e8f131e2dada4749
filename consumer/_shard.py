"""``ShardSpec``, what a shard is, and ``Shard``, what the application is handed."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, final

from journal import validate_journal_name

if TYPE_CHECKING:
    from journal import JournalClient

#: What a shard ID may hold (Gazette's token symbols), and how long it may be.
_ID_RE: Final = re.compile(r"[A-Za-z0-9\-_+/.=%:@]+")
MAX_SHARD_ID_LEN: Final = 512


@dataclass(frozen=True, slots=True)
class ShardSpec:
    """One shard of a consumer application: the journals it reads committed
    (``sources``) and how long its transactions may run.

    A transaction begins with the first message ready and ends once
    ``max_txn_duration`` seconds have passed since it began, or earlier,
    when no message is ready and ``min_txn_duration`` has passed (a
    ``min_txn_duration`` above ``max_txn_duration`` never holds a
    transaction past the latter, as in Gazette). A list given for
    ``sources`` is kept as a tuple. Bad values raise ``ValueError``.
    """

    id: str
    #: Kept as a tuple whatever sequence is given.
    sources: Sequence[str]
    max_txn_duration: float = 1.0
    min_txn_duration: float = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not _ID_RE.fullmatch(self.id):
            raise ValueError(
                f"shard id {self.id!r}: use letters, digits and -_+/.=%:@ (at least one)"
            )
        if len(self.id) > MAX_SHARD_ID_LEN:
            raise ValueError(f"shard id is {len(self.id)} characters long; at most 512")
        if isinstance(self.sources, str | bytes) or not isinstance(self.sources, Sequence):
            raise ValueError(
                f"shard {self.id}: sources must be a list or tuple of journal names,"
                f" not {type(self.sources).__name__}"
            )
        sources = tuple(self.sources)
        if not sources:
            raise ValueError(f"shard {self.id}: name at least one source journal")
        for name in sources:
            try:
                validate_journal_name(name)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"shard {self.id}: source {name!r}: {exc}") from exc
        if len(set(sources)) != len(sources):
            raise ValueError(f"shard {self.id}: a source journal is named twice")
        object.__setattr__(self, "sources", sources)
        for field in ("max_txn_duration", "min_txn_duration"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise ValueError(f"shard {self.id}: {field} must be a number of seconds")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"shard {self.id}: {field} must be finite and >= 0, not {value}")
        if self.max_txn_duration <= 0:
            raise ValueError(f"shard {self.id}: max_txn_duration must be above 0")


@final
class Shard:
    """A shard as the application sees it: its ``spec``, its ``id``, and the
    ``client`` the runtime reads and publishes with."""

    __slots__ = ("_client", "_spec")

    def __init__(self, spec: ShardSpec, client: JournalClient) -> None:
        self._spec = spec
        self._client = client

    @property
    def spec(self) -> ShardSpec:
        return self._spec

    @property
    def id(self) -> str:
        return self._spec.id

    @property
    def client(self) -> JournalClient:
        return self._client

    def __repr__(self) -> str:
        return f"Shard({self._spec.id!r}, sources={list(self._spec.sources)!r})"
