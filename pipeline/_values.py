"""How the text of one of the data source's options becomes a value: true or
false, a whole number of at least 1, a number of seconds. Every module of
the data source reads such options through these, so that each kind has
one rule and one error message.

An option that is absent, or given as an empty (or blank) text, takes its
default; any other text that is not a value of its kind is a
``ValueError`` naming the option and what it takes.
"""

from __future__ import annotations

from collections.abc import Mapping


def _text(options: Mapping[str, str], name: str) -> str | None:
    """The option's text, stripped; None if it is absent or blank."""
    value = options.get(name)
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def given(options: Mapping[str, str], name: str) -> bool:
    """Whether option ``name`` is given (present, and not blank)."""
    return _text(options, name) is not None


def bool_option(options: Mapping[str, str], name: str, default: bool) -> bool:
    """Option ``name``: ``true`` or ``false`` (in any case)."""
    text = _text(options, name)
    if text is None:
        return default
    value = text.lower()
    if value not in ("true", "false"):
        raise ValueError(f"the option {name} must be true or false, not {text!r}")
    return value == "true"


def positive_option(options: Mapping[str, str], name: str, what: str) -> int | None:
    """Option ``name`` as a whole number of at least 1, or None if not given;
    ``what`` says what it counts, in the error for any other value."""
    text = _text(options, name)
    if text is None:
        return None
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise ValueError(f"the option {name} must be {what}, not {text!r}")
    return n


def seconds_option(options: Mapping[str, str], name: str, *, zero_ok: bool = False
                   ) -> float | None:
    """Option ``name`` as a number of seconds above 0 (or 0 too, if
    ``zero_ok``), or None if not given."""
    text = _text(options, name)
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (seconds > 0 or (zero_ok and seconds == 0)):
        what = "0 or more" if zero_ok else "above 0"
        raise ValueError(f"the option {name} must be a number of seconds {what}, not {text!r}")
    return seconds
