"""The ``exactly`` command line. The library itself lives in the packages
``message``, ``framing``, ``journal`` and ``pipeline``."""

__version__ = "0.1.0"
