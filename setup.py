"""The one thing pyproject.toml does not say: the native core, two optional
C extensions (message/_native.c and journal/_native.c).

Without a C compiler the install goes on, and the Python implementation
runs instead (message/_core.py says so with one warning).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("message._native", ["message/_native.c"], optional=True),
        Extension("journal._native", ["journal/_native.c"], optional=True),
    ],
)
