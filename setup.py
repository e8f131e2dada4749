"""The one thing pyproject.toml does not say: the native core, two optional
C extensions (message/_native.c, with its parts in message/_native_src/, and
journal/_native.c).

Without a C compiler the install goes on, and the Python implementation
runs instead (message/_core.py says so with one warning).
"""

from glob import glob

from setuptools import Extension, setup

# message/_native.c includes its parts (one translation unit): a change to
# any of them rebuilds it.
PARTS = sorted(glob("message/_native_src/*.inc.c"))

setup(
    ext_modules=[
        Extension("message._native", ["message/_native.c"], optional=True, depends=PARTS),
        Extension("journal._native", ["journal/_native.c"], optional=True),
    ],
)
