"""Several file operations in one call: ``run_io(ops)``.

The writer thread of a journal does about a dozen small system calls per
batch (take the lock, check it, read the commit record, write, sync, write
the record, sync). Python releases the interpreter lock around each of them,
and a thread that gave it up must win it back: while another thread keeps
the interpreter busy (a shard consuming, a loop publishing), that takes up
to the switch interval (5 ms) each time. A batch then took tens of
milliseconds, so the writer made almost no progress while the application
ran, and a transaction's commit waited for all of its writing at once.

``run_io`` runs a list of operations in order and returns their results. The
native core (journal/_native.c) runs them all with the interpreter lock
released once; ``py_run_io`` here is the definition, one ``os`` call per
operation, and is what runs where the native core is not built. What to
write where stays with the callers (journal/_local/writer.py, files.py).

Operations, each a tuple, and their results:

- ``(IO_PWRITE, fd, data, pos)``: all of ``data`` written at ``pos`` (a
  short write is continued); ``None``.
- ``(IO_FDATASYNC, fd)``: ``os.fdatasync(fd)``; ``None``.
- ``(IO_FLOCK, fd, operation)``: ``fcntl.flock(fd, operation)``; ``None``.
- ``(IO_FSTAT, fd)``: ``(st_dev, st_ino, st_size)`` of ``fd``.
- ``(IO_STAT, path)``: ``(st_dev, st_ino, st_size)`` of ``path``, or
  ``None`` if nothing is there (``FileNotFoundError``,
  ``NotADirectoryError``).
- ``(IO_PREAD, fd, size, pos)``: the bytes of one ``os.pread``.

Checks look at the results of earlier operations (by their index in
``ops``); each gives ``True``, or ``False`` and then nothing after it runs
(the list of results ends there):

- ``(IO_EXPECT_SAME, i, j)``: the stats of ``i`` and ``j`` are of one file
  (both found, the same device and inode).
- ``(IO_EXPECT_BYTES, i, expected)``: the bytes read by ``i`` are
  ``expected``.
- ``(IO_EXPECT_SIZE, i, most)``: the file of stat ``i`` is found and holds
  at most ``most`` bytes.

The first operation that fails raises its ``OSError``; those before it were
done, those after it were not.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable
from typing import Any, Final

from .._pending import NATIVE
from ..durable import write_all

IO_PWRITE: Final = 0
IO_FDATASYNC: Final = 1
IO_FLOCK: Final = 2
IO_FSTAT: Final = 3
IO_STAT: Final = 4
IO_PREAD: Final = 5
IO_EXPECT_SAME: Final = 6
IO_EXPECT_BYTES: Final = 7
IO_EXPECT_SIZE: Final = 8

#: One operation: a tuple whose first item is an ``IO_*`` code.
Op = tuple[Any, ...]
#: ``(st_dev, st_ino, st_size)``.
Stat = tuple[int, int, int]


def _stat(st: os.stat_result) -> Stat:
    return st.st_dev, st.st_ino, st.st_size


#: How many items each operation's tuple has.
_LENGTHS: Final = {IO_PWRITE: 4, IO_FDATASYNC: 2, IO_FLOCK: 3, IO_FSTAT: 2, IO_STAT: 2,
                   IO_PREAD: 4, IO_EXPECT_SAME: 3, IO_EXPECT_BYTES: 3, IO_EXPECT_SIZE: 3}
_STATS: Final = (IO_STAT, IO_FSTAT)
#: For each check: the items of its tuple that are indices of earlier
#: operations, and the codes those operations may have.
_CHECKS: Final = {IO_EXPECT_SAME: ((1, 2), _STATS), IO_EXPECT_BYTES: ((1,), (IO_PREAD,)),
                  IO_EXPECT_SIZE: ((1,), _STATS)}


def same_file_ops(path: str | bytes, fd: int, at: int) -> list[Op]:
    """Operations to place at index ``at`` of a list: they stop it unless
    ``fd`` is still the file at ``path`` (a stat of each, then
    ``IO_EXPECT_SAME``, whose result is the last of the three)."""
    return [(IO_STAT, path), (IO_FSTAT, fd), (IO_EXPECT_SAME, at, at + 1)]


def _validate(ops: list[Op], at: int) -> None:
    op = ops[at]
    if not isinstance(op, tuple) or len(op) < 2:
        raise TypeError("run_io: each operation is a tuple (code, ...)")
    code = op[0]
    if _LENGTHS.get(code) != len(op):
        raise ValueError(f"run_io: not an operation: {op!r}")
    if code in (IO_PWRITE, IO_PREAD) and op[3] < 0:
        raise ValueError("run_io: negative offset")
    if code == IO_PREAD and op[2] < 0:
        raise ValueError("run_io: negative size")
    check = _CHECKS.get(code)
    if check is not None:
        items, kinds = check
        for item in items:
            i = op[item]
            if not (isinstance(i, int) and 0 <= i < at and ops[i][0] in kinds):
                raise ValueError("run_io: a check of an operation it cannot check")


def _holds(op: Op, out: list[Any]) -> bool:
    code = op[0]
    if code == IO_EXPECT_SAME:
        a, b = out[op[1]], out[op[2]]
        return a is not None and b is not None and a[:2] == b[:2]
    if code == IO_EXPECT_BYTES:
        return bool(out[op[1]] == bytes(op[2]))
    st = out[op[1]]
    return st is not None and st[2] <= op[2]


def py_run_io(ops: list[Op]) -> list[Any]:
    """Run ``ops`` in order (see the module docstring); their results."""
    for at in range(len(ops)):  # All are checked before any is run, as natively.
        _validate(ops, at)
    out: list[Any] = []
    for op in ops:
        code = op[0]
        if code >= IO_EXPECT_SAME:
            out.append(_holds(op, out))
            if not out[-1]:
                break
        elif code == IO_PWRITE:
            write_all(op[1], op[2], op[3])
            out.append(None)
        elif code == IO_FDATASYNC:
            os.fdatasync(op[1])
            out.append(None)
        elif code == IO_FLOCK:
            fcntl.flock(op[1], op[2])
            out.append(None)
        elif code == IO_FSTAT:
            out.append(_stat(os.fstat(op[1])))
        elif code == IO_STAT:
            try:
                out.append(_stat(os.stat(op[1])))
            except (FileNotFoundError, NotADirectoryError):
                out.append(None)
        else:
            out.append(os.pread(op[1], op[2], op[3]))
    return out


#: ``py_run_io``, natively where built: one release of the interpreter lock
#: for all the operations.
run_io: Callable[[list[Op]], list[Any]] = (
    py_run_io if NATIVE is None or not hasattr(NATIVE, "run_io") else NATIVE.run_io
)
