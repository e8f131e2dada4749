"""Small helpers shared by the journal clients."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Final

from ._errors import OffsetNotYetAvailableError

_NUMBER: Final = r"(\d+(?:\.\d*)?|\.\d+)"
_SECONDS: Final = re.compile(_NUMBER)
_DURATION_PART: Final = re.compile(_NUMBER + r"\s*(ms|s|m|h|d)\s*")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """Seconds of a duration written as people and Gazette's tools write
    them: a number of seconds (``90``, ``0.5``), or numbers with units
    ``ms``, ``s``, ``m``, ``h``, ``d`` (``500ms``, ``15m``, ``1m30s``,
    ``7d``). Raises ``ValueError`` for anything else."""
    stripped = text.strip()
    if _SECONDS.fullmatch(stripped):
        return float(stripped)
    total, at = 0.0, 0
    while at < len(stripped):
        m = _DURATION_PART.match(stripped, at)
        if m is None:
            break
        total += float(m.group(1)) * _UNIT_SECONDS[m.group(2)]
        at = m.end()
    if not stripped or at < len(stripped):
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 500ms, 1m30s, 2h, 7d)")
    return total


def age_seconds(before_offset: int | None, older_than: float | timedelta | None) -> float | None:
    """Validate ``trim()`` criteria; return ``older_than`` in seconds (or None)."""
    if before_offset is None and older_than is None:
        raise ValueError("trim needs before_offset and/or older_than")
    if before_offset is not None and before_offset < 0:
        raise ValueError(f"invalid before_offset ({before_offset}; expected >= 0)")
    if older_than is None:
        return None
    age = older_than.total_seconds() if isinstance(older_than, timedelta) else float(older_than)
    if age < 0:
        raise ValueError(f"invalid older_than ({older_than}; expected >= 0)")
    return age


def check_offsets(offset: int, end_offset: int | None) -> None:
    """Validate a read's range once ``-1`` (the head) is resolved."""
    if offset < 0:
        raise ValueError(f"invalid offset ({offset}; expected >= 0, or -1 for the head)")
    if end_offset is not None and end_offset < offset:
        raise ValueError(f"end_offset ({end_offset}) is before offset ({offset})")


def check_read_args(name: str, offset: int, end_offset: int | None, block: bool, head: int) -> int:
    """Validate ``read()`` arguments; return the start offset (``-1`` -> head)."""
    if offset == -1:
        offset = head
    check_offsets(offset, end_offset)
    if not block and offset > head:
        raise OffsetNotYetAvailableError(name, offset, head)
    return offset
