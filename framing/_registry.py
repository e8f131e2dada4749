"""The registry of framings, by content type. Built-in framings register
themselves when the package is imported; ``register_framing`` adds others."""

from __future__ import annotations

from ._errors import UnknownContentTypeError
from ._interfaces import Framing

# A plain dict: reads and single writes are atomic, so lookups are safe from
# any thread. Registration normally happens at import time.
_framings: dict[str, Framing] = {}


def register_framing(f: Framing) -> None:
    """Register ``f`` under ``f.content_type``, replacing any framing already
    registered for that content type."""
    content_type = f.content_type
    if not isinstance(content_type, str) or not content_type:
        raise ValueError(f"a framing needs a non-empty str content_type, not {content_type!r}")
    _framings[content_type] = f


def framing_by_content_type(ct: str) -> Framing:
    """The framing registered for content type ``ct`` (matched exactly).

    Raises ``UnknownContentTypeError`` (a ``ValueError``) if there is none.
    """
    try:
        return _framings[ct]
    except (KeyError, TypeError):
        raise UnknownContentTypeError(ct) from None


def registered_content_types() -> list[str]:
    """The content types a framing is registered for, sorted."""
    return sorted(_framings)
