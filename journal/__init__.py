r"""At-least-once journals: append-only byte streams with byte offsets.

A journal has a name (``examples/events/part-000``), labels (its
``content-type`` chooses the framing of its messages) and content that only
grows: appends are atomic, contiguous, ordered, and durable once their future
resolves. Readers read from any offset, up to an end offset or following new
appends (``block=True``).

Three implementations of the ``JournalStore`` protocol ship here:
``LocalJournalStore`` (files on disk, shared by threads and processes; see
docs/journal-store.md), ``GazetteClient`` (journals on a Gazette broker
cluster, past one machine; see docs/gazette.md) and ``MemoryJournalClient``
(for tests).
``journal.testing`` holds the conformance checks every implementation passes.

>>> import tempfile
>>> from journal import LocalJournalStore
>>> with tempfile.TemporaryDirectory() as root, LocalJournalStore(root) as store:
...     spec = store.create("events/part-000", {"content-type": "application/x-ndjson"})
...     result = store.append("events/part-000", b'{"n": 1}\n').result()
...     with store.read("events/part-000", offset=result.begin) as reader:
...         print(result, reader.read())
AppendResult(journal='events/part-000', begin=0, end=9) b'{"n": 1}\n'
"""

import importlib as _importlib
import typing as _typing

from ._closing import CloseAtExit as CloseAtExit
from ._closing import Closing as Closing
from ._errors import AppendTooLargeError as AppendTooLargeError
from ._errors import BrokerAuthError as BrokerAuthError
from ._errors import BrokerError as BrokerError
from ._errors import BrokerUnavailableError as BrokerUnavailableError
from ._errors import CorruptJournalError as CorruptJournalError
from ._errors import InvalidJournalNameError as InvalidJournalNameError
from ._errors import InvalidLabelError as InvalidLabelError
from ._errors import JournalClosedError as JournalClosedError
from ._errors import JournalError as JournalError
from ._errors import JournalExistsError as JournalExistsError
from ._errors import JournalNotFoundError as JournalNotFoundError
from ._errors import LabelSelectorError as LabelSelectorError
from ._errors import OffsetNotYetAvailableError as OffsetNotYetAvailableError
from ._interfaces import JournalClient as JournalClient
from ._interfaces import JournalReader as JournalReader
from ._interfaces import JournalStore as JournalStore
from ._labels import LabelSelector as LabelSelector
from ._labels import LabelSet as LabelSet
from ._labels import parse_label_selector as parse_label_selector
from ._local.check import JournalProblem as JournalProblem
from ._local.reader import LocalJournalReader as LocalJournalReader
from ._local.store import DEFAULT_FRAGMENT_SIZE as DEFAULT_FRAGMENT_SIZE
from ._local.store import DEFAULT_MAX_APPEND_SIZE as DEFAULT_MAX_APPEND_SIZE
from ._local.store import LocalJournalStore as LocalJournalStore
from ._memory import MemoryJournalClient as MemoryJournalClient
from ._memory import MemoryJournalReader as MemoryJournalReader
from ._offsets import OffsetTracker as OffsetTracker
from ._offsets import read_all as read_all
from ._spec import CONTENT_TYPE_LABEL as CONTENT_TYPE_LABEL
from ._spec import AppendResult as AppendResult
from ._spec import Fragment as Fragment
from ._spec import JournalSpec as JournalSpec
from ._spec import check_content_type as check_content_type
from ._spec import validate_journal_name as validate_journal_name
from ._tracking import PendingAppends as PendingAppends
from ._tracking import Recorder as Recorder
from ._tracking import TrackingClient as TrackingClient
from ._util import parse_duration as parse_duration
from ._watched import WatchedList as WatchedList

if _typing.TYPE_CHECKING:
    from ._gazette.brokers import JournalRoute as JournalRoute
    from ._gazette.client import GazetteClient as GazetteClient
    from ._gazette.reader import GazetteReader as GazetteReader
    from ._local.transient import MAX_EMIT as MAX_EMIT
    from ._local.transient import RING_SIZE as RING_SIZE
    from ._local.transient import Transient as Transient
    from ._local.transient import TransientListener as TransientListener

# The Gazette client loads grpc (tens of milliseconds) when first named, so
# that programs on the embedded store never pay for it.
_LAZY: _typing.Final = {
    "GazetteClient": "_gazette.client",
    "GazetteReader": "_gazette.reader",
    "JournalRoute": "_gazette.brokers",
    # Transient messages load sockets and mmap: also when first named.
    "TransientListener": "_local.transient",
    "Transient": "_local.transient",
    "MAX_EMIT": "_local.transient",
    "RING_SIZE": "_local.transient",
}


if not _typing.TYPE_CHECKING:  # type checkers see the imports above, and no other name

    def __getattr__(name: str) -> _typing.Any:
        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        value = getattr(_importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*globals(), *_LAZY})

__all__ = [
    # Values
    "JournalSpec",
    "LabelSet",
    "LabelSelector",
    "parse_label_selector",
    "validate_journal_name",
    "check_content_type",
    "AppendResult",
    "Fragment",
    "Closing",
    "CloseAtExit",
    "JournalProblem",
    "CONTENT_TYPE_LABEL",
    "parse_duration",
    # Contracts
    "JournalClient",
    "JournalStore",
    "JournalReader",
    # Implementations
    "LocalJournalStore",
    "LocalJournalReader",
    "DEFAULT_FRAGMENT_SIZE",
    "DEFAULT_MAX_APPEND_SIZE",
    "MemoryJournalClient",
    "MemoryJournalReader",
    "OffsetTracker",
    "read_all",
    "PendingAppends",
    "Recorder",
    "TrackingClient",
    "WatchedList",
    # Transient messages (LocalJournalStore.emit / listen)
    "TransientListener",
    "Transient",
    "MAX_EMIT",
    "RING_SIZE",
    "GazetteClient",
    "GazetteReader",
    "JournalRoute",
    # Errors
    "JournalError",
    "JournalNotFoundError",
    "JournalExistsError",
    "InvalidJournalNameError",
    "InvalidLabelError",
    "LabelSelectorError",
    "AppendTooLargeError",
    "OffsetNotYetAvailableError",
    "CorruptJournalError",
    "JournalClosedError",
    "BrokerError",
    "BrokerUnavailableError",
    "BrokerAuthError",
]
