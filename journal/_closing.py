"""``Closing``: ``with obj:`` closes ``obj`` on the way out."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class Closing:
    """The context-manager protocol of everything the library opens:
    ``__enter__`` returns the object, ``__exit__`` calls its ``close()``
    (which a subclass defines), whatever left the block."""

    __slots__ = ()

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
