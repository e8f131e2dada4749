"""run_io: the local store writer's file operations, several per call (one
release of the interpreter lock for all of them, natively)."""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from journal import LocalJournalStore
from journal._local import files, iobatch, writer
from journal._local.iobatch import (
    IO_EXPECT_BYTES,
    IO_EXPECT_SAME,
    IO_EXPECT_SIZE,
    IO_FDATASYNC,
    IO_FLOCK,
    IO_FSTAT,
    IO_PREAD,
    IO_PWRITE,
    IO_STAT,
    py_run_io,
)
from journal._pending import NATIVE

NDJSON = {"content-type": "application/x-ndjson"}
RunIO = Callable[[list[Any]], list[Any]]


@pytest.fixture(params=["native", "python"])
def run_io(request: pytest.FixtureRequest) -> RunIO:
    """Each test runs with the native run_io, then the Python definition."""
    if request.param == "python":
        return py_run_io
    if NATIVE is None:
        pytest.skip("the native core is not in use here")
    native: RunIO = NATIVE.run_io
    return native


def _stat(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_dev, st.st_ino, st.st_size


def test_each_operation_and_its_result(run_io: RunIO, tmp_path: Path) -> None:
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        got = run_io([
            (IO_PWRITE, fd, b"hello world", 0),
            (IO_PWRITE, fd, memoryview(b"HELLO"), 0),  # any buffer
            (IO_FDATASYNC, fd),
            (IO_FLOCK, fd, fcntl.LOCK_EX),
            (IO_FSTAT, fd),
            (IO_STAT, str(path)),
            (IO_STAT, str(tmp_path / "absent")),
            (IO_STAT, str(path / "under-a-file")),  # not a directory: nothing there
            (IO_PREAD, fd, 5, 6),
            (IO_PREAD, fd, 100, 6),  # short: as much as there is
            (IO_PREAD, fd, 4, 100),  # past the end: nothing
            (IO_FLOCK, fd, fcntl.LOCK_UN),
        ])
        st = _stat(os.fstat(fd))
    finally:
        os.close(fd)
    assert got == [None, None, None, None, st, st, None, None, b"world", b"world", b"", None]
    assert st[2] == 11 and path.read_bytes() == b"HELLO world"


def test_stops_at_the_first_failure(run_io: RunIO, tmp_path: Path) -> None:
    """Operations before the one that fails are done, those after it are not;
    its OSError is raised as the os call's would be."""
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    bad = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(OSError) as err:
            run_io([(IO_PWRITE, fd, b"first", 0), (IO_PWRITE, bad, b"x", 0),
                    (IO_PWRITE, fd, b"third", 5)])
        assert err.value.errno == errno.EBADF  # not open for writing
        assert path.read_bytes() == b"first"
        with pytest.raises(OSError) as err:
            run_io([(IO_STAT, str(tmp_path / ("x" * 300)))])
        assert err.value.errno == errno.ENAMETOOLONG
    finally:
        os.close(fd)
        os.close(bad)


def test_refuses_what_is_not_an_operation(run_io: RunIO) -> None:
    for ops in ([(99, 1)], [(IO_PWRITE, 1, b"x")], [(IO_PREAD, 1, -1, 0)],
                [(IO_PWRITE, 1, b"", -1)], ["not a tuple"]):
        with pytest.raises((ValueError, TypeError)):
            run_io(ops)
    assert run_io([]) == []


def test_its_lock_excludes_another_process(run_io: RunIO, tmp_path: Path) -> None:
    path = tmp_path / "lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    probe = ("import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)\nexcept OSError:\n"
             "    sys.exit(1)\n")

    def other_can_lock() -> bool:
        return subprocess.run([sys.executable, "-c", probe, str(path)], timeout=60).returncode == 0

    try:
        run_io([(IO_FLOCK, fd, fcntl.LOCK_EX)])
        assert not other_can_lock()
        run_io([(IO_FLOCK, fd, fcntl.LOCK_UN)])
        assert other_can_lock()
    finally:
        os.close(fd)


def test_a_batch_in_steady_state_is_one_call(
    run_io: RunIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once its files are open, the writer makes each batch with one run_io
    call (lock; check the lock file, the record and the open fragment;
    write, sync, checksum, record, sync, unlock) and no file call of its
    own: each call that releases the interpreter lock may wait that long to
    get it back while another thread keeps the interpreter busy."""
    calls: list[list[Any]] = []

    def counting(ops: list[Any]) -> list[Any]:
        calls.append([op[0] for op in ops])
        return run_io(ops)

    class Forbid:
        """The writer's view of a module, without the calls named."""

        def __init__(self, module: Any, *names: str) -> None:
            self.module, self.names = module, names

        def __getattr__(self, name: str) -> Any:
            if name in self.names:
                raise AssertionError(f"{name}: a file call outside run_io")
            return getattr(self.module, name)

    monkeypatch.setattr(writer, "run_io", counting)
    monkeypatch.setattr(files, "run_io", counting)
    with LocalJournalStore(tmp_path / "root") as store:
        store.create("a", NDJSON)
        store.append("a", b"first\n").result()  # opens the files
        calls.clear()
        with monkeypatch.context() as m:
            m.setattr(writer, "fcntl", Forbid(fcntl, "flock"))
            m.setattr(writer, "os", Forbid(os, "fdatasync", "pwrite", "pread", "fstat", "stat"))
            for i in range(3):
                store.append("a", b"%d\n" % i).result()
        with store.read("a") as r:
            assert r.read() == b"first\n0\n1\n2\n"
    batch = [IO_FLOCK, IO_STAT, IO_FSTAT, IO_EXPECT_SAME, IO_PREAD, IO_EXPECT_BYTES, IO_FSTAT,
             IO_EXPECT_SIZE, IO_PWRITE, IO_FDATASYNC, IO_PWRITE, IO_PWRITE, IO_FDATASYNC, IO_FLOCK]
    assert calls == [batch] * 3


def test_the_native_core_says_what_it_runs() -> None:
    if NATIVE is None:
        pytest.skip("the native core is not in use here")
    assert iobatch.run_io is NATIVE.run_io


def test_a_batch_after_another_writer_goes_the_general_way(
    run_io: RunIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another writer's commit, or a dead writer's bytes past the committed
    end, fail a check of the one-call batch: nothing of it is written, and
    the batch goes the general way, which sees them (and cuts the garbage)."""
    stopped: list[int] = []

    def counting(ops: list[Any]) -> list[Any]:
        got = run_io(ops)
        if len(got) < len(ops):
            stopped.append(ops[len(got) - 1][0])  # the check that did not hold
        return got

    monkeypatch.setattr(writer, "run_io", counting)
    root = tmp_path / "root"
    with LocalJournalStore(root) as a, LocalJournalStore(root) as b:
        a.create("j", NDJSON)
        a.append("j", b"a1\n").result()
        a.append("j", b"a2\n").result()  # one call
        assert stopped == []
        b.append("j", b"b1\n").result()  # b's first batch: the general way
        assert a.append("j", b"a3\n").result().begin == 9
        assert stopped == [IO_EXPECT_BYTES]  # a saw b's record
        # A writer that died after writing its bytes, before its record.
        (opened,) = [p for p in (root / "j").iterdir() if p.name.startswith("@open-")]
        with open(opened, "ab") as f:
            f.write(b"garbage\n")
        assert a.append("j", b"a4\n").result().begin == 12
        assert stopped == [IO_EXPECT_BYTES, IO_EXPECT_SIZE]
        with a.read("j") as r:
            assert r.read() == b"a1\na2\nb1\na3\na4\n"


def test_overwrite_synced_writes_only_into_the_file_at_its_path(
    run_io: RunIO, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """journal.durable.overwrite_synced: one run_io call that writes at the
    start of the file and syncs it, only while the open file is still the
    one at the path; where it was removed or replaced, nothing is written."""
    from journal import durable

    calls: list[list[Any]] = []

    def counting(ops: list[Any]) -> list[Any]:
        calls.append([op[0] for op in ops])
        return run_io(ops)

    monkeypatch.setattr(iobatch, "run_io", counting)
    path = tmp_path / "log"
    path.write_bytes(b"0123456789")
    fd = os.open(path, os.O_WRONLY)
    try:
        assert durable.overwrite_synced(fd, path, b"abc")
        assert path.read_bytes() == b"abc3456789"  # in place: it does not shrink
        assert calls == [[IO_STAT, IO_FSTAT, IO_EXPECT_SAME, IO_PWRITE, IO_FDATASYNC]]
        path.rename(tmp_path / "old")
        assert not durable.overwrite_synced(fd, path, b"xyz")
        path.write_bytes(b"new")
        assert not durable.overwrite_synced(fd, path, b"xyz")
        assert path.read_bytes() == b"new" and (tmp_path / "old").read_bytes() == b"abc3456789"
    finally:
        os.close(fd)
