"""Damaged stores lose only what is damaged.

Real files are truncated, real bytes flipped and real symbolic links made;
then readers must deliver everything that is intact, name what is not, and
(with ``skip_corrupt``) read past it; writers must never write over bytes a
damaged commit record may have covered.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from journal import CorruptJournalError, JournalError, LocalJournalStore
from journal._local.fragment import COMMIT_FILE, SLOT_SIZE, slot_offset
from message import (
    Clock,
    Envelope,
    JsonDocument,
    Publisher,
    ReadCommittedIter,
    ReadUncommittedIter,
    Transaction,
    new_clock,
)

NDJSON = {"content-type": "application/x-ndjson"}
J = "dmg/j"


def _to(_msg: object) -> tuple[str, str]:
    return J, "application/x-ndjson"


def _new(_spec: object) -> JsonDocument:
    return JsonDocument()


def _publish_many(root: Path, n: int, *, fragment_size: int = 300) -> None:
    """``n`` committed documents, then a transaction of three: many sealed fragments."""
    with LocalJournalStore(root, fragment_size=fragment_size) as s:
        s.create(J, NDJSON)
        pub = Publisher(s, Clock(new_clock(1_700_000_000 * 10**9)))
        for i in range(n):
            pub.publish_committed(_to, JsonDocument(n=i)).result()
        with Transaction(Publisher(s)) as txn:
            for i in range(3):
                txn.publish(_to, JsonDocument(n=1000 + i))
        s.flush()


def _sealed(root: Path) -> list[Path]:
    return sorted((root / "dmg" / "j").glob("*.raw"))


def _range(frag: Path) -> tuple[int, int]:
    begin, end = frag.name.split("-")[:2]
    return int(begin, 16), int(end, 16)


def _numbers(envs: object) -> list[int]:
    return [e.message["n"] for e in envs if "n" in e.message]  # type: ignore[attr-defined]


def _all_numbers(n: int) -> list[int]:
    return [*range(n), 1000, 1001, 1002]


def _damage(frag: Path, how: str) -> None:
    if how == "truncated":
        os.truncate(frag, frag.stat().st_size // 2)
    else:
        data = bytearray(frag.read_bytes())
        data[len(data) // 2] ^= 0x20
        frag.write_bytes(bytes(data))


# -- a damaged sealed fragment ----------------------------------------------------------


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("how", ["truncated", "flipped"])
@pytest.mark.parametrize("committed", [False, True])
def test_frames_before_a_damaged_fragment_are_delivered_then_it_is_named(
    tmp_path: Path, how: str, committed: bool
) -> None:
    """A sealed fragment in the middle truncated (or with a flipped byte): the
    journal opens, the frames before it are delivered, then the error names the
    fragment and its offsets."""
    root = tmp_path / "root"
    _publish_many(root, 40)
    victim = _sealed(root)[2]
    begin, end = _range(victim)
    _damage(victim, how)
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    with LocalJournalStore(root) as s:
        got: list[Envelope] = []
        it = it_type(s, J, _new)
        with pytest.raises(CorruptJournalError) as info:
            got.extend(it)
        it.close()
        assert got and all(env.end <= begin for env in got)
        assert got[-1].end == begin  # every frame before the fragment
        assert info.value.journal == J and info.value.path == str(victim)
        assert (info.value.offset, info.value.end_offset) == (begin, end)
        assert victim.name in str(info.value)


@pytest.mark.usefixtures("read_loops")
@pytest.mark.parametrize("how", ["truncated", "flipped"])
@pytest.mark.parametrize("committed", [False, True])
def test_skip_corrupt_skips_a_damaged_fragment_and_reads_on(
    tmp_path: Path, how: str, committed: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """With skip_corrupt, the damaged fragment is skipped (logged, counted) and
    reading goes on with the next one: only its messages are missing."""
    root = tmp_path / "root"
    _publish_many(root, 40)
    victim = _sealed(root)[2]
    begin, end = _range(victim)
    with LocalJournalStore(root) as s:
        inside = [
            e.message["n"] for e in ReadUncommittedIter(s, J, _new, offset=begin, end_offset=end)
        ]
    assert inside
    _damage(victim, how)
    it_type = ReadCommittedIter if committed else ReadUncommittedIter
    with LocalJournalStore(root) as s, caplog.at_level(logging.WARNING):
        it = it_type(s, J, _new, skip_corrupt=True)
        got = _numbers(it)
        assert got == [n for n in _all_numbers(40) if n not in inside]
        assert it.skipped == 1
        if not committed:
            assert it.skipped_ranges == [(begin, end)]  # type: ignore[attr-defined]
    assert any(J in m and f"[{begin}, {end})" in m for m in caplog.messages)


@pytest.mark.usefixtures("read_loops")
def test_skip_corrupt_from_inside_a_damaged_fragment_and_up_to_an_end_offset(
    tmp_path: Path,
) -> None:
    """Starting inside the damaged fragment, or ending inside it, skips just what is left."""
    root = tmp_path / "root"
    _publish_many(root, 40)
    frags = _sealed(root)
    begin, end = _range(frags[2])
    with LocalJournalStore(root) as s:
        envs = list(ReadUncommittedIter(s, J, _new))
    _damage(frags[2], "truncated")
    starts = [e.begin for e in envs]
    mid = next(b for b in starts if begin < b < end)
    with LocalJournalStore(root) as s:
        it = ReadUncommittedIter(s, J, _new, offset=mid, skip_corrupt=True)
        assert [e.begin for e in it] == [b for b in starts if b >= end]
        it = ReadUncommittedIter(s, J, _new, end_offset=mid, skip_corrupt=True)
        assert [e.begin for e in it] == [b for b in starts if b < begin]
        assert it.skipped == 1 and it.offset == begin


def test_a_damaged_fragment_leaves_the_journal_writable(tmp_path: Path) -> None:
    """Appends go on beside a damaged sealed fragment; a size mismatch is found
    even with verify_fragments=False."""
    root = tmp_path / "root"
    _publish_many(root, 20)
    victim = _sealed(root)[1]
    os.truncate(victim, 3)
    with LocalJournalStore(root, verify_fragments=False) as s:
        head = s.head(J)
        assert s.append(J, b'{"n": 7777}\n').result().begin == head
        with s.read(J, head) as r:
            assert r.read() == b'{"n": 7777}\n'
        with pytest.raises(CorruptJournalError, match="name says"):
            list(ReadUncommittedIter(s, J, _new))


# -- a damaged commit record ------------------------------------------------------------


def _flip_newest_slot(root: Path, name: str, field_offset: int = 20) -> None:
    commit = root.joinpath(*name.split("/"), COMMIT_FILE)
    raw = bytearray(commit.read_bytes())
    seqs = [int.from_bytes(raw[o + 4 : o + 12], "little") for o in (0, SLOT_SIZE)]
    raw[slot_offset(max(seqs)) + field_offset] ^= 0xFF
    commit.write_bytes(bytes(raw))


def test_damaged_newest_commit_record_quarantines_the_acknowledged_append(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The newest commit slot fails its checksum after its append was
    acknowledged: a warning names the journal and the byte range; the bytes are
    moved to a quarantine file beside the journal before the next append, which
    goes on after them instead of writing over them."""
    root = tmp_path / "root"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        s.append(J, b"first\n").result()
        assert s.append(J, b"second\n").result().end == 13  # acknowledged
    _flip_newest_slot(root, J)
    jdir = root / "dmg" / "j"
    with LocalJournalStore(root) as s, caplog.at_level(logging.WARNING, logger="journal"):
        assert s.head(J) == 6
        with s.read(J) as r:
            assert r.read() == b"first\n"
        assert any(J in m and "[6, 13)" in m for m in caplog.messages)
        caplog.clear()
        third = s.append(J, b"third\n").result()
        assert third.begin >= 13  # never over the acknowledged append's bytes
        assert any(J in m and "[6, 13)" in m and "quarantine" in m for m in caplog.messages)
        (kept,) = jdir.glob("@quarantine-*")
        assert kept.read_bytes() == b"second\n"
        caplog.clear()
        with s.read(J) as r:
            assert r.read() == b"first\nthird\n"
            assert r.offset == third.end
        assert any("quarantine" in m for m in caplog.messages)
    # Nothing more to say once the record is whole again.
    with LocalJournalStore(root) as s, caplog.at_level(logging.WARNING, logger="journal"):
        caplog.clear()
        s.append(J, b"fourth\n").result()
        assert not [m for m in caplog.messages if "damaged" in m and "commit" in m]
        assert len(list(jdir.glob("@quarantine-*"))) == 1


def test_damaged_older_commit_slot_hides_nothing_and_stays_quiet(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Damage to the older slot, and the garbage a killed writer leaves past the
    end: cut quietly, as a crash's leftovers always were."""
    root = tmp_path / "root"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        s.append(J, b"first\n").result()
        s.append(J, b"second\n").result()
    commit = root / "dmg" / "j" / COMMIT_FILE
    raw = bytearray(commit.read_bytes())
    seqs = [int.from_bytes(raw[o + 4 : o + 12], "little") for o in (0, SLOT_SIZE)]
    raw[slot_offset(min(seqs)) + 24] ^= 0xFF  # the older slot's end field
    commit.write_bytes(bytes(raw))
    (open_file,) = (root / "dmg" / "j").glob("@open-*")
    with open(open_file, "ab") as f:
        f.write(b"torn-unacknowledged")
    with LocalJournalStore(root) as s, caplog.at_level(logging.WARNING, logger="journal"):
        assert s.append(J, b"third\n").result().begin == 13
        assert not caplog.messages
        with s.read(J) as r:
            assert r.read() == b"first\nsecond\nthird\n"
    assert not list((root / "dmg" / "j").glob("@quarantine-*"))


def test_a_quarantine_interrupted_before_the_record_moved_is_finished(tmp_path: Path) -> None:
    """Bytes quarantined at the journal's end (a repair cut short) are never
    written over: the next writer goes on after them."""
    root = tmp_path / "root"
    with LocalJournalStore(root) as s:
        s.create(J, NDJSON)
        s.append(J, b"first\n").result()
    jdir = root / "dmg" / "j"
    (jdir / f"@quarantine-{6:016x}-{20:016x}-uncommitted").write_bytes(b"lost-but-kept\n")
    with LocalJournalStore(root) as s:
        assert s.append(J, b"next\n").result().begin == 20
        with s.read(J) as r:
            assert r.read() == b"first\nnext\n"


# -- links and temporary files -----------------------------------------------------------


def test_a_symlinked_directory_leading_out_of_the_root_is_not_followed(tmp_path: Path) -> None:
    """A link inside the root to a directory elsewhere: create, append, read and
    get refuse it, and nothing is written outside the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "link").symlink_to(outside, target_is_directory=True)
    with LocalJournalStore(root) as s:
        with pytest.raises(JournalError, match="symbolic link"):
            s.create("link/j", NDJSON)
        for call in (
            lambda: s.append("link/j", b"x\n"),
            lambda: s.read("link/j"),
            lambda: s.get("link/j"),
        ):
            with pytest.raises(JournalError):
                call()
        assert s.list() == []
    assert list(outside.iterdir()) == []
    # A journal made there by other means is not reached through the link either.
    with LocalJournalStore(outside) as other:
        other.create("j", NDJSON)
    with LocalJournalStore(root) as s:
        with pytest.raises(JournalError, match="symbolic link"):
            s.append("link/j", b"x\n")
        assert s.list() == []


def test_a_symlink_inside_the_root_to_the_root_is_followed(tmp_path: Path) -> None:
    """A link that stays inside the root is not refused."""
    root = tmp_path / "root"
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    with LocalJournalStore(root) as s:
        s.create("real/j", NDJSON)
        s.append("real/j", b"x\n").result()
        with pytest.raises(CorruptJournalError, match="another journal"):
            s.get("alias/j")  # the spec says whose directory it is


def test_temporary_files_are_created_exclusively(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file (or link) planted at a temporary file's name while the store
    writes is neither followed nor truncated: another name is taken."""
    import secrets

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    jdir = tmp_path / "root" / "j"
    planted: list[Path] = []

    def token_hex(_n: int | None = None) -> str:
        # A racing attacker plants links at the next names, once.
        if not planted:
            for base in ("@commit", "@spec.json"):
                link = jdir / f"@tmp-{base}-guessed"
                link.symlink_to(victim)
                planted.append(link)
            return "guessed"
        return os.urandom(8).hex()

    monkeypatch.setattr(secrets, "token_hex", token_hex)
    with LocalJournalStore(tmp_path / "root") as s:
        s.create("j", NDJSON)
        assert planted
        assert s.append("j", b"x\n").result().end == 2
        assert s.get("j").content_type == "application/x-ndjson"
    assert victim.read_bytes() == b"precious"


class _PerFrame:
    """A framing with only the Framing protocol's per-frame decoding."""

    content_type = "application/x-test-per-frame"

    def marshal(self, msg: object) -> bytes:
        from framing import framing_by_content_type

        return framing_by_content_type("application/x-ndjson").marshal(msg)

    def new_unmarshal_func(self, r: object) -> object:
        from framing import framing_by_content_type

        return framing_by_content_type("application/x-ndjson").new_unmarshal_func(r)  # type: ignore[arg-type]


def test_per_frame_framings_skip_damage_and_retention_with_true_offsets(tmp_path: Path) -> None:
    """A framing without bulk decoding: envelopes after a skipped damaged fragment,
    or after what retention removed, carry their real offsets."""
    from framing import register_framing

    register_framing(_PerFrame())  # type: ignore[arg-type]
    with LocalJournalStore(tmp_path, fragment_size=50) as s:
        s.create("pf", {"content-type": _PerFrame.content_type})
        ends = [s.append("pf", b'{"n": %d, "pad": "xxxxxxxxxxxxxx"}\n' % i).result()
                for i in range(10)]
        damaged = s.fragments("pf")[2]
        os.truncate(damaged.path, 3)
        it = ReadUncommittedIter(s, "pf", _new, skip_corrupt=True)
        got = [(e.begin, e.end, e.message["n"]) for e in it]
        assert got == [(r.begin, r.end, n) for n, r in enumerate(ends)
                       if not damaged.begin <= r.begin < damaged.end]
        assert it.skipped_ranges == [(damaged.begin, damaged.end)]
        s.trim("pf", before_offset=damaged.begin)
        got = [(e.begin, e.message["n"]) for e in ReadUncommittedIter(s, "pf", _new,
                                                                      skip_corrupt=True)]
        assert got == [(r.begin, n) for n, r in enumerate(ends) if r.begin >= damaged.end]


# -- missing fragments: readers, verify() and fsck agree ----------------------------------


@pytest.mark.usefixtures("read_loops")
def test_a_deleted_open_fragment_with_committed_bytes_is_named(tmp_path: Path) -> None:
    """The open fragment deleted by hand while it holds committed bytes:
    readers raise CorruptJournalError naming it and its offsets (with
    skip_corrupt, skip them), verify() raises the same, fsck finds it."""
    root = tmp_path / "root"
    _publish_many(root, 40)
    with LocalJournalStore(root) as s:
        frags = s.fragments(J)
    (open_frag,) = [f for f in frags if not f.sealed]
    os.unlink(open_frag.path)
    with LocalJournalStore(root) as s:
        for skip in (False, True):
            got: list[Envelope] = []
            it = ReadUncommittedIter(s, J, _new, skip_corrupt=skip)
            if skip:
                got.extend(it)
                assert it.skipped_ranges == [(open_frag.begin, open_frag.end)]
            else:
                with pytest.raises(CorruptJournalError) as info:
                    got.extend(it)
                assert info.value.path == open_frag.path
                assert (info.value.offset, info.value.end_offset) == (open_frag.begin,
                                                                      open_frag.end)
            it.close()
            assert got[-1].end == open_frag.begin  # everything before it
        with pytest.raises(CorruptJournalError) as info:
            s.verify(J)
        assert info.value.path == open_frag.path and "open fragment is missing" in str(info.value)
        (problem,) = s.check(J)
        assert problem.path == open_frag.path


def test_verify_finds_a_sealed_fragment_deleted_from_the_middle(tmp_path: Path) -> None:
    """A sealed fragment between kept ones removed by hand: verify() raises
    with its offsets, as readers and fsck do; once repaired (the loss
    recorded in quarantine) verify() passes."""
    root = tmp_path / "root"
    _publish_many(root, 40)
    victim = _sealed(root)[3]
    begin, end = _range(victim)
    os.unlink(victim)
    with LocalJournalStore(root) as s:
        with pytest.raises(CorruptJournalError) as info:
            s.verify(J)
        assert (info.value.offset, info.value.end_offset) == (begin, end)
        with pytest.raises(CorruptJournalError) as read_info:
            list(ReadUncommittedIter(s, J, _new))
        assert (read_info.value.offset, read_info.value.end_offset) == (begin, end)
        assert [(p.offset, p.end_offset) for p in s.check(J)] == [(begin, end)]
        s.check(J, repair=True)
        assert s.verify(J)
        assert s.check(J) == []
