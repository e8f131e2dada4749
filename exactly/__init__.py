"""The ``exactly`` command line. The library itself lives in the packages
``message``, ``framing``, ``journal`` and ``pipeline``."""

from exactly._errors import ExactlyError as ExactlyError

__version__ = "0.1.0"
