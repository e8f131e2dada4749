"""Journal specifications, journal names and append results."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from ._errors import InvalidJournalNameError, InvalidLabelError
from ._labels import LabelSet, LabelsInit, validate_journal_labels

#: Gazette's maximum journal name length, in bytes of UTF-8.
MAX_JOURNAL_NAME_LEN: Final = 512
#: The label that names a journal's content type (and so its framing).
CONTENT_TYPE_LABEL: Final = "content-type"
# A media type as Gazette's brokers parse one (Go's mime.ParseMediaType): a
# token, optionally "/" and a second token (parameters cannot be written in
# a label value). Tokens: printable ASCII but MIME's special characters.
_MEDIA_TYPE: Final = re.compile(r"[A-Za-z0-9!#$&'*+.^_`|~-]+(?:/[A-Za-z0-9!#$&'*+.^_`|~-]+)?")

# Letters and numbers of any script plus Gazette's path symbols "-_+/.=%".
_NAME_RE: Final = re.compile(r"[\w\-+/.=%]+")


def validate_journal_name(name: str) -> None:
    """Raise ``InvalidJournalNameError`` unless ``name`` follows Gazette's rules.

    A name draws from letters, digits and ``-_+/.=%``, is a clean relative
    path (no leading or trailing ``/``, no ``//``, no ``.`` or ``..``
    component) and is at most 512 bytes long. Gazette also asks for at least
    4 bytes; we accept shorter names, which nothing here depends on.
    """
    if not isinstance(name, str):
        raise TypeError(f"journal name must be a str, not {type(name).__name__}")
    size = len(name.encode())
    if not 1 <= size <= MAX_JOURNAL_NAME_LEN:
        raise InvalidJournalNameError(
            name, f"invalid length ({size}; expected 1 <= length <= {MAX_JOURNAL_NAME_LEN})"
        )
    if not _NAME_RE.fullmatch(name):
        raise InvalidJournalNameError(
            name, "only letters, digits and the symbols -_+/.=% are allowed"
        )
    if name.startswith("/"):
        raise InvalidJournalNameError(name, "cannot begin with '/'")
    for part in name.split("/"):
        if part in ("", ".", ".."):
            raise InvalidJournalNameError(
                name, "must be a clean path (no trailing '/', '//', '.' or '..' component)"
            )


class AppendResult(NamedTuple):
    """Where an append landed: bytes ``[begin, end)`` of ``journal``."""

    journal: str
    begin: int
    end: int


@dataclass(frozen=True, slots=True, init=False)
class JournalSpec:
    """A journal's name and labels.

    ``labels`` may be given as a ``LabelSet`` or as anything ``LabelSet``
    accepts, e.g. ``JournalSpec("a/b", {"content-type": "application/x-ndjson"})``.
    Construction does not validate the name or labels against Gazette's rules
    (``validate()`` does, and stores do on ``create``).
    """

    name: str
    labels: LabelSet = field(default_factory=LabelSet)

    def __init__(self, name: str, labels: LabelSet | LabelsInit | None = None) -> None:
        if not isinstance(name, str):
            raise TypeError(f"journal name must be a str, not {type(name).__name__}")
        object.__setattr__(self, "name", name)
        object.__setattr__(
            self, "labels", labels if isinstance(labels, LabelSet) else LabelSet(labels)
        )

    @property
    def content_type(self) -> str | None:
        """The value of the ``content-type`` label, or None."""
        return self.labels.value_of(CONTENT_TYPE_LABEL)

    def validate(self) -> None:
        """Raise ``InvalidJournalNameError`` / ``InvalidLabelError`` if the
        name or the labels break Gazette's rules. Every store's ``create``
        validates the spec it is given. A ``content-type`` is any media type
        (``type/subtype``), as Gazette's brokers accept it, whether or not a
        framing of this process reads it (it may be registered by the
        programs that read the journal); reading messages of a type no
        framing reads raises ``FramingError``."""
        validate_journal_name(self.name)
        validate_journal_labels(self.labels)
        ct = self.content_type
        if ct and not _MEDIA_TYPE.fullmatch(ct):
            raise InvalidLabelError(
                CONTENT_TYPE_LABEL, f"{ct!r} is not a media type (type/subtype, as in text/csv)")


def check_content_type(content_type: str) -> None:
    """Raise ``InvalidLabelError`` unless a framing is registered in this
    process for ``content_type`` (``framing.registered_content_types()``):
    what the command line creates, publishes and reads (a journal of
    another type takes raw appends and reads, not messages). A journal of
    raw bytes has no ``content-type`` label."""
    from framing import registered_content_types

    known = registered_content_types()
    if content_type not in known:
        raise InvalidLabelError(
            CONTENT_TYPE_LABEL,
            f"no framing reads {content_type!r} (registered: {', '.join(known)};"
            " a journal of raw bytes has no content-type label)",
        )


#: The file extension of an uncompressed fragment (Gazette's content names).
RAW_EXTENSION: Final = ".raw"


def sealed_name(begin: int, end: int, sha1: bytes) -> str:
    """Gazette's content name of a sealed, uncompressed fragment."""
    return f"{begin:016x}-{end:016x}-{sha1.hex()}{RAW_EXTENSION}"


@dataclass(frozen=True, slots=True)
class Fragment:
    """A contiguous piece ``[begin, end)`` of a journal and the file holding it.

    For a sealed fragment the file holds exactly those bytes and is named
    ``sealed_name(begin, end, sha1)``. For the open fragment (``sealed`` is
    False) only the first ``end - begin`` bytes of the file are committed;
    anything after them may be a write in progress and must not be read.
    ``mtime`` is the file's modification time (seconds since the epoch).
    """

    journal: str
    begin: int
    end: int
    path: str
    sealed: bool
    mtime: float
    sha1: bytes | None = None

    @property
    def size(self) -> int:
        """Number of committed content bytes."""
        return self.end - self.begin

    @property
    def content_name(self) -> str | None:
        """Gazette's content name of a sealed fragment; None for the open one."""
        if not self.sealed or self.sha1 is None:
            return None
        return sealed_name(self.begin, self.end, self.sha1)
