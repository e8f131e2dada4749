"""journal.write_durably and journal.fsync_dir: the durable small-file writes
the store makes of its own files, offered to the packages above."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

from journal.durable import fsync_dir, write_durably


def test_write_durably_replaces_the_file_whole_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b" / "state.json"
    write_durably(target, b"first")
    assert target.read_bytes() == b"first"
    write_durably(str(target), memoryview(b"second, longer"))
    assert target.read_bytes() == b"second, longer"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.json"]


def test_write_durably_without_create_dirs_needs_the_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        write_durably(tmp_path / "missing" / "f", b"x", create_dirs=False)


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(
    tmp_path: Path, monkeypatch: Any
) -> None:
    target = tmp_path / "f"
    write_durably(target, b"old")

    def no_rename(src: str, dst: str) -> None:
        raise OSError(errno.EIO, "rename failed")

    monkeypatch.setattr(os, "replace", no_rename)
    with pytest.raises(OSError, match="rename failed"):
        write_durably(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_a_link_planted_beside_the_file_is_never_followed(tmp_path: Path) -> None:
    """The temporary file is created exclusively under an unpredictable name:
    links at other names beside it are left alone."""
    outside = tmp_path / "outside"
    outside.write_bytes(b"untouched")
    d = tmp_path / "d"
    d.mkdir()
    (d / "@tmp-f").symlink_to(outside)
    write_durably(d / "f", b"data")
    assert outside.read_bytes() == b"untouched"
    assert (d / "f").read_bytes() == b"data"


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP])
def test_fsync_dir_tolerates_file_systems_without_directory_fsync(
    tmp_path: Path, monkeypatch: Any, code: int
) -> None:
    def refuse(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", refuse)
    fsync_dir(tmp_path)  # quietly: nothing more can be done there


def test_fsync_dir_reports_other_failures(tmp_path: Path, monkeypatch: Any) -> None:
    def fail(fd: int) -> None:
        raise OSError(errno.EIO, "I/O error")

    monkeypatch.setattr(os, "fsync", fail)
    with pytest.raises(OSError, match="I/O error"):
        fsync_dir(tmp_path)
