"""``WatchedList``: the journals of a selector, kept current as they come and go.

Topics grow partitions, and a long-running publisher or reader should see
them without a restart. A ``WatchedList`` holds the current listing of a
selector and refreshes it in the background: on a Gazette cluster through a
List RPC that *watches* (the broker sends a new snapshot at every change, as
Gazette's ``client.WatchedList`` uses it); on any other client by listing
again every ``interval`` seconds.

Calling it returns the current specs, the *same list object* for as long
as the listing does not change — what a mapping's ``partitions`` function
must be for its cached hashes to be reused::

    parts = WatchedList(client, "prefix=clicks/")
    mapping = modulo_mapping(lambda doc: doc["session"], parts)   # new partitions too
"""

from __future__ import annotations

import builtins
import logging
import threading
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Final

from ._closing import Closing
from ._errors import JournalError

if TYPE_CHECKING:
    from ._interfaces import JournalClient
    from ._labels import LabelSelector
    from ._spec import JournalSpec

LOG: Final = logging.getLogger("journal")

#: A client that can watch a listing: ``watch_list(selector, stopped)``
#: yields each new snapshot until ``stopped()`` is true (GazetteClient).
Watcher = Callable[
    ["str | LabelSelector", Callable[[], bool]], Iterator[builtins.list["JournalSpec"]]
]


class WatchedList(Closing):
    """The journals matching ``selector``, refreshed in the background (see
    the module docstring). The first listing is made at once (its errors are
    raised here); later failures are logged and retried. A context manager;
    ``close()`` stops the refreshing."""

    def __init__(
        self, client: JournalClient, selector: str | LabelSelector = "", *,
        interval: float = 1.0,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive ({interval})")
        self.selector = selector
        self._client = client
        self._interval = interval
        self._cond = threading.Condition()
        self._specs: builtins.list[JournalSpec] = client.list(selector)
        self._version = 0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="exactly watched list",
                                        daemon=True)
        self._thread.start()

    def __call__(self) -> builtins.list[JournalSpec]:
        """The current specs (the same object until the listing changes)."""
        return self._specs

    @property
    def version(self) -> int:
        """How many times the listing changed since it was made."""
        return self._version

    def wait_for_change(self, version: int, timeout: float | None = None) -> bool:
        """Wait until the listing is past ``version`` (or ``timeout``); True if it is."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._version > version or self._closed, timeout
            ) and self._version > version

    def _update(self, specs: builtins.list[JournalSpec]) -> None:
        if specs == self._specs:
            return
        with self._cond:
            self._specs = specs
            self._version += 1
            self._cond.notify_all()

    def _run(self) -> None:
        watch: Watcher | None = getattr(self._client, "watch_list", None)
        stopped = lambda: self._closed  # noqa: E731
        while not self._closed:
            try:
                if watch is not None:
                    for specs in watch(self.selector, stopped):
                        self._update(specs)
                else:
                    self._update(self._client.list(self.selector))
            except JournalError as exc:
                if self._closed:
                    return
                LOG.warning("watched listing of %r failed (retrying): %s", self.selector, exc)
            with self._cond:
                if not self._closed:
                    self._cond.wait(self._interval)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)

