"""The exceptions of the ``journal`` package.

Everything the package raises on purpose derives from ``JournalError``, so
callers may catch at any level of this tree::

    JournalError
     ├── JournalNotFoundError       no journal of that name (.journal)
     ├── JournalExistsError         create() with other labels (.journal, .labels)
     ├── InvalidJournalNameError    a name breaks Gazette's rules (.journal)    ValueError
     ├── InvalidLabelError          a label name or value breaks the rules      ValueError
     ├── LabelSelectorError         a malformed selector string (.selector)     ValueError
     ├── AppendTooLargeError        an append over the store's maximum          ValueError
     │                              (.journal, .size, .limit)
     ├── OffsetNotYetAvailableError a non-blocking read past the committed end  ValueError
     │                              (.journal, .offset, .head)
     ├── CorruptJournalError        a journal directory holds a file that does
     │                              not belong or does not match its name; or
     │                              committed bytes are missing or damaged
     │                              (.journal, .path, .offset, .end_offset)
     ├── JournalClosedError         the client was closed                       RuntimeError
     └── BrokerError                a Gazette broker refused or failed a request
          │                         (.status, .journal, .address)
          ├── BrokerUnavailableError  no broker answered in time (.address)
          └── BrokerAuthError       credentials refused, or a TLS certificate
                                    that does not verify (.address)

Errors caused by bad input also derive from ``ValueError`` so that generic
input validation code catches them too. I/O failures inside a writer are
reported through the append's future as a ``JournalError`` chained to the
original ``OSError``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence


class JournalError(Exception):
    """Base of every error raised by the ``journal`` package."""


class JournalNotFoundError(JournalError):
    """The journal does not exist (or was deleted)."""

    def __init__(self, journal: str) -> None:
        super().__init__(f"journal not found: {journal!r}")
        self.journal = journal


class JournalExistsError(JournalError):
    """``create()`` of a journal that already exists with other labels."""

    def __init__(self, journal: str, labels: Mapping[str, Sequence[str]]) -> None:
        shown = ", ".join(f"{k}={'|'.join(v)}" for k, v in labels.items())
        super().__init__(f"journal {journal!r} already exists with other labels ({shown})")
        self.journal = journal
        self.labels = labels


class InvalidJournalNameError(JournalError, ValueError):
    """A journal name breaks Gazette's naming rules."""

    def __init__(self, journal: str, reason: str) -> None:
        super().__init__(f"invalid journal name {journal!r}: {reason}")
        self.journal = journal
        self.reason = reason


class InvalidLabelError(JournalError, ValueError):
    """A label name or value breaks Gazette's label rules."""

    def __init__(self, label: str, reason: str) -> None:
        super().__init__(f"invalid label {label!r}: {reason}")
        self.label = label
        self.reason = reason


class LabelSelectorError(JournalError, ValueError):
    """A label selector string could not be parsed."""

    def __init__(self, selector: str, reason: str) -> None:
        super().__init__(f"invalid label selector {selector!r}: {reason}")
        self.selector = selector
        self.reason = reason


class AppendTooLargeError(JournalError, ValueError):
    """An append is larger than the client's ``max_append_size``."""

    def __init__(self, journal: str, size: int, limit: int) -> None:
        super().__init__(
            f"append of {size} bytes to {journal!r} exceeds the maximum append size ({limit})"
        )
        self.journal = journal
        self.size = size
        self.limit = limit


class OffsetNotYetAvailableError(JournalError, ValueError):
    """A non-blocking read asked for an offset past the journal's committed end."""

    def __init__(self, journal: str, offset: int, head: int) -> None:
        super().__init__(
            f"offset {offset} of {journal!r} is not yet available (committed end is {head})"
        )
        self.journal = journal
        self.offset = offset
        self.head = head


class CorruptJournalError(JournalError):
    """A file in a journal directory is foreign, or does not match its name,
    or committed bytes are missing or damaged.

    ``.path`` is the file at fault. When the damage is a piece of the
    journal, ``[.offset, .end_offset)`` are its offsets: reading can go on at
    ``.end_offset`` (``skip_corrupt`` of the read iterators does so);
    otherwise both are None."""

    def __init__(
        self,
        journal: str,
        path: str,
        reason: str,
        *,
        offset: int | None = None,
        end_offset: int | None = None,
    ) -> None:
        where = ""
        if offset is not None and end_offset is not None:
            where = f" (offsets [{offset}, {end_offset}))"
        super().__init__(f"journal {journal!r}: {path}: {reason}{where}")
        self.journal = journal
        self.path = path
        self.reason = reason
        self.offset = offset
        self.end_offset = end_offset


class JournalClosedError(JournalError, RuntimeError):
    """The journal client was closed."""

    def __init__(self, what: str = "journal client") -> None:
        super().__init__(f"{what} is closed")


class BrokerError(JournalError):
    """A Gazette broker refused or failed a request.

    ``status`` is Gazette's status name (``"NOT_ALLOWED"``, ...) or, for a
    failed RPC, the gRPC code name (``"UNAVAILABLE"``); ``journal`` is the
    journal concerned (None for cluster-wide requests); ``address`` is the
    broker the client last tried.
    """

    def __init__(
        self, message: str, *, status: str, journal: str | None = None, address: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.journal = journal
        self.address = address


class BrokerUnavailableError(BrokerError):
    """No Gazette broker answered within the client's time bound: the
    cluster is unreachable, down, or not a Gazette cluster."""


class BrokerAuthError(BrokerError):
    """The cluster refused this client: its authorization is missing or not
    valid (the brokers check ``--auth-keys``), or a TLS certificate did not
    verify (the broker's, against ``trusted_ca_file``; or the client's,
    against the brokers' CA). Never retried."""
