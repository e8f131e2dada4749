"""Checking the files of a journal of a ``LocalJournalStore``, and repairing them.

``check_journal`` looks at every file of one journal directory: the commit
record (both slots), every sealed fragment (its size and SHA-1 against its
name, overlaps), the open fragment against the record, fragments missing
between kept ones, and files that do not belong. Each problem is one
``JournalProblem``.

With ``repair``, under the journal's lock, it makes the journal readable and
writable again while keeping every intact byte. Damaged bytes are moved to
quarantine files, never deleted: a file ``@quarantine-<begin>-<end>-<kind>``
stands for the offsets ``[begin, end)``, which readers then skip with a
warning; the journal's offsets are never given out twice, so a consumer's
checkpoint stays valid. In detail:

* a sealed fragment whose SHA-1 or batch checksums (journal/_local/sums.py) do
  not match: the batches that fail their checksum go to quarantine, every
  other batch stays readable in new sealed fragments (the whole file is
  kept as ``@quarantine-damaged-<name>``); without checksums to tell where
  the damage is, the whole fragment goes to quarantine;
* an open fragment with a batch that fails its checksum: sealed, then
  repaired as a sealed fragment;
* a sealed fragment cut short: what is left, up to its last whole frame,
  becomes a sealed fragment again; the rest goes to quarantine;
* an open fragment shorter than the committed bytes (the journal refused
  every append): the same, and the journal goes on after the committed end;
* a damaged commit slot: the bytes it may have covered go to quarantine
  (see ``recover``) and the slot is written again; no valid record at all:
  it is rebuilt from the fragment files;
* fragments missing between kept ones: an empty quarantine file records the
  loss, so that readers skip it with a warning instead of failing;
* files that do not belong, and fragments that another one covers: moved
  aside to ``@quarantine-<kind>-<name>`` files.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from dataclasses import dataclass
from typing import Final

from .._errors import CorruptJournalError, JournalError
from .._spec import JournalSpec, sealed_name
from ..durable import fsync_dir
from .files import (
    O_CLOEXEC,
    O_NOFOLLOW,
    JournalDir,
    Quarantined,
    fragment_sha1,
    locked,
    open_commit,
    quarantine_copy,
    quarantine_file,
    read_spec,
    read_start,
    read_sums,
    recover,
    remove_sums,
    seal,
    unused_name,
    write_atomically,
    write_sums,
)
from .fragment import (
    COMMIT_FILE,
    QUARANTINE_PREFIX,
    RECORD_SIZE,
    SLOT_SIZE,
    SPEC_FILE,
    CommitRecord,
    damaged_slot,
    frame_cut,
    open_name,
    pack_slot,
    parse_record,
    quarantine_name,
    slot_offset,
)
from .listing import Listing, Piece, list_files, read_commit_file
from .salvage import copy_to, marker, pieces, write_sealed
from .sums import Batch, bad_batches, log_batches, unchecked

# A name component is at most 255 bytes: quarantined foreign names are cut.
_MAX_NAME: Final = 240
# Listings retried while writers seal (each retry follows a seal).
_ATTEMPTS: Final = 20


@dataclass(frozen=True, slots=True)
class JournalProblem:
    """One problem found in a journal's files.

    ``path`` is the file at fault (None when the problem is a missing
    piece), ``[offset, end_offset)`` the journal offsets concerned when
    known, ``reason`` what is wrong, and ``repair`` what a repair did about
    it (None: not repaired)."""

    journal: str
    path: str | None
    offset: int | None
    end_offset: int | None
    reason: str
    repair: str | None = None

    def __str__(self) -> str:
        parts = [f"journal {self.journal}"]
        if self.path is not None:
            parts.append(os.path.basename(self.path))
        if self.offset is not None and self.end_offset is not None:
            parts.append(f"offsets [{self.offset}, {self.end_offset})")
        line = ": ".join([*parts, self.reason])
        return line if self.repair is None else f"{line}; repaired: {self.repair}"


class _Checker:
    def __init__(self, jd: JournalDir, repair: bool) -> None:
        self.jd = jd
        self.repair = repair
        self.problems: list[JournalProblem] = []
        self.spec: JournalSpec | None = None
        self.record_problem: int | None = None  # index of the commit record's problem

    def problem(
        self,
        base: str | None,
        reason: str,
        offset: int | None = None,
        end_offset: int | None = None,
        repair: str | None = None,
    ) -> None:
        path = self.jd.file(base) if base is not None else None
        self.problems.append(
            JournalProblem(self.jd.name, path, offset, end_offset, reason, repair)
        )

    # -- the steps ------------------------------------------------------------

    def run(self) -> list[JournalProblem]:
        try:
            self.spec = read_spec(self.jd)
        except CorruptJournalError as exc:
            self.problem(SPEC_FILE, exc.reason + " (not repaired: its labels are unknown)")
        # Without the lock, writers may seal meanwhile: a listing is taken
        # between two reads of the record that agree on the open fragment.
        for _ in range(_ATTEMPTS):
            raw = read_commit_file(self.jd)
            listing = list_files(self.jd)
            if self.repair or _open_begin(raw) == _open_begin(read_commit_file(self.jd)):
                break
        self.foreign(listing)
        rec = self.record(raw)
        if rec is not None and raw is not None and self.open_batches(listing, raw, rec):
            # Sealed for repair: look again.
            raw = read_commit_file(self.jd)
            listing = list_files(self.jd)
            rec = parse_record(raw) if raw is not None else None
        self.sealed(listing)
        rec = self.overlaps(listing, rec)
        rec = self.open_fragment(listing, rec) if rec is not None else self.rebuild(listing)
        if rec is not None:
            self.gaps(listing, rec)
        if self.repair:
            self.finish()
        return self.problems

    def foreign(self, listing: Listing) -> None:
        for base in listing.foreign:
            repair = None
            if self.repair:
                name = f"{QUARANTINE_PREFIX}foreign-{base}"[:_MAX_NAME]
                repair = "moved to " + os.path.basename(quarantine_file(self.jd, base, name))
            self.problem(base, "a file that does not belong in a journal directory", repair=repair)

    def record(self, raw: bytes | None) -> CommitRecord | None:
        if raw is None:
            self.record_problem = len(self.problems)
            self.problem(COMMIT_FILE, "the commit record is missing")
            return None
        rec = parse_record(raw)
        if rec is None:
            self.record_problem = len(self.problems)
            self.problem(COMMIT_FILE, "neither slot of the commit record is valid")
        elif damaged_slot(raw, rec):
            # recover() (in finish) quarantines what the slot may have covered.
            slot = 1 - slot_offset(rec.seq) // SLOT_SIZE
            self.problem(
                COMMIT_FILE,
                f"slot {slot} of the commit record is damaged: it may have covered bytes"
                f" past {rec.end}",
                repair="written again; bytes it may have covered moved to quarantine"
                if self.repair else None,
            )
        return rec

    def open_batches(self, listing: Listing, raw: bytes, rec: CommitRecord) -> bool:
        """Check the open fragment's batches against their checksums. With
        ``repair``, a fragment with a damaged batch is sealed (the sealed
        fragments' step repairs it): returns True then."""
        base = listing.opens.get(rec.begin)
        batches = log_batches(raw, RECORD_SIZE, rec.begin, rec.end)
        if base is None or not batches:
            return False
        try:
            fd = os.open(self.jd.file(base), os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
        except FileNotFoundError:
            return False  # Sealed since listed (a check holds no lock).
        try:
            if os.fstat(fd).st_size < rec.end - rec.begin:
                return False  # Cut short: the open fragment's step says so.
            bad = bad_batches(fd, rec.begin, batches)
        finally:
            os.close(fd)
        if not bad:
            return False
        if not self.repair:
            for b in bad:
                self.problem(base, _BAD_BATCH, b.begin, b.end)
            return False
        commit_fd = open_commit(self.jd, write=True)
        try:
            now, open_fd = recover(self.jd, commit_fd)
            if open_fd is not None:
                try:
                    if now.end > now.begin:
                        seal(self.jd, commit_fd, open_fd, now)
                finally:
                    os.close(open_fd)
        finally:
            os.close(commit_fd)
        return True

    def sealed(self, listing: Listing) -> None:
        split: list[Piece] = []  # Pieces of fragments repaired batch by batch.
        for p in listing.sealed:
            want = p.end - p.begin
            path = self.jd.file(p.base)
            try:
                fd = os.open(path, os.O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
            except FileNotFoundError:
                p.good = False
                continue
            try:
                if p.size == want:
                    sha_ok = fragment_sha1(fd, want) == p.sha1
                    batches = read_sums(self.jd, p.begin, p.end)
                    bad = [(b.begin, b.end) for b in bad_batches(fd, p.begin, batches)]
                    if sha_ok and not bad:
                        continue
                    reason = _BAD_BATCH
                    if not bad and batches:
                        # The SHA-1 fails, every checked batch verifies: the
                        # damage is in what no checksum covers.
                        bad = unchecked(batches, p.begin, p.end)
                        reason = _BAD_UNCHECKED
                    if bad:
                        p.good = False
                        split.extend(self.damaged_batches(p, fd, batches, bad, reason))
                        continue
                p.good = False
                if p.size < want:
                    self.truncated_fragment(p, fd)
                elif p.size > want and fragment_sha1(fd, want) == p.sha1:
                    self.overlong_fragment(p, fd)
                else:
                    what = (
                        f"fragment holds {p.size} bytes, its name says {want}"
                        if p.size != want
                        else "fragment content does not match the SHA-1 in its name"
                    )
                    repair = None
                    if self.repair:
                        q = quarantine_file(
                            self.jd, p.base, quarantine_name(p.begin, p.end, "fragment")
                        )
                        repair = f"moved to {os.path.basename(q)}"
                    self.problem(p.base, what, p.begin, p.end, repair)
            finally:
                os.close(fd)
        if self.repair:
            listing.sealed = sorted(
                [p for p in listing.sealed if p.good] + split, key=lambda p: (p.begin, p.end)
            )
            listing.quarantined = list_files(self.jd).quarantined

    def damaged_batches(
        self, p: Piece, fd: int, batches: list[Batch], bad: list[tuple[int, int]], reason: str
    ) -> list[Piece]:
        """A sealed fragment (``fd``) with damaged batches ``bad``: report each;
        with ``repair``, quarantine them and keep the rest in new sealed
        fragments (returned). Every offset stays held throughout: the file
        first goes to quarantine whole, and leaves it (renamed, standing for
        no offsets) once its pieces are in place."""
        kept: list[Piece] = []
        repair = None
        if self.repair:
            whole = quarantine_file(self.jd, p.base, quarantine_name(p.begin, p.end, "fragment"))
            moved = []
            for begin, end, damaged in pieces(p.begin, p.end, bad):
                if damaged:
                    q = quarantine_copy(
                        self.jd, fd, begin - p.begin, end - p.begin, begin, end, "batch"
                    )
                    moved.append(os.path.basename(q))
                    continue
                data = os.pread(fd, end - begin, begin - p.begin)
                mine = [b for b in batches if begin <= b.begin and b.end <= end]
                name = write_sealed(self.jd, begin, data, mine)
                kept.append(Piece(begin, end, name, b"", end - begin))
            os.rename(whole, unused_name(self.jd, f"{QUARANTINE_PREFIX}damaged-{p.base}"))
            remove_sums(self.jd, p.begin, p.end)
            fsync_dir(self.jd.path)
            held = ", ".join(f"[{k.begin}, {k.end})" for k in kept) or "nothing"
            repair = f"moved to {{}}; {held} kept in {len(kept)} fragment(s)"
            for (begin, end), q in zip(bad, moved, strict=True):
                self.problem(p.base, reason, begin, end, repair.format(q))
            return kept
        for begin, end in bad:
            self.problem(p.base, reason, begin, end)
        return kept

    def truncated_fragment(self, p: Piece, fd: int) -> None:
        """A sealed fragment cut short: keep its whole frames, quarantine the rest."""
        want, orig, size = p.end - p.begin, p.base, p.size
        repair = None
        if self.repair:
            data = os.pread(fd, size, 0)
            cut = frame_cut(self.spec, data)
            q = quarantine_copy(self.jd, fd, cut, size, p.begin + cut, p.end, "fragment")
            kept = ""
            if cut:
                mine = [b for b in read_sums(self.jd, p.begin, p.end) if b.end <= p.begin + cut]
                name = write_sealed(self.jd, p.begin, data[:cut], mine)
                remove_sums(self.jd, p.begin, p.end)
                kept = f"[{p.begin}, {p.begin + cut}) kept in {name}; "
                p.good = True
                p.end, p.base, p.size = p.begin + cut, name, cut
            os.unlink(self.jd.file(orig))
            fsync_dir(self.jd.path)
            repair = f"{kept}[{p.begin + cut}, {p.begin + want}) moved to {os.path.basename(q)}"
        self.problem(
            orig,
            f"fragment holds {size} bytes, its name says {want} (cut short)",
            p.begin + min(size, want),
            p.begin + want,
            repair,
        )

    def overlong_fragment(self, p: Piece, fd: int) -> None:
        """A sealed fragment with bytes after its content (which is intact)."""
        want = p.end - p.begin
        repair = None
        if self.repair:
            name = unused_name(self.jd, f"{QUARANTINE_PREFIX}extra-{p.base}")
            copy_to(self.jd, fd, want, p.size, name)
            os.truncate(self.jd.file(p.base), want)
            fsync_dir(self.jd.path)
            p.good, p.size = True, want
            repair = f"the {p.size - want} bytes after its content moved to" + (
                f" {os.path.basename(name)}"
            )
        self.problem(
            p.base, f"fragment holds {p.size} bytes, its name says {want}", p.begin, p.end, repair
        )

    def overlaps(self, listing: Listing, rec: CommitRecord | None) -> CommitRecord | None:
        """Sealed fragments overlapping (whole copies both): keep every byte
        readable once. Returns the record, None if it is behind the fragments."""
        kept: list[Piece] = []
        for p in listing.sealed:
            if not p.good:
                continue
            if kept and p.begin < kept[-1].end:
                a = kept[-1]
                reason = f"fragment overlaps {a.base}"
                repair = None
                if p.end <= a.end:
                    if self.repair:
                        q = quarantine_file(self.jd, p.base, f"{QUARANTINE_PREFIX}overlap-{p.base}")
                        repair = f"{a.base} holds its bytes; moved to {os.path.basename(q)}"
                    self.problem(p.base, reason, p.begin, p.end, repair)
                    continue
                orig = p
                if self.repair:
                    with open(self.jd.file(p.base), "rb") as f:
                        data = f.read()
                    name = write_sealed(self.jd, a.end, data[a.end - p.begin :])
                    q = quarantine_file(self.jd, p.base, f"{QUARANTINE_PREFIX}overlap-{p.base}")
                    repair = f"its bytes past {a.end} kept in {name}; moved to" + (
                        f" {os.path.basename(q)}"
                    )
                    p = Piece(a.end, p.end, name, b"", p.end - a.end)
                self.problem(orig.base, reason, orig.begin, orig.end, repair)
            kept.append(p)
        # Without repair, damaged fragments (reported already) still hold their offsets.
        listing.sealed = sorted(
            kept + [p for p in listing.sealed if not p.good], key=lambda p: (p.begin, p.end)
        )
        if rec is not None and kept and kept[-1].end > rec.end:
            self.record_problem = len(self.problems)
            self.problem(
                COMMIT_FILE,
                f"the commit record (committed through {rec.end}) is behind the sealed"
                f" fragments (through {kept[-1].end})",
            )
            return None
        return rec

    def open_fragment(self, listing: Listing, rec: CommitRecord) -> CommitRecord:
        for begin, base in sorted(listing.opens.items()):
            if begin == rec.begin:
                continue
            repair = None
            if self.repair:
                q = quarantine_file(self.jd, base, f"{QUARANTINE_PREFIX}stray-{base}")
                repair = f"moved to {os.path.basename(q)}"
            self.problem(
                base,
                f"an open fragment that does not match the commit record (which has it at"
                f" {rec.begin})",
                repair=repair,
            )
        committed = rec.end - rec.begin
        base = open_name(rec.begin)
        if rec.begin not in listing.opens:
            # Sealed, and the record not yet updated (a crash, or a writer at work).
            sealed_done = any(p.begin == rec.begin and p.end >= rec.end for p in listing.sealed)
            covered = _through(listing.quarantined, rec.begin) >= rec.end
            if committed and not sealed_done and not covered:
                repair = None
                if self.repair:
                    q = marker(self.jd, rec.begin, rec.end)
                    repair = f"the loss recorded in {q}; the journal goes on at {rec.end}"
                self.problem(
                    base, f"missing, yet [{rec.begin}, {rec.end}) is committed",
                    rec.begin, rec.end, repair,
                )
            return rec
        path = self.jd.file(base)
        try:
            size = os.stat(path, follow_symlinks=False).st_size
        except FileNotFoundError:
            return rec  # sealed since listed (a check holds no lock)
        if size >= committed:
            return rec
        repair = None
        if self.repair:
            fd = os.open(path, os.O_RDWR | O_CLOEXEC | O_NOFOLLOW)
            try:
                data = os.pread(fd, size, 0)
                cut = frame_cut(self.spec, data)
                q = quarantine_copy(self.jd, fd, cut, size, rec.begin + cut, rec.end, "open")
                os.ftruncate(fd, cut)
                os.fdatasync(fd)
                kept = ""
                if cut:
                    name = sealed_name(rec.begin, rec.begin + cut, hashlib.sha1(
                        data[:cut], usedforsecurity=False).digest())
                    raw = read_commit_file(self.jd) or b""
                    mine = log_batches(raw, RECORD_SIZE, rec.begin, rec.begin + cut)
                    write_sums(self.jd, rec.begin, rec.begin + cut, mine)
                    os.rename(path, self.jd.file(name))
                    kept = f"[{rec.begin}, {rec.begin + cut}) kept in {name}; "
                    listing.sealed.append(Piece(rec.begin, rec.begin + cut, name, b"", cut))
                else:
                    os.unlink(path)
                fsync_dir(self.jd.path)
            finally:
                os.close(fd)
            repair = (
                f"{kept}[{rec.begin + cut}, {rec.end}) moved to {os.path.basename(q)};"
                f" the journal goes on at {rec.end}"
            )
        self.problem(
            base if repair is None else None,
            f"open fragment holds {size} bytes, fewer than the {committed} committed;"
            " the journal refuses appends",
            rec.begin + size,
            rec.end,
            repair,
        )
        return rec

    def rebuild(self, listing: Listing) -> CommitRecord | None:
        """No valid commit record (or one behind the fragments): make one from
        the files. The open fragment's whole frames count as committed."""
        if not self.repair:
            return None
        end = max([p.end for p in listing.sealed] + [q.end for q in listing.quarantined] + [0])
        begin, committed = end, 0
        for at, base in sorted(listing.opens.items()):
            path = self.jd.file(base)
            if at < end:
                quarantine_file(self.jd, base, f"{QUARANTINE_PREFIX}stray-{base}")
                continue
            with open(path, "rb") as f:
                data = f.read()
            cut = frame_cut(self.spec, data)
            if cut < len(data):
                fd = os.open(path, os.O_RDWR | O_CLOEXEC | O_NOFOLLOW)
                try:
                    quarantine_copy(self.jd, fd, cut, len(data), at + cut, at + len(data),
                                    "uncommitted")
                finally:
                    os.close(fd)
            if at > end:
                marker(self.jd, end, at)
            begin, committed = at, cut
            break
        listing.quarantined = list_files(self.jd).quarantined  # what was just set aside
        rec = CommitRecord(1, begin, begin + committed)
        body = bytearray(RECORD_SIZE)
        body[slot_offset(rec.seq) : slot_offset(rec.seq) + SLOT_SIZE] = pack_slot(rec)
        write_atomically(self.jd, COMMIT_FILE, bytes(body))
        if self.record_problem is not None:
            self.problems[self.record_problem] = _with_repair(
                self.problems[self.record_problem],
                f"rebuilt from the files: open fragment at {rec.begin}, committed through"
                f" {rec.end}",
            )
        return rec

    def gaps(self, listing: Listing, rec: CommitRecord) -> None:
        """Offsets that nothing holds (not even quarantine), from the journal's
        recorded start on (without one, from the first kept fragment on)."""
        # Without repair, a damaged fragment (reported already) still holds its offsets.
        held = sorted((p.begin, p.end) for p in listing.sealed if p.good or not self.repair)
        if rec.end > rec.begin:
            held.append((rec.begin, rec.end))
        start = read_start(self.jd)
        if start is not None:
            pos = start
        elif held:
            pos = held[0][0]
        else:
            return
        first = held[0][0] if held else rec.begin
        for begin, end in [*held, (rec.begin, rec.begin)]:
            while begin > pos:
                through = _through(listing.quarantined, pos)
                if through > pos:
                    pos = through
                    continue
                stop = min([begin] + [q.begin for q in listing.quarantined if q.begin > pos])
                repair = None
                if self.repair:
                    repair = f"the loss recorded in {marker(self.jd, pos, stop)}"
                self.problem(
                    None,
                    "no fragment holds these offsets, but earlier ones are kept (a fragment"
                    " file is missing)" if pos >= first else
                    f"no fragment holds these offsets, at or above the journal's recorded start"
                    f" ({start}): a fragment file is missing, not removed by retention",
                    pos,
                    stop,
                    repair,
                )
                pos = stop
            pos = max(pos, end)

    def finish(self) -> None:
        """Let recovery do the rest (under the lock we hold): bytes a damaged
        slot may have covered, and going on past what is now in quarantine."""
        try:
            fd = open_commit(self.jd, write=True)
        except JournalError as exc:
            self.problem(COMMIT_FILE, f"not repaired: {exc}")
            return
        try:
            _, open_fd = recover(self.jd, fd)
            if open_fd is not None:
                os.close(open_fd)
        except (JournalError, OSError) as exc:
            self.problem(COMMIT_FILE, f"not repaired: {exc}")
        finally:
            os.close(fd)
        # Checksums of fragments no longer there (moved to quarantine, or a
        # trim that crashed) are worth nothing.
        listing = list_files(self.jd)
        fragments = {(p.begin, p.end) for p in listing.sealed}
        for at_end, base in listing.sums.items():
            if at_end not in fragments:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.jd.file(base))


def _open_begin(raw: bytes | None) -> int | None:
    rec = parse_record(raw) if raw is not None else None
    return rec.begin if rec is not None else None


def _with_repair(p: JournalProblem, repair: str) -> JournalProblem:
    return JournalProblem(p.journal, p.path, p.offset, p.end_offset, p.reason, repair)


def _through(quarantined: list[Quarantined], offset: int) -> int:
    pos = offset
    for q in quarantined:
        if q.begin <= pos < q.end:
            pos = q.end
    return pos


_BAD_BATCH: Final = "a batch of appends does not match its checksum (changed in place)"
_BAD_UNCHECKED: Final = (
    "fragment content does not match the SHA-1 in its name, and these offsets, which no"
    " batch checksum covers, hold the damage"
)


def check_journal(jd: JournalDir, *, repair: bool = False) -> list[JournalProblem]:
    """Every problem of the journal's files (see the module docstring); with
    ``repair``, repaired under the journal's lock."""
    if not repair:
        # Without the lock, a writer sealing meanwhile can make a listing miss
        # a file being renamed: a problem is reported once two checks agree.
        problems = _Checker(jd, False).run()
        for _ in range(_ATTEMPTS):
            if not problems:
                break
            time.sleep(0.01)
            again = _Checker(jd, False).run()
            if again == problems:
                break
            problems = again
        return problems
    with locked(jd):
        return _Checker(jd, True).run()
