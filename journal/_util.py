"""Small helpers shared by the journal clients."""

from __future__ import annotations

from datetime import timedelta

from ._errors import OffsetNotYetAvailableError


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
