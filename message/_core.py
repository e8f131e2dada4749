"""Which implementation runs: the native core, or the Python one.

``message/_sequencer.py`` and the loops of ``message/_reader.py`` are the
readable definition of the behaviour; ``message/_native.c`` is a native
implementation of the same (the whole Sequencer, and the read loops), built
by ``pip install`` when a C compiler is at hand. As aiokafka does with its
record classes, the public names are bound to the fastest implementation
present: ``message.Sequencer`` is ``NATIVE.Sequencer`` and
``message.Publisher`` is ``NATIVE.Publisher`` when it is built, and the read
iterators run its loops.

``EXACTLY_PURE_PYTHON=1`` (any value but empty or ``0``) picks the Python
implementation everywhere. Where the native core could not be built, the
Python implementation runs, and importing ``message`` says so with one
``RuntimeWarning``. The test suite runs against both.
"""

from __future__ import annotations

import importlib.util
import os
import uuid
import warnings
from types import ModuleType
from typing import Any

from framing import framing_by_content_type
from journal import metrics

from . import _counts
from ._envelope import Envelope, ProducerState
from ._errors import MustStartReplay, ReplayError
from ._publisher import AckIntent
from ._publisher import Publisher as PyPublisher
from ._sequencer import Sequencer as PySequencer
from ._sequencer import horizon_units, warn_old_ack, warn_unknown_flags
from ._types import DEFAULT_UUID_PATH, JsonDocument, json_uuid_int
from ._uuid import SLOTS_KNOWN, UUID_INT_OF, Clock, new_producer_id

#: The text every "not built" warning starts with (pyproject.toml's pytest
#: filters name it).
NOT_BUILT = "exactly's native core is not built"


def pure_python_requested() -> bool:
    """True if ``EXACTLY_PURE_PYTHON`` asks for the Python implementation."""
    return os.environ.get("EXACTLY_PURE_PYTHON", "") not in ("", "0")


def _native_found() -> bool:
    """Whether an extension module ``message._native`` is there to import."""
    try:
        return importlib.util.find_spec(f"{__package__}._native") is not None
    except (ImportError, ValueError):
        return False


def _load() -> ModuleType | None:
    if pure_python_requested():
        return None
    try:
        from . import _native
    except ImportError as exc:
        # A module that is not there says so plainly (Python's own message
        # for it, from a package still importing, speaks of circular imports).
        why = str(exc) if _native_found() else "there is no message/_native extension module"
        warnings.warn(
            f"{NOT_BUILT} ({why}): the Python implementation runs, several times slower."
            " Install with a C compiler and Python's headers at hand to build it"
            " (see docs/performance.md).",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    if not SLOTS_KNOWN:
        # The native Publisher makes UUIDs by their slots, as uuid_from_int
        # does where it can: not on a uuid.UUID laid out otherwise.
        warnings.warn(
            f"{NOT_BUILT} for this Python (uuid.UUID is not laid out as it expects): the"
            " Python implementation runs, several times slower.",
            RuntimeWarning,
            stacklevel=2,
        )
        return None
    native: ModuleType = _native
    native.configure(
        envelope=Envelope, producer_state=ProducerState, must_start_replay=MustStartReplay,
        replay_error=ReplayError, uuid_int_of=UUID_INT_OF, json_uuid_int=json_uuid_int,
        json_uuid_path=DEFAULT_UUID_PATH, horizon_units=horizon_units,
        warn_unknown_flags=warn_unknown_flags, warn_old_ack=warn_old_ack,
        uuid_type=uuid.UUID, safe_unknown=uuid.SafeUUID.unknown, clock_type=Clock,
        new_producer_id=new_producer_id, framing_by_content_type=framing_by_content_type,
        ack_intent=AckIntent, json_document=JsonDocument,
    )
    return native


#: The native module, or None when the Python implementation runs.
NATIVE: Any = _load()

#: "native" or "python": which implementation the public names are bound to.
IMPLEMENTATION = "python" if NATIVE is None else "native"

Sequencer: type[PySequencer] = PySequencer if NATIVE is None else NATIVE.Sequencer
Publisher: type[PyPublisher] = PyPublisher if NATIVE is None else NATIVE.Publisher


metrics.counter_source(
    lambda: _counts.totals(None if NATIVE is None else NATIVE.counts())
)
