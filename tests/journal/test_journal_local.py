"""LocalJournalStore: on-disk layout, fragments, recovery, corruption, locking, following."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import itertools
import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from journal import (
    AppendResult,
    CorruptJournalError,
    InvalidJournalNameError,
    JournalError,
    JournalNotFoundError,
    LocalJournalStore,
)
from journal import _pending as journal_pending
from journal._local import files, iobatch, writer
from journal._local.files import JournalDir, open_commit, read_record
from journal._local.fragment import open_name
from journal._spec import sealed_name

NDJSON = {"content-type": "application/x-ndjson"}
REPO = str(Path(__file__).resolve().parents[2])


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalJournalStore]:
    with LocalJournalStore(tmp_path / "root", fragment_size=100) as s:
        yield s


def _lines(n: int, start: int = 0) -> list[bytes]:
    return [
        json.dumps({"n": i, "pad": "x" * (i % 7)}).encode() + b"\n" for i in range(start, start + n)
    ]


def _append_all(store: LocalJournalStore, name: str, parts: list[bytes]) -> None:
    futs = [store.append(name, p) for p in parts]
    for f in futs:
        f.result(timeout=30)


def _read(store: LocalJournalStore, name: str, offset: int = 0) -> bytes:
    with store.read(name, offset) as r:
        return r.read()


def _record(root: Path, name: str) -> tuple[int, int, int]:
    jd = JournalDir.of(str(root), name)
    fd = open_commit(jd)
    try:
        return tuple(read_record(jd, fd))  # type: ignore[return-value]
    finally:
        os.close(fd)


# Layout ------------------------------------------------------------------------


def test_journal_directory_layout(store: LocalJournalStore) -> None:
    """A journal is a nested directory: @spec.json, @commit, @lock and Gazette-named fragments."""
    store.create("topic/part-0", NDJSON)
    parts = _lines(12)
    _append_all(store, "topic/part-0", parts)
    jdir = Path(store.root) / "topic" / "part-0"
    spec = json.loads((jdir / "@spec.json").read_text())
    assert spec["name"] == "topic/part-0"
    assert spec["labels"] == {"content-type": ["application/x-ndjson"]}
    names = sorted(p.name for p in jdir.iterdir())
    assert {"@spec.json", "@commit", "@lock"} <= set(names)
    sealed = [n for n in names if n.endswith(".raw")]
    assert sealed, "fragment_size=100 must have sealed fragments"
    for name in sealed:
        begin, end, sha = name[: -len(".raw")].split("-")
        body = (jdir / name).read_bytes()
        assert len(begin) == len(end) == 16 and len(sha) == 40
        assert len(body) == int(end, 16) - int(begin, 16)
        assert hashlib.sha1(body).hexdigest() == sha
        assert name == sealed_name(int(begin, 16), int(end, 16), bytes.fromhex(sha))


def test_sealed_ndjson_fragment_is_a_plain_ndjson_file(store: LocalJournalStore) -> None:
    """Fragments end on append boundaries, so each sealed NDJSON fragment parses line by line."""
    store.create("nd", NDJSON)
    parts = _lines(40)
    _append_all(store, "nd", parts)
    frags = store.fragments("nd")
    assert [f.sealed for f in frags] == [True] * (len(frags) - 1) + [frags[-1].sealed]
    seen = []
    for f in frags:
        with open(f.path, "rb") as fh:
            body = fh.read(f.size)
        assert body.endswith(b"\n")
        seen += [json.loads(line) for line in body.splitlines()]
    assert seen == [json.loads(p) for p in parts]


def test_fragments_tile_the_journal_and_roll_at_fragment_size(store: LocalJournalStore) -> None:
    """fragments() are contiguous; each sealed one reached fragment_size with its last append."""
    store.create("roll", NDJSON)
    parts = [b"a" * 30 + b"\n"] * 10 + [b"b" * 250 + b"\n"]
    _append_all(store, "roll", parts)
    frags = store.fragments("roll")
    assert frags[0].begin == 0 and frags[-1].end == store.head("roll") == sum(map(len, parts))
    assert all(a.end == b.begin for a, b in itertools.pairwise(frags))
    for f in frags:
        if f.sealed:
            assert f.size >= 100
            assert f.size - 100 < 251  # Overshoot by less than one append.
            assert f.content_name == os.path.basename(f.path)
            assert f.mtime <= time.time()
    boundaries = {0} | {sum(map(len, parts[: i + 1])) for i in range(len(parts))}
    assert all(f.end in boundaries for f in frags)


def test_open_fragment_listed_with_committed_end(store: LocalJournalStore) -> None:
    """The open fragment is listed last with its committed end; bytes after it are not committed."""
    store.create("open", NDJSON)
    store.append("open", b"0123456789\n").result()
    (frag,) = store.fragments("open")
    assert (frag.begin, frag.end, frag.sealed, frag.content_name) == (0, 11, False, None)
    assert os.path.basename(frag.path) == open_name(0)
    # Garbage past the committed end, as a writer killed mid-write leaves it.
    with open(frag.path, "ab") as fh:
        fh.write(b"GARBAGE")
    assert store.fragments("open")[0].end == 11
    assert _read(store, "open") == b"0123456789\n"
    # The next append is written over the garbage, at the committed end.
    assert store.append("open", b"next\n").result().begin == 11
    assert _read(store, "open") == b"0123456789\nnext\n"
    assert os.path.getsize(frag.path) == 16


def test_nested_journals_share_directories(store: LocalJournalStore) -> None:
    """Journals a/b and a/b/c coexist; deleting one keeps the other and prunes empty dirs."""
    store.create("a/b", NDJSON)
    store.create("a/b/c", NDJSON)
    _append_all(store, "a/b", _lines(10))
    _append_all(store, "a/b/c", [b"child\n"])
    assert [s.name for s in store.list()] == ["a/b", "a/b/c"]
    assert [s.name for s in store.list("prefix=a/b/")] == ["a/b/c"]
    store.delete("a/b")
    assert [s.name for s in store.list()] == ["a/b/c"]
    assert _read(store, "a/b/c") == b"child\n"
    store.delete("a/b/c")
    assert not (Path(store.root) / "a").exists()


def test_reserved_and_overlong_components(store: LocalJournalStore) -> None:
    """Components shaped like fragment names, or too long for a directory, are refused."""
    frag_like = f"{0:016x}-{16:016x}-{'0' * 40}.raw"
    for bad in (f"j/{frag_like}", "j/" + "x" * 256):
        with pytest.raises(InvalidJournalNameError):
            store.create(bad, NDJSON)
    assert store.list() == []


def test_content_survives_reopening(tmp_path: Path) -> None:
    """A new store on the same root sees the same journals, content and head."""
    root = tmp_path / "root"
    with LocalJournalStore(root, fragment_size=64) as s:
        s.create("keep", NDJSON)
        _append_all(s, "keep", _lines(20))
        want = _read(s, "keep")
    with LocalJournalStore(root, fragment_size=64) as s:
        assert s.get("keep").content_type == "application/x-ndjson"
        assert _read(s, "keep") == want
        assert s.append("keep", b"more\n").result().begin == len(want)


# Recovery ------------------------------------------------------------------------------


def test_crash_between_seal_rename_and_record_update(tmp_path: Path) -> None:
    """A fragment sealed but not yet recorded reads fine, and recovery records it."""
    root = tmp_path / "root"
    with LocalJournalStore(root, fragment_size=1000) as s:
        s.create("seal", NDJSON)
        s.append("seal", b"x" * 50 + b"\n").result()
    jdir = root / "seal"
    body = (jdir / open_name(0)).read_bytes()
    os.rename(jdir / open_name(0), jdir / sealed_name(0, 51, hashlib.sha1(body).digest()))
    with LocalJournalStore(root, fragment_size=1000) as s:
        assert _read(s, "seal") == body
        assert [(f.begin, f.end, f.sealed) for f in s.fragments("seal")] == [(0, 51, True)]
        assert s.append("seal", b"y\n").result().begin == 51
        assert _read(s, "seal") == body + b"y\n"
    assert _record(root, "seal")[1:] == (51, 53)


def test_dead_writers_new_open_fragment_is_cut_before_reuse(tmp_path: Path) -> None:
    """Garbage left in a new open fragment by a writer that died never ends up in a sealed one."""
    root = tmp_path / "root"
    with LocalJournalStore(root, fragment_size=10) as s:
        s.create("reuse", NDJSON)
        s.append("reuse", b"012345678\n").result()  # Fills and seals [0, 10).
        # Another writer created the next open fragment, wrote, and died.
        (root / "reuse" / open_name(10)).write_bytes(b"G" * 50)
        # One batch creates the open fragment, fills it, and seals [10, 22).
        s.append("reuse", b"abcdefghijk\n").result()
        assert [(f.begin, f.end, f.sealed) for f in s.verify("reuse")] == [
            (0, 10, True),
            (10, 22, True),
        ]
        assert _read(s, "reuse") == b"012345678\nabcdefghijk\n"


def test_half_deleted_journal_is_recreated_empty(tmp_path: Path) -> None:
    """Leftovers of a deletion interrupted after its first step (the spec
    renamed to the @deleting mark) do not leak into a new one; a deletion
    that finishes leaves nothing."""
    root = tmp_path / "root"
    with LocalJournalStore(root, fragment_size=20) as s:
        s.create("gone", NDJSON)
        _append_all(s, "gone", _lines(10))
    (root / "gone" / "@spec.json").rename(root / "gone" / "@deleting")
    with LocalJournalStore(root) as s:
        with pytest.raises(JournalNotFoundError):
            s.get("gone")
        assert s.orphaned() == []  # a deletion under way, not a lost spec
        s.create("gone", NDJSON)
        assert s.head("gone") == 0 and s.fragments("gone") == []
        assert not (root / "gone" / "@deleting").exists()
        _append_all(s, "gone", _lines(3))
        s.delete("gone")
    assert not (root / "gone").exists()


def test_a_journal_whose_spec_was_lost_is_never_wiped(tmp_path: Path) -> None:
    """Files of a journal found without its spec (lost, removed by hand)
    are no deletion's leftovers: listed by orphaned() (fsck reports them),
    and create makes the journal again over them, every byte readable;
    without its commit record, create refuses and changes nothing."""
    root = tmp_path / "root"
    with LocalJournalStore(root, fragment_size=20) as s:
        s.create("kept", NDJSON)
        _append_all(s, "kept", _lines(10))
        content = _read(s, "kept")
        s.create("nocommit", NDJSON)
        _append_all(s, "nocommit", _lines(3))
    (root / "kept" / "@spec.json").unlink()
    (root / "nocommit" / "@spec.json").unlink()
    (root / "nocommit" / "@commit").unlink()
    files = sorted(p.name for p in (root / "nocommit").iterdir())
    with LocalJournalStore(root) as s:
        assert [j.name for j in s.list()] == []
        assert s.orphaned() == ["kept", "nocommit"]
        assert s.create("kept", NDJSON).name == "kept"
        assert _read(s, "kept") == content and s.head("kept") == len(content)
        with pytest.raises(JournalError, match="neither its spec nor its commit record"):
            s.create("nocommit", NDJSON)
        assert sorted(p.name for p in (root / "nocommit").iterdir()) == files
        assert s.orphaned() == ["nocommit"]


# Corruption ------------------------------------------------------------------------------


def _sealed_store(root: Path) -> Path:
    with LocalJournalStore(root, fragment_size=50) as s:
        s.create("bad/j", NDJSON)
        _append_all(s, "bad/j", _lines(10))
    return root / "bad" / "j"


def test_fragment_with_wrong_size_is_reported(tmp_path: Path) -> None:
    """A sealed fragment whose size disagrees with its name: listing and opening
    the journal still work; reading up to it gives what is before it, then a
    CorruptJournalError naming the fragment and its offsets; verify() names it."""
    jdir = _sealed_store(tmp_path / "root")
    victim = sorted(jdir.glob("*.raw"))[1]
    begin, end = (int(x, 16) for x in victim.name.split("-")[:2])
    with open(victim, "ab") as fh:
        fh.write(b"!")
    with LocalJournalStore(tmp_path / "root") as s:
        assert [f.begin for f in s.fragments("bad/j")][1] == begin
        with s.read("bad/j") as r:
            assert r.read(begin + 1000) == b"".join(_lines(10))[:begin]
            with pytest.raises(CorruptJournalError) as info:
                r.read(1000)
        with pytest.raises(CorruptJournalError) as info2:
            s.verify("bad/j")
        for err in (info.value, info2.value):
            assert err.journal == "bad/j"
            assert err.path == str(victim)
            assert (err.offset, err.end_offset) == (begin, end)
            assert "bad/j" in str(err) and victim.name in str(err)


def test_fragment_with_wrong_sha1_is_reported(tmp_path: Path) -> None:
    """A sealed fragment whose content does not match its SHA-1 fails reads and verify()."""
    jdir = _sealed_store(tmp_path / "root")
    victim = sorted(jdir.glob("*.raw"))[1]
    body = bytearray(victim.read_bytes())
    body[0] ^= 0x01
    victim.write_bytes(bytes(body))
    with LocalJournalStore(tmp_path / "root") as s:
        with pytest.raises(CorruptJournalError, match="SHA-1") as info:
            s.verify("bad/j")
        assert info.value.path == str(victim)
        with s.read("bad/j") as r, pytest.raises(CorruptJournalError, match=victim.name):
            while r.read(1000):
                pass


def test_foreign_file_is_reported_and_left_alone(tmp_path: Path) -> None:
    """A foreign file fails reads, listings and appends with a clear error, changing nothing."""
    jdir = _sealed_store(tmp_path / "root")
    before = sorted(p.name for p in jdir.iterdir())
    (jdir / "notes.txt").write_text("hello")
    with LocalJournalStore(tmp_path / "root") as s:
        head = s.head("bad/j")
        with pytest.raises(CorruptJournalError, match="unrecognised file"):
            s.read("bad/j")
        with pytest.raises(CorruptJournalError, match=r"notes\.txt"):
            s.fragments("bad/j")
        with pytest.raises(CorruptJournalError, match="bad/j"):
            s.append("bad/j", b"x\n").result(timeout=10)
        assert s.head("bad/j") == head
        with pytest.raises(JournalError):
            s.flush()
    assert sorted(p.name for p in jdir.iterdir()) == sorted([*before, "notes.txt"])


def test_missing_middle_fragment_is_reported_not_skipped(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A fragment file missing between kept ones is damage, not retention: reading
    into the gap raises CorruptJournalError instead of skipping it with a warning."""
    jdir = _sealed_store(tmp_path / "root")
    frags = sorted(jdir.glob("*.raw"))
    assert len(frags) >= 3
    frags[1].unlink()
    with LocalJournalStore(tmp_path / "root") as s:
        first_end = s.fragments("bad/j")[0].end
        with (
            caplog.at_level(logging.WARNING, logger="journal"),
            s.read("bad/j") as r,
            pytest.raises(CorruptJournalError, match="fragment file is missing") as info,
        ):
            assert len(r.read(first_end + 1000)) == first_end
            r.read(1000)
        assert info.value.journal == "bad/j"
        assert not any("no longer available" in m for m in caplog.messages)
        # Retention proper jumps over what it removed, and the gap above it
        # is still a loss.
        kept = s.trim("bad/j", before_offset=first_end)  # the first kept fragment's begin
        assert kept > first_end
        with s.read("bad/j") as r, pytest.raises(CorruptJournalError) as info:
            r.read(1000)
        assert info.value.offset == first_end and "recorded start" in str(info.value)
        assert any("no longer available" in m for m in caplog.messages)


def test_a_first_fragment_deleted_by_hand_is_a_loss_not_retention(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The journal records how far retention went (``@start``): the oldest
    fragment removed by hand is reported as lost by readers, verify() and
    fsck alike, while trim()'s removals are skipped with a warning; once
    repaired (the loss recorded), readers skip it with a warning too."""
    jdir = _sealed_store(tmp_path / "root")
    frags = sorted(jdir.glob("*.raw"))
    with LocalJournalStore(tmp_path / "root") as s:
        bounds = [(f.begin, f.end) for f in s.fragments("bad/j")]
        frags[0].unlink()
        with s.read("bad/j") as r, pytest.raises(CorruptJournalError) as info:
            r.read(1000)
        assert (info.value.offset, info.value.end_offset) == bounds[0]
        with pytest.raises(CorruptJournalError, match="recorded start"):
            s.verify("bad/j")
        (problem,) = s.check("bad/j")
        assert (problem.offset, problem.end_offset) == bounds[0]
        assert "not removed by retention" in problem.reason
        s.check("bad/j", repair=True)
        assert s.check("bad/j") == [] and s.verify("bad/j")
        with caplog.at_level(logging.WARNING, logger="journal"), s.read("bad/j") as r:
            assert r.read(10) and r.offset > bounds[0][1]
        # trim() records before it removes: what it removed is retention.
        assert s.trim("bad/j", before_offset=bounds[1][1]) == bounds[2][0]
        assert s.check("bad/j") == [] and s.verify("bad/j")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="journal"), s.read("bad/j") as r:
            assert r.read(10) and r.offset > bounds[1][1]
        assert any("removed by retention" in m for m in caplog.messages)


def test_store_opened_above_its_root_says_where_the_root_is(tmp_path: Path) -> None:
    """Opening a store at a parent of its root names the likely root."""
    with LocalJournalStore(tmp_path / "outer" / "journals") as s:
        s.create("a/b", NDJSON)
    with (
        LocalJournalStore(tmp_path / "outer") as s,
        pytest.raises(CorruptJournalError, match="spec names another journal") as info,
    ):
        s.list()
    assert f"is the store's root {tmp_path / 'outer' / 'journals'}?" in str(info.value)


# Writers ---------------------------------------------------------------------------------


def test_group_commit_batches_many_appends_per_sync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Thousands of appends in flight are written with far fewer fdatasync calls than appends."""
    syncs = 0
    real = os.fdatasync

    def counting(fd: int) -> None:
        nonlocal syncs
        syncs += 1
        real(fd)

    def counting_io(ops: list[Any]) -> list[Any]:
        nonlocal syncs
        syncs += sum(op[0] == iobatch.IO_FDATASYNC for op in ops)
        return real_io(ops)

    real_io = iobatch.run_io
    monkeypatch.setattr(os, "fdatasync", counting)
    monkeypatch.setattr(writer, "run_io", counting_io)
    monkeypatch.setattr(files, "run_io", counting_io)
    with LocalJournalStore(tmp_path / "root") as s:
        s.create("gc", NDJSON)
        futs = [s.append("gc", b"%099d" % i) for i in range(3000)]
        s.flush(timeout=60)
        assert all(f.result().end - f.result().begin == 99 for f in futs)
    # Two syncs (data, record) per batch: 3000 appends one by one would need 6000.
    assert 2 <= syncs < 600, syncs


def test_flush_times_out_while_another_holder_has_the_lock(store: LocalJournalStore) -> None:
    """Writers wait for the journal's flock, held here as another process would; flush times out."""
    store.create("locked", NDJSON)
    store.append("locked", b"before\n").result()
    fd = os.open(os.path.join(store.root, "locked", "@lock"), os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        fut = store.append("locked", b"during\n")
        with pytest.raises(TimeoutError):
            store.flush(timeout=0.2)
        assert not fut.done()
        assert store.head("locked") == 7
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    store.flush(timeout=10)
    assert fut.result() == ("locked", 7, 14)


def test_append_to_journal_deleted_elsewhere_fails_its_future(tmp_path: Path) -> None:
    """A journal deleted through another store fails later appends via their futures and flush()."""
    root = tmp_path / "root"
    with LocalJournalStore(root) as a, LocalJournalStore(root) as b:
        a.create("vanish", NDJSON)
        a.append("vanish", b"x\n").result()
        b.delete("vanish")
        fut = a.append("vanish", b"y\n")
        with pytest.raises(JournalNotFoundError):
            fut.result(timeout=10)
        with pytest.raises(JournalError, match="1 append"):
            a.flush()
        a.flush()  # Failures are reported once.


def test_cancelled_append_is_not_written(store: LocalJournalStore) -> None:
    """An append cancelled before its batch starts is skipped; later appends still land in order."""
    store.create("cancel", NDJSON)
    fd = os.open(os.path.join(store.root, "cancel", "@lock"), os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    try:
        first = store.append("cancel", b"1\n")
        time.sleep(0.05)  # The writer thread now waits for the lock with `first`.
        second = store.append("cancel", b"2\n")
        assert second.cancel()
        third = store.append("cancel", b"3\n")
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)
    assert first.result(timeout=10).begin == 0
    assert third.result(timeout=10).begin == 2
    assert _read(store, "cancel") == b"1\n3\n"


def test_batch_failing_half_way_among_cancelled_appends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch cut over several fragments, with cancelled appends, whose third
    commit fails: appends before it land, every one after it fails, flush()
    counts the failures once, and the journal goes on after them."""
    import journal._local.writer as writer_module

    commit = writer_module.JournalWriter._commit
    calls = itertools.count(1)

    def failing_third(self: writer_module.JournalWriter, chunk: list[bytes], **kw: Any) -> object:
        if next(calls) == 3:
            raise OSError(28, "No space left on device")
        return commit(self, chunk, **kw)

    monkeypatch.setattr(writer_module.JournalWriter, "_commit", failing_third)
    with LocalJournalStore(tmp_path / "root", fragment_size=10) as s:
        s.create("j", NDJSON)
        fd = os.open(os.path.join(s.root, "j", "@lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            first = s.append("j", b"0\n")
            time.sleep(0.05)  # The writer thread now waits for the lock with `first`.
            futs = [s.append("j", b"%d\n" % (1111 * i)) for i in range(1, 9)]
            assert futs[1].cancel() and futs[6].cancel()
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        with pytest.raises(JournalError, match="4 append"):
            s.flush()
        s.flush()  # Failures are reported once.
        assert first.result() == ("j", 0, 2)
        assert futs[0].result() == ("j", 2, 7) and futs[2].result() == ("j", 7, 12)
        assert futs[1].cancelled() and futs[6].cancelled()
        for f in futs[3:6] + futs[7:]:
            assert isinstance(f.exception(), JournalError)
        assert s.append("j", b"9\n").result(timeout=10) == ("j", 12, 14)
        assert _read(s, "j") == b"0\n1111\n3333\n9\n"


def test_backlog_is_written_in_batches_of_max_batch_bytes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Queued appends go out in batches of at most MAX_BATCH_BYTES (one
    larger append alone), in order, each future with its own offsets."""
    import journal._append_queue as queue_module
    import journal._local.writer as writer_module

    monkeypatch.setattr(queue_module, "MAX_BATCH_BYTES", 10)
    batches: list[int] = []
    write_batch = writer_module.JournalWriter._write_batch

    def counting(self: writer_module.JournalWriter, data: list[bytes]) -> object:
        batches.append(sum(map(len, data)))
        return write_batch(self, data)

    monkeypatch.setattr(writer_module.JournalWriter, "_write_batch", counting)
    frames = [b"%d\n" % (10**i) for i in range(12)]  # 2 to 13 bytes
    with LocalJournalStore(tmp_path / "root") as s:
        s.create("j", NDJSON)
        fd = os.open(os.path.join(s.root, "j", "@lock"), os.O_RDWR)
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            first = s.append("j", b"x\n")
            time.sleep(0.05)  # The writer thread now waits for the lock with `first`.
            futs = [s.append("j", f) for f in frames]
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
        s.flush()
        assert first.result() == ("j", 0, 2)
        pos = 2
        for f, frame in zip(futs, frames, strict=True):
            assert f.result() == ("j", pos, pos + len(frame))
            pos += len(frame)
        assert _read(s, "j") == b"x\n" + b"".join(frames)
    assert batches == [2, 2 + 3 + 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]


def test_append_copies_mutable_buffers(store: LocalJournalStore) -> None:
    """A bytearray changed after append() does not change what is written."""
    store.create("copy", NDJSON)
    buf = bytearray(b"original\n")
    fut = store.append("copy", buf)
    buf[:] = b"CHANGED!\n"
    fut.result()
    assert _read(store, "copy") == b"original\n"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_forked_child_can_use_the_parents_store(store: LocalJournalStore) -> None:
    """After fork, the child appends through the inherited store without the parent's threads."""
    store.create("fork", NDJSON)
    store.append("fork", b"parent\n").result()
    with warnings.catch_warnings():
        # Python >= 3.12 warns about forking a process that has threads.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        with contextlib.suppress(BaseException):
            store.append("fork", b"child\n").result(timeout=10)
            store.close()
            code = 0
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.append("fork", b"parent again\n").result().begin == 13
    assert _read(store, "fork") == b"parent\nchild\nparent again\n"


# Readers ---------------------------------------------------------------------------------


def test_reader_seek_and_tell(store: LocalJournalStore) -> None:
    """seek() moves to journal offsets (SEEK_END is the committed end); tell() reports them."""
    store.create("seek", NDJSON)
    data = b"".join(_lines(30))
    _append_all(store, "seek", [data[i : i + 40] for i in range(0, len(data), 40)])
    with store.read("seek") as r:
        assert r.seek(123) == 123 and r.tell() == 123
        assert r.read(5) == data[123:128]
        assert r.seek(-10, io.SEEK_END) == len(data) - 10
        assert r.read() == data[-10:]
        assert r.seek(-5, io.SEEK_CUR) == len(data) - 5
        with pytest.raises(ValueError):
            r.seek(-1)


def test_reader_keeps_reading_a_fragment_removed_under_it(
    store: LocalJournalStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A reader finishes a fragment it holds open after trim, then jumps to the next offset."""
    store.create("trim", NDJSON)
    data = b"".join(_lines(60))
    _append_all(store, "trim", [data[i : i + 25] for i in range(0, len(data), 25)])
    frags = store.fragments("trim")
    with store.read("trim") as r:
        assert r.read(10) == data[:10]
        first = store.trim("trim", before_offset=frags[3].end)
        assert first == frags[4].begin
        assert r.read(1000) == data[10 : frags[0].end]  # Still open: readable.
        with caplog.at_level(logging.WARNING, logger="journal"):
            chunk = r.read(5)
        assert r.offset == first + len(chunk)
        assert chunk == data[first : first + 5]
    assert any("no longer available" in m for m in caplog.messages)


def test_trim_by_age_and_seal(store: LocalJournalStore) -> None:
    """trim(older_than=timedelta) keeps recent fragments; seal() lets the open fragment go too."""
    store.create("age", NDJSON)
    _append_all(store, "age", [b"z" * 99 + b"\n"] * 3 + [b"tail\n"])
    assert store.trim("age", older_than=timedelta(hours=1)) == 0
    old = time.time() - 7200
    for f in store.fragments("age"):
        if f.sealed:
            os.utime(f.path, (old, old))
    assert store.trim("age", older_than=timedelta(hours=1)) == 300
    assert _read(store, "age", 300) == b"tail\n"
    sealed = store.seal("age")
    assert sealed is not None and (sealed.begin, sealed.end, sealed.sealed) == (300, 305, True)
    assert store.seal("age") is None
    assert store.trim("age", before_offset=305) == 305
    assert store.fragments("age") == [] and store.head("age") == 305
    assert store.append("age", b"again\n").result().begin == 305


def test_blocking_reader_wakes_promptly_in_process(store: LocalJournalStore) -> None:
    """A following reader gets an append of the same process well under 100 ms after it resolves."""
    store.create("fast", NDJSON)
    with store.read("fast", block=True) as r:
        delays = []
        for i in range(5):
            box: list[float] = []

            def consume(box: list[float] = box) -> None:
                r.read(100)
                box.append(time.monotonic())

            t = threading.Thread(target=consume)
            t.start()
            time.sleep(0.03)
            store.append("fast", b"%d\n" % i).result()
            resolved = time.monotonic()
            t.join(5)
            delays.append(box[0] - resolved)
    assert max(delays) < 0.1, delays


def _spawn_appender(root: str, name: str) -> subprocess.Popen[str]:
    code = (
        "import sys, time\n"
        "from journal import LocalJournalStore\n"
        f"s = LocalJournalStore({root!r})\n"
        "for line in sys.stdin:\n"
        f"    s.append({name!r}, line.encode()).result()\n"
        "    print(time.time(), flush=True)\n"
        "s.close()\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )


@pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
def test_blocking_reader_follows_another_process(tmp_path: Path, inotify: bool) -> None:
    """Appends of another process reach a following reader promptly, with inotify or by polling."""
    root = str(tmp_path / "root")
    with LocalJournalStore(root) as s:
        s.create("xproc", NDJSON)
        if not inotify:
            s._watcher._inotify_failed = True
        proc = _spawn_appender(root, "xproc")
        assert proc.stdin is not None and proc.stdout is not None
        try:
            with s.read("xproc", block=True) as r:
                delays = []
                for i in range(5):
                    proc.stdin.write(f"line {i}\n")
                    proc.stdin.flush()
                    got = r.read(100)
                    seen = time.time()
                    resolved = float(proc.stdout.readline())
                    assert got == f"line {i}\n".encode()
                    delays.append(seen - resolved)
        finally:
            proc.stdin.close()
            proc.wait(10)
            proc.stdout.close()
        assert (s._watcher._inotify is not None) is inotify
    assert max(delays) < 0.1, delays


def test_blocked_reader_does_not_spin(store: LocalJournalStore) -> None:
    """A reader blocked on a quiet journal uses next to no CPU."""
    store.create("quiet", NDJSON)
    r = store.read("quiet", block=True)
    t = threading.Thread(target=r.read, args=(10,))
    t.start()
    time.sleep(0.05)
    cpu0 = time.thread_time(), time.process_time()
    time.sleep(0.5)
    used = time.process_time() - cpu0[1]
    r.close()
    t.join(5)
    assert not t.is_alive()
    assert used < 0.1, used


def test_many_readers_follow_concurrently(store: LocalJournalStore) -> None:
    """Several following readers each receive every byte appended while they wait."""
    store.create("fan", NDJSON)
    parts = _lines(50)
    total = sum(map(len, parts))
    results: list[bytes] = []
    lock = threading.Lock()

    def follow() -> None:
        got = bytearray()
        with store.read("fan", 0, total, block=True) as r:
            while chunk := r.read(64):
                got += chunk
        with lock:
            results.append(bytes(got))

    threads = [threading.Thread(target=follow) for _ in range(6)]
    for t in threads:
        t.start()
    for p in parts:
        store.append("fan", p)
    for t in threads:
        t.join(20)
    assert results == [b"".join(parts)] * 6


def test_reader_of_deleted_journal_raises(store: LocalJournalStore) -> None:
    """A reader of a deleted journal finishes its open file, then raises JournalNotFoundError."""
    store.create("del", NDJSON)
    store.append("del", b"x\n").result()
    with store.read("del") as r:
        assert r.read(1) == b"x"
        store.delete("del")
        assert r.read(1) == b"\n"
        with pytest.raises(JournalNotFoundError):
            r.read(1)


def test_append_future_behaves_as_a_future() -> None:
    """AppendFuture keeps Future's contract: waiting, callbacks, cancel, wait()."""
    import threading
    import time
    from concurrent.futures import wait

    from journal._future import AppendFuture

    f: AppendFuture[int] = AppendFuture()
    assert not f.done()
    assert f.set_running_or_notify_cancel()
    f.set_result(5)
    assert f.done() and f.result() == 5
    got: list[int] = []
    g: AppendFuture[int] = AppendFuture()
    g.add_done_callback(lambda x: got.append(x.result()))
    g.set_running_or_notify_cancel()
    g.set_result(7)
    assert got == [7]
    h: AppendFuture[int] = AppendFuture()
    t = threading.Thread(
        target=lambda: (time.sleep(0.05), h.set_running_or_notify_cancel(), h.set_result(9))
    )
    t.start()
    assert h.result(timeout=5) == 9
    t.join()
    c: AppendFuture[int] = AppendFuture()
    assert c.cancel() and not c.set_running_or_notify_cancel()
    e: AppendFuture[int] = AppendFuture()
    e.set_running_or_notify_cancel()
    assert not e.done()
    e.set_exception(ValueError("x"))
    assert e.done() and isinstance(e.exception(), ValueError)
    assert e._cond is None  # done() and exception() of a resolved future need no Condition
    with pytest.raises(ValueError):
        e.result()
    assert c.done() and c.cancelled()
    p: AppendFuture[int] = AppendFuture()
    with pytest.raises(TimeoutError):
        p.exception(timeout=0.01)  # pending: exception() waits, as Future's does
    fs: list[AppendFuture[int]] = [AppendFuture() for _ in range(5)]

    def resolve() -> None:
        for x in fs:
            time.sleep(0.01)
            x.set_running_or_notify_cancel()
            x.set_result(1)

    t = threading.Thread(target=resolve)
    t.start()
    done, not_done = wait(fs, timeout=5)
    t.join()
    assert len(done) == 5 and not not_done


def test_append_future_states_are_those_of_future() -> None:
    """AppendFuture spells Future's states as concurrent.futures does."""
    from concurrent.futures import Future

    from journal import _future

    f: Future[int] = Future()
    assert f._state == _future.PENDING
    f.set_running_or_notify_cancel()
    assert f._state == _future.RUNNING
    f.set_result(1)
    assert f._state == _future.FINISHED
    c: Future[int] = Future()
    c.cancel()
    assert c._state == _future.CANCELLED
    c.set_running_or_notify_cancel()
    assert c._state == _future.CANCELLED_AND_NOTIFIED


_needs_native_journal = pytest.mark.skipif(
    journal_pending.NATIVE is None, reason="the native core is not in use"
)


@_needs_native_journal
def test_append_futures_stay_out_of_the_collector_until_they_could_form_a_cycle(
    store: LocalJournalStore,
) -> None:
    """A resolved append future is not tracked by the cyclic GC; a
    callback or an exception puts it back, so that a cycle through it is
    still collected."""
    import gc
    import weakref
    from functools import partial

    store.create("gc", NDJSON)
    f = store.append("gc", b"a\n")
    store.flush()
    assert f.done() and not gc.is_tracked(f)
    res = f.result()  # (waits through the Condition: tracked from here)
    assert res == AppendResult("gc", 0, 2)
    assert gc.is_tracked(f)

    # A cycle through a callback.
    g = store.append("gc", b"b\n")
    g.add_done_callback(lambda _f, me=g: None)
    assert gc.is_tracked(g)
    ref = weakref.ref(g)
    store.flush()
    del g
    gc.collect()
    assert ref() is None

    # A cycle through an exception: of a failed batch, read from the
    # future's group, or set by set_exception, each without a Condition.
    from journal._future import AppendGroup

    def failed(how: str) -> Future[AppendResult]:
        pending = journal_pending.Pending(partial(AppendGroup, "gc"), RuntimeError,
                                          lambda: None, lambda: None)
        e = pending.submit(b"abc")
        assert not gc.is_tracked(e)
        _, group = pending.take()
        group.start(0, 1)
        if how == "batch":
            group.resolve(0, 1, None, 0, 0, ValueError("boom"))
        else:
            e.set_exception(ValueError("boom"))
        return e

    for how in ("batch", "set_exception"):
        e = failed(how)
        err = e.exception()
        assert isinstance(err, ValueError) and e._cond is None  # type: ignore[attr-defined]
        assert gc.is_tracked(e)
        err.future = e  # type: ignore[attr-defined]
        ref_e = weakref.ref(e)
        del e, err
        gc.collect()
        assert ref_e() is None, how


def _fail_commits(monkeypatch: pytest.MonkeyPatch, failing_now: dict[str, bool]) -> None:
    """The embedded store's commits fail with EIO while ``failing_now["on"]``."""
    import errno

    def failing(write: Any) -> Any:
        def failing_write(self: Any, data: list[bytes]) -> Any:
            if failing_now["on"]:
                raise OSError(errno.EIO, "injected I/O error")
            return write(self, data)
        return failing_write

    for name in ("_write_current", "_commit"):  # (the fast way, and the general one)
        original = getattr(writer.JournalWriter, name)
        monkeypatch.setattr(writer.JournalWriter, name, failing(original))


def _groups_alive() -> int:
    import gc

    from journal._future import AppendGroup

    gc.collect()
    return sum(1 for o in gc.get_objects() if type(o) is AppendGroup)


def test_failed_batches_are_collected_however_their_errors_were_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed batch's error reaches its callers as each future's own copy
    (same type, message, attributes and cause): raising it ties nothing to
    the futures of the batch that nobody looked at. Rounds of failed
    appends, their errors raised through result(), exception() and
    PendingAppends.settle and kept in frames that hold every future, leave
    no group and none of the batches' bytes behind; a future's attributes
    form collectable cycles too."""
    import gc
    import tracemalloc
    import weakref

    from journal import JournalError, PendingAppends

    failing = {"on": False}
    _fail_commits(monkeypatch, failing)
    with LocalJournalStore(tmp_path) as s:
        s.create("a/b", NDJSON)
        s.append("a/b", b"{}\n").result()
        before = _groups_alive()
        tracemalloc.start()
        try:
            base = tracemalloc.get_traced_memory()[0]
            failing["on"] = True
            kept: list[BaseException] = []

            def round_of(how: str) -> None:
                futures = [s.append("a/b", b'{"p":"' + b"x" * 20_000 + b'"}\n')
                           for _ in range(50)]
                pending = PendingAppends()
                for f in futures:
                    pending.add(f)
                try:
                    if how == "result":
                        futures[-1].result()
                    elif how == "settle":
                        pending.settle()
                    else:
                        raise futures[len(futures) // 2].exception()  # type: ignore[misc]
                except JournalError as exc:
                    kept.append(exc)  # (its traceback holds this frame: futures)
                with contextlib.suppress(JournalError):
                    s.flush()

            for how in ("result", "settle", "exception") * 4:
                round_of(how)
            errors = [e for e in kept if isinstance(e, JournalError)]
            assert len(errors) == 12
            assert all("injected I/O error" in str(e) for e in errors)
            assert all(isinstance(e.__cause__, OSError) and e.__cause__.errno == 5
                       for e in errors)
            kept.clear()
            del errors
            assert _groups_alive() <= before + 1  # (the writer's current one)
            held = tracemalloc.get_traced_memory()[0] - base
            assert held < 2_000_000, f"{held} bytes still held after 12 failed rounds of 1 MB"

            # One failed future kept does not keep its batch's bytes.
            futures = [s.append("a/b", b'{"p":"' + b"y" * 20_000 + b'"}\n') for _ in range(50)]
            one = futures[-1]
            assert isinstance(one.exception(), JournalError)
            with contextlib.suppress(JournalError):
                s.flush()
            del futures
            gc.collect()
            held = tracemalloc.get_traced_memory()[0] - base
            assert held < 500_000, f"{held} bytes held by one failed future"
            # Its error is its own, the same each time it is asked for.
            assert one.exception() is one.exception()
            del one
        finally:
            tracemalloc.stop()

        # A cycle through an attribute stored on a future.
        failing["on"] = False

        class Request:
            future: Any = None

        refs = []
        for _ in range(20):
            f = s.append("a/b", b"{}\n")
            req = Request()
            req.future, f.request = f, req  # type: ignore[attr-defined]
            refs.append(weakref.ref(req))
        s.flush()
        del f, req
        gc.collect()
        assert all(r() is None for r in refs)


def test_an_append_whose_writer_thread_cannot_start_fails_and_is_never_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where the writer thread cannot start (the OS refuses threads), the
    append fails through its future and flush, as one that could not be
    written does; it is not written later, and the next append starts a
    thread and lands where the failed one would have."""
    from journal import JournalError

    refuse = {"n": 0}
    start = threading.Thread.start

    def refusing_start(self: threading.Thread) -> None:
        if self.name.startswith("journal-writer") and refuse["n"]:
            refuse["n"] -= 1
            raise RuntimeError("can't start new thread")
        start(self)

    monkeypatch.setattr(threading.Thread, "start", refusing_start)
    with LocalJournalStore(tmp_path) as s:
        s.create("a/b", NDJSON)
        refuse["n"] = 1
        failed = s.append("a/b", b'{"n":1}\n')
        error = failed.exception(timeout=10)
        assert isinstance(error, JournalError)
        assert "writer thread did not start: can't start new thread" in str(error)
        with pytest.raises(JournalError, match="1 append\\(s\\) failed"):
            s.flush()
        landed = s.append("a/b", b'{"n":2}\n').result(timeout=10)
        assert (landed.begin, landed.end) == (0, 8)
        s.flush()
        assert b"".join(s.read("a/b")) == b'{"n":2}\n'
    # Closed cleanly, and the journal holds the one append that landed.
    with LocalJournalStore(tmp_path) as again:
        assert b"".join(again.read("a/b")) == b'{"n":2}\n'


def test_a_done_callback_that_raises_systemexit_does_not_stop_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Future logs an Exception raised by a done-callback and goes on, but
    lets SystemExit through: on a writer thread it would end the thread
    and leave the journal's later appends and flushes waiting for good.
    It is logged, and the writer goes on."""
    gate = threading.Event()
    write_batch = writer.JournalWriter._write_batch

    def gated(self: Any, data: list[bytes]) -> Any:
        assert gate.wait(30)
        return write_batch(self, data)

    monkeypatch.setattr(writer.JournalWriter, "_write_batch", gated)
    with LocalJournalStore(tmp_path) as s:
        s.create("cb", NDJSON)
        futures = [s.append("cb", b"%d\n" % i) for i in range(10)]
        for f in futures[:5]:
            f.add_done_callback(lambda _f: sys.exit(3))
        calls: list[Any] = []
        for f in futures[5:]:
            f.add_done_callback(calls.append)
        gate.set()
        s.flush(timeout=30)
        assert all(f.done() for f in futures) and calls == futures[5:]
        assert s.append("cb", b"x\n").result(timeout=30).begin == 20
        assert "a done-callback of an append to 'cb' raised" in caplog.text


def test_futures_looked_at_while_their_batches_land_resolve_to_where_they_landed(
    tmp_path: Path,
) -> None:
    """Threads append while others wait on, poll, cancel and add callbacks
    to the futures as the writer thread resolves their batches: each future
    ends once, with the offsets where its bytes are (or cancelled, its
    bytes not written), whenever it was looked at."""
    import random

    with LocalJournalStore(tmp_path / "root", fragment_size=64 << 10) as s:
        s.create("j", NDJSON)
        made: list[list[tuple[bytes, Future[AppendResult]]]] = [[] for _ in range(4)]
        called: list[Future[AppendResult]] = []
        errors: list[BaseException] = []

        def appender(k: int) -> None:
            rng = random.Random(k)
            try:
                for i in range(1500):
                    data = b'{"t": %d, "i": %d, "pad": "%s"}\n' % (k, i, b"x" * rng.randrange(40))
                    f = s.append("j", data)
                    made[k].append((data, f))
                    look = rng.random()
                    if look < 0.02:
                        f.result(timeout=30)
                    elif look < 0.04:
                        f.add_done_callback(called.append)
                    elif look < 0.06:
                        f.cancel()
                    elif look < 0.08:
                        f.done()
            except BaseException as exc:
                errors.append(exc)

        appended = threading.Event()

        def poller() -> None:
            rng = random.Random(99)
            try:
                while not appended.is_set():
                    k = rng.randrange(4)
                    if made[k]:
                        _, f = made[k][rng.randrange(len(made[k]))]
                        if rng.random() < 0.5:
                            f.done()
                        else:
                            f.running()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=appender, args=(k,)) for k in range(4)]
        polling = threading.Thread(target=poller)
        for t in [*threads, polling]:
            t.start()
        for t in threads:
            t.join()
        appended.set()
        polling.join()
        assert not errors
        s.flush()
        content = _read(s, "j")
        landed = 0
        for per_thread in made:
            for data, f in per_thread:
                assert f.done()
                if f.cancelled():
                    continue
                res = f.result(0)
                assert res.journal == "j" and content[res.begin:res.end] == data
                landed += len(data)
        assert landed == len(content)  # nothing written twice, nothing cancelled written
        assert all(f.done() for f in called)


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("seed", range(6))
def test_append_groups_resolve_each_future_as_its_batch_went(native: bool, seed: int) -> None:
    """Futures read their outcome from their group: offsets where their
    batch landed, in order; the batch's error past what landed; cancelled
    ones are not written. Whether a future is looked at (pinned) before its
    batch starts, while it runs, or after it resolved, it ends the same, and
    scan_futures reads the same as the futures' own methods."""
    import random
    from concurrent.futures import CancelledError
    from functools import partial

    from journal._future import AppendGroup
    from journal._tracking import py_scan_futures, scan_futures

    if native and journal_pending.NATIVE is None:
        pytest.skip("the native core is not in use here")
    make = journal_pending.NATIVE.Pending if native else journal_pending.PyPending
    rng = random.Random(seed)
    pending = make(partial(AppendGroup, "j/x"), RuntimeError, lambda: None, lambda: None)
    sizes = [rng.randrange(0, 50) for _ in range(rng.randrange(1, 60))]
    futures = [pending.submit(bytes(n)) for n in sizes]
    data, group = pending.take()
    assert [len(d) for d in data] == sizes and len(group) == len(sizes)
    assert pending.take() == ([], None)
    # Some are looked at (pinned) before anything starts; some cancelled.
    early = {i for i in range(len(sizes)) if rng.random() < 0.2}
    for i in early:
        assert not futures[i].running() and not futures[i].done()
    cancelled = {i for i in early if rng.random() < 0.5 and futures[i].cancel()}
    want: dict[int, tuple[AppendResult | None, str | None]] = {}
    offset, lo = rng.randrange(0, 2**40), 0
    while lo < len(sizes):
        hi = rng.randrange(lo + 1, len(sizes) + 1)
        live = group.start(lo, hi)
        written = [i for i in range(lo, hi) if i not in cancelled]
        assert (live is None) == (written == list(range(lo, hi)))
        if live is not None:
            assert [lo + k for k in live] == written
        for i in written:
            if rng.random() < 0.3:
                assert futures[i].running()  # (pinned while running)
        fails = rng.random() < 0.3
        landed = rng.randrange(0, len(written) + 1) if fails else len(written)
        error = ValueError(f"batch {lo}") if landed < len(written) else None
        begin = offset
        for place, i in enumerate(written):
            if place < landed:
                want[i] = (AppendResult("j/x", offset, offset + sizes[i]), None)
                offset += sizes[i]
            else:
                want[i] = (None, f"batch {lo}")
        if rng.random() < 0.5:  # some looked at while running
            for i in range(lo, hi):
                if rng.random() < 0.3:
                    futures[i].add_done_callback(lambda _f: None)
        group.resolve(lo, hi, live, begin, landed, error)
        offset = begin + sum(sizes[i] for i in written[:landed]) + rng.randrange(0, 10)
        lo = hi
    for scan in (scan_futures, py_scan_futures):
        first, not_done = scan(list(futures))
        assert not_done == []
        failures = [i for i in range(len(sizes)) if i in cancelled or want[i][1]]
        if not failures:
            assert first is None
        elif failures[0] in cancelled:
            assert isinstance(first, CancelledError)
        else:
            assert str(first) == want[failures[0]][1]
    # Resolved whole, the group keeps its sizes compact (a future kept for
    # long keeps its group), and a future looked at no longer needs it.
    from array import array

    assert isinstance(group.ends, array) and len(group.ends) == len(sizes)
    assert all(futures[i]._group is None for i in early)  # type: ignore[attr-defined]
    for i, f in enumerate(futures):
        assert f.done()
        if i in cancelled:
            assert f.cancelled()
            continue
        result, error_text = want[i]
        if error_text is None:
            assert f.exception() is None and f.result(0) == result
        else:
            assert str(f.exception()) == error_text
            with pytest.raises(ValueError):
                f.result(0)


def test_append_router_and_method_append_the_same(tmp_path: Path) -> None:
    """Where the native core is built, a store's append is a router that
    hands the common case to the journal's queue and everything else to the
    method (the definition): both land the same bytes, and every uncommon
    case raises what the method raises."""
    from journal import AppendTooLargeError, JournalClosedError

    store = LocalJournalStore(tmp_path, max_append_size=8)
    method = LocalJournalStore.append.__get__(store)
    if journal_pending.NATIVE is not None:
        assert store.append is not method and store.append.__wrapped__ == method
    store.create("r", NDJSON)
    futures = [
        store.append("r", b"1\n"),  # the slow path (no queue yet), then fast ones
        store.append("r", b"2\n"),
        method("r", b"3\n"),
        store.append("r", bytearray(b"4\n")),
        store.append("r", memoryview(b"5\n")),
        store.append("r", b"1234567\n"),  # exactly max_append_size
    ]
    assert [f.result() for f in futures][-1] == AppendResult("r", 10, 18)
    assert _read(store, "r") == b"1\n2\n3\n4\n5\n1234567\n"
    for call in (store.append, method):
        with pytest.raises(AppendTooLargeError):
            call("r", b"123456789")
        with pytest.raises(JournalNotFoundError):
            call("missing", b"x\n")
        with pytest.raises(TypeError):
            call(["r"], b"x\n")  # type: ignore[arg-type]
    # A journal deleted and created again: its old queue is retired.
    store.delete("r")
    store.create("r", NDJSON)
    assert store.append("r", b"6\n").result() == AppendResult("r", 0, 2)
    store.close()
    for call in (store.append, method):
        with pytest.raises(JournalClosedError):
            call("r", b"7\n")


def test_a_subclass_overriding_append_sees_every_append(tmp_path: Path) -> None:
    """The router is the definition's shortcut: a subclass that overrides
    append (to count, to inject a fault) is called for every append, the
    Publisher's included, as where the native core is not built."""
    from message import JsonDocument, Publisher, modulo_mapping

    class Counting(LocalJournalStore):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.calls = 0

        def append(self, name: str, data: bytes | bytearray | memoryview) -> Any:
            self.calls += 1
            return super().append(name, data)

    with Counting(tmp_path) as store:
        spec = store.create("r", NDJSON)
        for i in range(3):
            store.append("r", b"%d\n" % i).result()
        pub = Publisher(store)
        to = modulo_mapping(lambda d: "k", lambda: [spec])
        for i in range(4):
            pub.publish_committed(to, JsonDocument(i=i))
        store.flush()
        assert store.calls == 7
        assert store.head("r") > 6


def test_a_journal_without_a_recorded_start_keeps_the_old_rule(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A journal made before starts were recorded (no ``@start``): nothing
    kept below the first fragment is taken for retention, as before; its
    first trim() records a start."""
    jdir = _sealed_store(tmp_path / "root")
    (jdir / "@start").unlink()
    frags = sorted(jdir.glob("*.raw"))
    with LocalJournalStore(tmp_path / "root") as s:
        bounds = [(f.begin, f.end) for f in s.fragments("bad/j")]
        frags[0].unlink()
        with caplog.at_level(logging.WARNING, logger="journal"), s.read("bad/j") as r:
            assert r.read(10) and r.offset > bounds[0][1]
        assert s.check("bad/j") == [] and s.verify("bad/j")
        s.trim("bad/j", before_offset=bounds[1][1])
        assert (jdir / "@start").read_text() == f"{bounds[1][1]}\n"


_OTHER_FUTURE_LAYOUT = r"""
import concurrent.futures, sys
plain_init = concurrent.futures.Future.__init__
def init(self):  # a Future that keeps one more private field than 3.11's
    plain_init(self)
    self._other = None
concurrent.futures.Future.__init__ = init
from journal import LocalJournalStore, TrackingClient
from journal._future import LAYOUT_KNOWN, PlainAppendFuture
assert not LAYOUT_KNOWN
with LocalJournalStore(sys.argv[1]) as store:
    store.create("j", {"content-type": "application/x-ndjson"})
    futures = [store.append("j", b'{"n": %d}\n' % i) for i in range(1000)]
    assert all(isinstance(f, PlainAppendFuture) for f in futures)
    ends = [f.result(timeout=30).end for f in futures]
    assert ends == sorted(ends) and ends[-1] == store.head("j")
    tracked = TrackingClient(store)
    tracked.append("j", b'{"n": -1}\n')
    tracked.flush(30)
print("ok")
"""


def test_append_futures_fall_back_to_the_plain_way_on_another_future_layout(
    tmp_path: Path,
) -> None:
    """Where Future's private fields are not the ones AppendFuture was
    written for, appends still resolve, in order, through Future's public
    methods alone."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _OTHER_FUTURE_LAYOUT, str(tmp_path)],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_parse_duration_reads_what_people_and_gazette_write() -> None:
    """journal.parse_duration: the one reader of durations (the command
    line's --older-than, shard spec files)."""
    from journal import parse_duration

    assert [parse_duration(t) for t in ("90", "0.5", "500ms", "15m", "1m30s", " 2 h ", "7d",
                                        ".5s")] == [90, 0.5, 0.5, 900, 90, 7200, 604800, 0.5]
    for bad in ("", "-1", "soon", "1x", "nan", "inf", "1e3", "15m x", "m"):
        with pytest.raises(ValueError, match="not a duration"):
            parse_duration(bad)


_FORGETFUL_APPENDER = """
import sys
from journal import LocalJournalStore

store = LocalJournalStore(sys.argv[1])
store.create("j", {"content-type": "application/x-ndjson"})
for i in range(50_000):
    store.append("j", b'{"i": %d}\\n' % i)  # never waited for
# exits without flushing or closing the store
"""


def test_appends_still_queued_at_exit_are_written(tmp_path: Path) -> None:
    """A program that exits with appends still queued and its store open:
    the store is closed at exit and every queued append is written, in
    order, before the process ends."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-c", _FORGETFUL_APPENDER, str(tmp_path)],
                       capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0 and not r.stderr, r.stderr
    with LocalJournalStore(tmp_path) as store, store.read("j") as reader:
        lines = reader.read().splitlines()
    assert lines == [b'{"i": %d}' % i for i in range(50_000)]
