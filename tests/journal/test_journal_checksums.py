"""Batch checksums: a byte changed in place is found, and repair keeps the rest.

Every committed batch of appends has a CRC-32C (journal/_local/sums.py): the open
fragment's in the commit record file, a sealed fragment's in its
``@sums-<begin>-<end>`` file. Real bytes are flipped in real files here;
``check`` (``exactly fsck``) must name the batch, readers must refuse it when
asked to verify, and a repair must quarantine only the damaged batches.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from journal import CorruptJournalError, LocalJournalStore
from journal._local import files
from journal._local.files import (
    JournalDir,
    fragment_sha1,
    open_batches,
    open_commit,
    read_record,
    read_sums,
)
from journal._local.fragment import parse_sealed_name
from journal._local.sums import crc32c, unchecked
from message import JsonDocument, Publisher, ReadCommittedIter, Transaction, modulo_mapping

NDJSON = {"content-type": "application/x-ndjson"}
J = "sums/j"
ROOT = Path(__file__).resolve().parents[2]


def _doc(i: int) -> bytes:
    return b'{"n": %06d}\n' % i  # 14 bytes


def _store(root: Path, n: int, *, fragment_size: int = 1 << 20) -> None:
    """``n`` appends of one document each (one batch each)."""
    with LocalJournalStore(root, fragment_size=fragment_size) as s:
        s.create(J, NDJSON)
        for i in range(n):
            s.append(J, _doc(i)).result()


def _jdir(root: Path) -> Path:
    return root / "sums" / "j"


def _flip(path: Path, pos: int) -> None:
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x01]))


def _numbers(root: Path, **opts: bool) -> list[int]:
    with LocalJournalStore(root, **opts) as s, s.read(J) as r:
        return [int(line[6:12]) for line in r.read().splitlines()]


def test_flipped_byte_in_the_open_fragment_is_found(tmp_path: Path) -> None:
    """Before checksums, the open fragment had none: a flip was delivered and
    fsck said nothing. Now check() and verify() name the batch's offsets, and
    readers refuse it with verify_checksums."""
    root = tmp_path / "store"
    _store(root, 10)
    (open_file,) = _jdir(root).glob("@open-*")
    _flip(open_file, 3 * 14 + 8)  # a digit of the fourth document
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert (problem.offset, problem.end_offset) == (42, 56)
        assert problem.path == str(open_file) and "checksum" in problem.reason
        with pytest.raises(CorruptJournalError) as err:
            s.verify(J)
        assert (err.value.offset, err.value.end_offset) == (42, 56)
    # Without the option, readers deliver it (fsck is the check of record).
    assert len(_numbers(root)) == 10
    with LocalJournalStore(root, verify_checksums=True) as s, s.read(J) as r:
        assert r.read(42) == b"".join(_doc(i) for i in range(3))  # intact batches first
        with pytest.raises(CorruptJournalError) as err:
            r.read()
        assert (err.value.offset, err.value.end_offset) == (42, 56)


@pytest.mark.parametrize("sealed", [False, True])
def test_a_verifying_reader_reads_around_a_damaged_batch(tmp_path: Path, sealed: bool) -> None:
    """One damaged batch spoils only itself: a read of any size delivers
    the intact batches before it, then raises with its offsets; a reader
    starting past it reads on; skip_corrupt skips it alone."""
    root = tmp_path / "store"
    doc = lambda i: b'{"n": %6d}\n' % i  # noqa: E731  (14 bytes, valid JSON)
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        for i in range(10):
            s.append(J, doc(i)).result()
    (open_file,) = _jdir(root).glob("@open-*")
    _flip(open_file, 3 * 14 + 11)  # batch [42, 56): n=3 becomes n=2
    if sealed:
        with LocalJournalStore(root) as s:
            s.seal(J)
    with LocalJournalStore(root, verify_checksums=True) as s:
        with s.read(J) as r:
            assert r.read(1 << 16) == b"".join(doc(i) for i in range(3))
            with pytest.raises(CorruptJournalError) as err:
                r.read(1 << 16)
            assert (err.value.offset, err.value.end_offset) == (42, 56)
        with s.read(J, 56) as r:
            assert r.read() == b"".join(doc(i) for i in range(4, 10))
        it = ReadCommittedIter(s, J, lambda _s: JsonDocument(), skip_corrupt=True)
        assert [env.message["n"] for env in it] == [0, 1, 2, *range(4, 10)]
        assert it.skipped_ranges == [(42, 56)]


def test_flipped_uuid_flags_of_a_transaction_are_found(tmp_path: Path) -> None:
    """The audit's case: a flip in a UUID's flags turns a transactional frame
    into an outside-transaction one. fsck finds it; a verifying reader never
    hands it to the Sequencer."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        with Transaction(Publisher(s)) as txn:
            for i in range(3):
                txn.publish(lambda _m: (J, "application/x-ndjson"), JsonDocument(n=i))
        s.flush()
    (open_file,) = _jdir(root).glob("@open-*")
    data = open_file.read_bytes()
    uuid_at = data.index(b'"uuid":"') + len('"uuid":"')
    _flip(open_file, uuid_at + 22)  # in the clock sequence, where the flags are
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert problem.offset == 0 and "checksum" in problem.reason
    with LocalJournalStore(root, verify_checksums=True) as s, pytest.raises(CorruptJournalError):
        list(ReadCommittedIter(s, J, lambda _s: JsonDocument()))


def test_repair_keeps_every_intact_batch_of_a_sealed_fragment(tmp_path: Path) -> None:
    """The audit's case: one flipped byte quarantined a whole sealed fragment
    (13 intact messages lost for one damaged). Now only the damaged batch goes."""
    root = tmp_path / "store"
    _store(root, 28, fragment_size=14 * 14)  # two sealed fragments of 14 batches
    first, second = sorted(_jdir(root).glob("*.raw"))
    _flip(second, 5 * 14 + 9)  # the sixth document of the second fragment: n=19
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert (problem.offset, problem.end_offset) == (266, 280)
        (fixed,) = s.check(J, repair=True)
        assert fixed.repair is not None and "[196, 266), [280, 392)" in fixed.repair
        assert s.check(J) == []
        assert s.verify(J)
        assert s.append(J, _doc(99)).result().begin == 392  # offsets never given out twice
    assert _numbers(root) == [*range(19), *range(20, 28), 99]
    jdir = _jdir(root)
    (batch,) = jdir.glob("@quarantine-*-batch")
    assert batch.name == "@quarantine-000000000000010a-0000000000000118-batch"
    assert batch.read_bytes() != _doc(19) and len(batch.read_bytes()) == 14
    (whole,) = jdir.glob("@quarantine-damaged-*")
    assert whole.name == f"@quarantine-damaged-{second.name}"  # nothing deleted
    assert first.exists()
    # The new pieces carry their own checksums: a flip in one is found again.
    (piece,) = [p for p in jdir.glob("*.raw") if p.name.startswith("0000000000000118")]
    _flip(piece, 3)
    with LocalJournalStore(root) as s:
        (again,) = s.check(J)
        assert (again.offset, again.end_offset) == (280, 294)


def test_repair_of_a_damaged_open_fragment_seals_it_and_keeps_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root, 6)
    (open_file,) = _jdir(root).glob("@open-*")
    _flip(open_file, 14 + 2)
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J, repair=True)
        assert (problem.offset, problem.end_offset) == (14, 28) and problem.repair
        assert s.check(J) == []
        assert s.append(J, _doc(7)).result().begin == 84
    assert _numbers(root) == [0, 2, 3, 4, 5, 7]
    assert not list(_jdir(root).glob("@open-0000000000000000"))


def test_without_checksums_the_whole_fragment_goes_as_before(tmp_path: Path) -> None:
    """A sealed fragment whose checksum file is gone (or that was sealed before
    checksums existed): its SHA-1 still finds the damage, which is then
    nowhere in particular: the whole fragment goes to quarantine."""
    root = tmp_path / "store"
    _store(root, 20, fragment_size=10 * 14)
    first = sorted(_jdir(root).glob("*.raw"))[0]
    (_jdir(root) / "@sums-0000000000000000-000000000000008c").unlink()
    _flip(first, 20)
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert "SHA-1" in problem.reason and (problem.offset, problem.end_offset) == (0, 140)
        s.check(J, repair=True)
        assert s.check(J) == []
    assert _numbers(root) == list(range(10, 20))


def test_partly_checked_fragment_blames_what_no_checksum_covers(tmp_path: Path) -> None:
    """A power loss may keep a batch's record and lose its checksum entry: the
    batch is unchecked. A SHA-1 mismatch with every checked batch intact puts
    the damage there, and the checked batches are kept."""
    root = tmp_path / "store"
    _store(root, 10, fragment_size=10 * 14)
    (sealed,) = _jdir(root).glob("*.raw")
    sums = _jdir(root) / "@sums-0000000000000000-000000000000008c"
    raw = sums.read_bytes()
    sums.write_bytes(raw[:20 * 4])  # entries of the first four batches only
    _flip(sealed, 7 * 14 + 1)
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J, repair=True)
        assert (problem.offset, problem.end_offset) == (56, 140)
        assert "no batch checksum covers" in problem.reason
    assert _numbers(root) == [0, 1, 2, 3]


def test_a_journal_written_before_checksums_reads_and_gains_them(tmp_path: Path) -> None:
    """No entries in the commit record and no checksum files: nothing is
    reported, readers verifying read everything, and new batches get checked."""
    root = tmp_path / "store"
    _store(root, 12, fragment_size=5 * 14)
    jdir = _jdir(root)
    for f in jdir.glob("@sums-*"):
        f.unlink()
    os.truncate(jdir / "@commit", 64)
    with LocalJournalStore(root, verify_checksums=True, fragment_size=5 * 14) as s:
        assert s.check(J) == []
        assert len(s.read(J).read()) == 12 * 14
        for i in range(12, 20):
            s.append(J, _doc(i)).result()
    assert _numbers(root, verify_checksums=True) == list(range(20))
    # The fragment sealed last holds old, unchecked batches and new, checked ones.
    last = sorted(jdir.glob("*.raw"))[-1]
    _flip(last, last.stat().st_size - 3)
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert "checksum" in problem.reason


def test_stale_and_torn_entries_in_the_commit_record_are_ignored(tmp_path: Path) -> None:
    """A crash just after a seal leaves the sealed fragment's entries in the
    commit record file; a torn write leaves half an entry. Neither is damage,
    and the next writer cuts them."""
    root = tmp_path / "store"
    _store(root, 4, fragment_size=2 * 14)  # sealed [0, 28), [28, 56); nothing open
    jdir = _jdir(root)
    old = (jdir / "@sums-0000000000000000-000000000000001c").read_bytes()
    with open(jdir / "@commit", "ab") as f:
        f.write(old + b"\x07" * 11)
    with LocalJournalStore(root) as s:
        assert s.check(J) == []
        s.append(J, _doc(4)).result()
        assert s.check(J) == []
    jd = JournalDir.of(str(root), J)
    fd = open_commit(jd)
    try:
        rec = read_record(jd, fd)
        assert open_batches(fd, rec.begin, rec.end) == [(56, 70, crc32c(_doc(4)))]
    finally:
        os.close(fd)
    assert _numbers(root, verify_checksums=True) == [0, 1, 2, 3, 4]


def test_trim_removes_checksums_with_their_fragments(tmp_path: Path) -> None:
    root = tmp_path / "store"
    _store(root, 6, fragment_size=2 * 14)
    jdir = _jdir(root)
    assert len(list(jdir.glob("@sums-*"))) == 3
    with LocalJournalStore(root) as s:
        assert s.trim(J, before_offset=56) == 56
        assert s.check(J) == []
    assert [p.name for p in jdir.glob("@sums-*")] == ["@sums-0000000000000038-0000000000000054"]


_WRITER = """
import sys
from journal import LocalJournalStore
root, tag = sys.argv[1], int(sys.argv[2])
with LocalJournalStore(root, fragment_size=1000) as s:
    futs = [s.append("sums/j", b'{"n": %06d}\\n' % (tag * 1000 + i)) for i in range(300)]
    for f in futs:
        f.result()
"""


def test_writers_in_many_processes_leave_every_batch_checked(tmp_path: Path) -> None:
    """Four processes append at once (group commits, seals by whoever fills a
    fragment): every byte is covered by a checksum that verifies."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [
        subprocess.Popen([sys.executable, "-c", _WRITER, str(root), str(t)], env=env)
        for t in range(4)
    ]
    for p in procs:
        assert p.wait(timeout=120) == 0
    with LocalJournalStore(root, verify_checksums=True) as s:
        assert s.check(J) == []
        s.verify(J)
        assert sorted(_numbers(root, verify_checksums=True)) == sorted(
            t * 1000 + i for t in range(4) for i in range(300)
        )
        frags = s.fragments(J)
    jd = JournalDir.of(str(root), J)
    for f in frags:
        if f.sealed:
            batches = read_sums(jd, f.begin, f.end)
        else:
            fd = open_commit(jd)
            try:
                rec = read_record(jd, fd)
                batches = open_batches(fd, rec.begin, rec.end)
            finally:
                os.close(fd)
        assert unchecked(batches, f.begin, f.end) == [], f


def test_many_batches_spill_from_the_record_page_and_stay_checked(tmp_path: Path) -> None:
    """The newest 201 entries share the commit record's page; older ones are
    spilled after it, 201 at a time. 450 batches in one open fragment: all
    checked, a flip in a spilled one is found, and sealing keeps them all."""
    root = tmp_path / "store"
    _store(root, 450)
    jd = JournalDir.of(str(root), J)
    fd = open_commit(jd)
    try:
        rec = read_record(jd, fd)
        batches = open_batches(fd, rec.begin, rec.end)
    finally:
        os.close(fd)
    assert [(b.begin, b.end) for b in batches] == [(i * 14, i * 14 + 14) for i in range(450)]
    assert (_jdir(root) / "@commit").stat().st_size == 4096 + 20 * 402  # two runs spilled
    (open_file,) = _jdir(root).glob("@open-*")
    _flip(open_file, 10 * 14 + 3)
    with LocalJournalStore(root) as s:
        (problem,) = s.check(J)
        assert (problem.offset, problem.end_offset) == (140, 154)
        s.seal(J)
        assert len(read_sums(jd, 0, 450 * 14)) == 450
        (problem,) = s.check(J)
        assert (problem.offset, problem.end_offset) == (140, 154)
        s.append(J, _doc(450)).result()  # the log starts again for the next fragment
    fd = open_commit(jd)
    try:
        rec = read_record(jd, fd)
        assert [(b.begin, b.end) for b in open_batches(fd, rec.begin, rec.end)] == [
            (6300, 6314)]
    finally:
        os.close(fd)


@pytest.mark.parametrize("piece", [1, 7, 4096, 1 << 20])
def test_fragment_sha1_is_the_files_sha1_in_pieces_of_any_size(tmp_path: Path, piece: int) -> None:
    """Hashed in pieces of any size (a sealing writer's are large, a reader's
    1 MiB): the SHA-1 of the first ``size`` bytes, or of all there is."""
    data = os.urandom(10_001)
    path = tmp_path / "f"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        for size in (0, 1, 4096, 9_999, 10_001):
            assert fragment_sha1(fd, size, piece=piece) == hashlib.sha1(data[:size]).digest()
        assert fragment_sha1(fd, 20_000, piece=piece) == hashlib.sha1(data).digest()
    finally:
        os.close(fd)


def test_fragments_sealed_while_another_thread_publishes_are_named_by_their_sha1(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Writers seal fragments, hashing them in pieces (a few here), while the
    application's thread publishes: every sealed file's name holds the SHA-1
    of its bytes, and a verifying reader reads every message back."""
    monkeypatch.setattr(files, "_SEAL_CHUNK", 3_000)
    root = tmp_path / "root"
    n = 20_000
    with LocalJournalStore(root, fragment_size=32_000) as s:
        specs = [s.create(f"{J}-{i}", NDJSON) for i in range(2)]
        mapping = modulo_mapping(lambda d: str(d["n"]), lambda: specs)
        pub = Publisher(s)
        for i in range(n):
            pub.publish_committed(mapping, JsonDocument(n=i))
        s.flush()
    sealed = [p for p in root.rglob("*") if p.is_file() and parse_sealed_name(p.name)]
    assert len(sealed) > 20
    for p in sealed:
        name = parse_sealed_name(p.name)
        assert name is not None
        assert hashlib.sha1(p.read_bytes()).digest() == name[2], p.name
    got = []
    with LocalJournalStore(root, verify_fragments=True) as s:
        for spec in specs:
            with ReadCommittedIter(s, spec.name, lambda _: JsonDocument()) as it:
                got += [e.message["n"] for e in it]
    assert sorted(got) == list(range(n))
