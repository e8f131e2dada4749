"""The one thing pyproject.toml does not say: the optional C extension.

message/_speedups.c runs the read iterators' per-message loops. It is
optional: without a C compiler the install goes on, and the same code runs
in Python (see message/_reader.py).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("message._speedups", ["message/_speedups.c"], optional=True),
    ],
)
