"""``exactly fsck`` and ``LocalJournalStore.check``: damaged stores found, one line a
problem, and repaired keeping every intact byte (damaged pieces in quarantine).

Damage is done to real files: truncated, bytes flipped, files removed, records
broken. Commands run as a user runs them, in subprocesses.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from journal import JournalError, JournalProblem, LocalJournalStore, MemoryJournalClient
from message import JsonDocument, ReadCommittedIter

NDJSON = {"content-type": "application/x-ndjson"}


def run(root: Path, *args: str, input: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "exactly", *args, "--root", str(root)],
        input=input, capture_output=True, text=True, timeout=120,
    )


def _doc(i: int) -> bytes:
    return b'{"n": %d, "pad": "xxxxxxxxxxxxxxx"}\n' % i


def _journal(root: Path, name: str, n: int, fragment_size: int = 100) -> list[tuple[int, int]]:
    """``n`` 35-byte documents; returns their (begin, end)."""
    with LocalJournalStore(root, fragment_size=fragment_size) as s:
        s.create(name, NDJSON)
        out = [s.append(name, _doc(i)).result() for i in range(n)]
    return [(r.begin, r.end) for r in out]


def _numbers(root: Path, name: str) -> list[int]:
    with LocalJournalStore(root) as s:
        return [e.message["n"] for e in ReadCommittedIter(s, name, lambda _s: JsonDocument())]


def _jdir(root: Path, name: str) -> Path:
    return root.joinpath(*name.split("/"))


def test_truncated_open_fragment_is_found_and_repaired(tmp_path: Path) -> None:
    """An open fragment cut short refuses every append. fsck names journal, file
    and offsets in one line (status 1); --repair keeps its whole frames, moves the
    rest to quarantine, and the journal reads and takes appends again."""
    root = tmp_path / "store"
    _journal(root, "a/j", 5, fragment_size=1 << 20)
    (open_file,) = _jdir(root, "a/j").glob("@open-*")
    original = open_file.read_bytes()
    os.truncate(open_file, 35 * 3 + 10)  # three whole documents and a piece of one
    r = run(root, "append", "a/j", input='{"n": 99}\n')
    assert r.returncode == 1 and "fsck --repair" in r.stderr

    r = run(root, "fsck")
    assert r.returncode == 1
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("journal a/j")]
    assert open_file.name in line and "[115, 175)" in line and "fewer than the 175" in line
    assert open_file.exists() and open_file.stat().st_size == 115  # a check changes nothing

    r = run(root, "fsck", "--repair")  # everything repaired: status 0, and it says so
    assert r.returncode == 0, r.stdout
    assert r.stdout.splitlines()[-1] == (
        "checked 1 journal: 1 problem found, 1 repaired, nothing left to repair")
    (kept,) = _jdir(root, "a/j").glob("@quarantine-*")
    assert kept.read_bytes() == original[105:115]  # what was left of the piece: kept
    r = run(root, "fsck")
    assert r.returncode == 0, r.stdout
    assert "checked 1 journal: no problem found" in r.stdout

    assert run(root, "append", "a/j", input='{"n": 99}\n').returncode == 0
    assert _numbers(root, "a/j") == [0, 1, 2, 99]
    with LocalJournalStore(root) as s:
        assert s.head("a/j") > 175  # offsets are never given out twice


@pytest.mark.parametrize("cut", [0, 35, 50])
def test_repaired_open_fragment_cut_anywhere(tmp_path: Path, cut: int) -> None:
    """Whatever the cut, the repaired journal reads its whole frames and appends after them."""
    root = tmp_path / "store"
    _journal(root, "j", 3, fragment_size=1 << 20)
    (open_file,) = _jdir(root, "j").glob("@open-*")
    os.truncate(open_file, cut)
    with LocalJournalStore(root) as s:
        problems = s.check("j", repair=True)
        assert len(problems) == 1 and problems[0].repair is not None
        assert s.check("j") == []
        assert s.append("j", _doc(7)).result().begin == 105
    assert _numbers(root, "j") == [*range(cut // 35), 7]


def test_damaged_sealed_fragments_missing_ones_and_foreign_files(tmp_path: Path) -> None:
    """A fragment cut short, one with a flipped byte, one removed and a foreign
    file: one line each; --repair leaves a journal that reads everything intact
    (no skip_corrupt needed) and takes appends, with nothing deleted."""
    root = tmp_path / "store"
    _journal(root, "a/j", 30)
    jdir = _jdir(root, "a/j")
    frags = sorted(jdir.glob("*.raw"))
    cut_short, flipped, removed = frags[1], frags[3], frags[5]
    short_bytes = cut_short.read_bytes()[:50]
    os.truncate(cut_short, 50)
    data = bytearray(flipped.read_bytes())
    data[5] ^= 1
    flipped.write_bytes(bytes(data))
    removed.unlink()
    (jdir / "notes.txt").write_text("hello")

    r = run(root, "fsck")
    assert r.returncode == 1
    lines = [x for x in r.stdout.splitlines() if x.startswith("journal a/j")]
    assert len(lines) == 4, r.stdout
    assert any("notes.txt" in x for x in lines)
    assert any(cut_short.name in x and "[155, 210)" in x for x in lines)
    # The flipped byte is in the fragment's first batch (one append): only it is damaged.
    assert any(flipped.name in x and "checksum" in x and "[315, 350)" in x for x in lines)
    assert any("[530, 638)" in x and "missing" in x for x in lines)

    r = run(root, "fsck", "--repair")
    assert r.returncode == 0 and "4 repaired, nothing left to repair" in r.stdout, r.stdout
    assert run(root, "fsck").returncode == 0
    lost = {4, 5} | {9} | {15, 16, 17}  # in the damaged batches and the missing fragment
    assert _numbers(root, "a/j") == [n for n in range(30) if n not in lost]
    quarantined = {p.name: p for p in jdir.glob("@quarantine-*")}
    assert (jdir / "@quarantine-foreign-notes.txt").read_text() == "hello"
    assert bytes(data) in [p.read_bytes() for p in quarantined.values()]
    assert short_bytes[35:] in [p.read_bytes() for p in quarantined.values()]
    with LocalJournalStore(root) as s:
        head = s.head("a/j")
        assert s.append("a/j", _doc(100)).result().begin == head


def test_commit_record_missing_damaged_or_gone_bad(tmp_path: Path) -> None:
    """A missing record, a record with no valid slot, a damaged newest slot over
    an acknowledged append: found; repaired; the acknowledged bytes kept."""
    root = tmp_path / "store"
    for name in ("r/missing", "r/both", "r/slot"):
        _journal(root, name, 4, fragment_size=1 << 20)
    os.unlink(_jdir(root, "r/missing") / "@commit")
    both = _jdir(root, "r/both") / "@commit"
    raw = bytearray(both.read_bytes())
    raw[0] ^= 1
    raw[32] ^= 1
    both.write_bytes(bytes(raw))
    slot = _jdir(root, "r/slot") / "@commit"
    raw = bytearray(slot.read_bytes())
    seqs = [int.from_bytes(raw[o + 4 : o + 12], "little") for o in (0, 32)]
    raw[(0 if seqs[0] > seqs[1] else 32) + 28] ^= 1  # the newest slot's checksum
    slot.write_bytes(bytes(raw))

    r = run(root, "fsck")
    assert r.returncode == 1
    assert "journal r/missing: @commit: the commit record is missing" in r.stdout
    assert "journal r/both: @commit: neither slot" in r.stdout
    assert "journal r/slot: @commit: slot" in r.stdout and "damaged" in r.stdout
    assert run(root, "fsck", "--repair").returncode == 0
    assert run(root, "fsck").returncode == 0
    assert _numbers(root, "r/missing") == [0, 1, 2, 3]
    assert _numbers(root, "r/both") == [0, 1, 2, 3]
    assert _numbers(root, "r/slot") == [0, 1, 2]  # the fourth is in quarantine
    (kept,) = _jdir(root, "r/slot").glob("@quarantine-*")
    assert kept.read_bytes() == _doc(3)
    for name in ("r/missing", "r/both", "r/slot"):
        assert run(root, "append", name, input='{"n": 9}\n').returncode == 0


def test_fsck_names_journals_and_takes_root_after_the_subcommand(tmp_path: Path) -> None:
    """Only the journals named are checked; an unknown one is a problem; a
    healthy store is status 0."""
    root = tmp_path / "store"
    _journal(root, "ok/a", 3)
    _journal(root, "ok/b", 3)
    r = run(root, "fsck")
    assert r.returncode == 0 and "checked 2 journals: no problem found" in r.stdout
    r = run(root, "fsck", "ok/a")
    assert r.returncode == 0 and "checked 1 journal:" in r.stdout
    r = run(root, "fsck", "ok/nope")
    assert r.returncode == 1 and "ok/nope" in r.stdout
    # A journal whose spec is lost is a problem (invisible to every other
    # command), left for `journals create` to take back, never removed.
    (root / "ok" / "b" / "@spec.json").unlink()
    r = run(root, "fsck", "--repair")
    assert r.returncode == 1
    assert "journal ok/b: its files are here but not its spec" in r.stdout, r.stdout
    assert r.stdout.splitlines()[-1].endswith("1 left unrepaired")
    assert run(root, "journals", "create", "ok/b").returncode == 0
    assert run(root, "fsck").returncode == 0
    assert len(run(root, "read", "ok/b").stdout.splitlines()) == 3


def test_undecodable_frames_are_reported_with_their_offsets(tmp_path: Path) -> None:
    """A frame that does not decode is a problem of what readers see: one line
    with journal and offset (not repaired: the bytes are intact)."""
    root = tmp_path / "store"
    ends = _journal(root, "f/j", 3)
    with LocalJournalStore(root) as s:
        s.append("f/j", b"not json\n").result()
    r = run(root, "fsck", "--repair")
    assert r.returncode == 1  # still there: the frame is not the store's to change
    assert r.stdout.splitlines()[-1].endswith("0 repaired, 1 left unrepaired")
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("journal f/j")]
    assert f"offsets [{ends[-1][1]}, {ends[-1][1] + 9})" in line and "decode" in line
    assert line.startswith("journal f/j: @open-")  # the file that holds it


def test_journals_list_shows_the_others_beside_a_damaged_one(tmp_path: Path) -> None:
    """A journal whose record is gone does not hide the others from `journals list`."""
    root = tmp_path / "store"
    _journal(root, "l/bad", 1)
    _journal(root, "l/good", 1)
    os.unlink(_jdir(root, "l/bad") / "@commit")
    r = run(root, "journals", "list")
    assert r.returncode == 1
    assert "l/good" in r.stdout and "l/bad" in r.stdout and "fsck" in r.stderr


def test_check_of_the_library_and_read_check_of_any_client(tmp_path: Path) -> None:
    """LocalJournalStore.check returns JournalProblems (empty when healthy); the
    read check works on any JournalClient, here the in-memory one."""
    from exactly._fsck import check_readable

    root = tmp_path / "store"
    _journal(root, "c/j", 6)
    with LocalJournalStore(root) as s:
        assert s.check("c/j") == [] and s.quarantined("c/j") == []
        victim = s.fragments("c/j")[1]
        os.truncate(victim.path, 1)
        (p,) = s.check("c/j")
        assert isinstance(p, JournalProblem)
        assert (p.journal, p.path, p.offset, p.end_offset) == ("c/j", victim.path, 106, 210)
        assert str(p).startswith("journal c/j: ") and p.repair is None
        with pytest.raises(JournalError):
            s.check("c/none")
    with MemoryJournalClient() as client:
        client.create("m/j", NDJSON)
        client.append("m/j", _doc(1)).result()
        client.append("m/j", b"{broken\n").result()
        (p,) = check_readable(client, "m/j")
        assert (p.journal, p.offset, p.end_offset) == ("m/j", 35, 43)


def test_a_record_rebuilt_past_a_missing_piece_records_the_loss_once(tmp_path: Path) -> None:
    """No valid record, and the open fragment begins after a gap: the record is
    rebuilt at the open fragment, the gap recorded once; a second check is clean."""
    root = tmp_path / "store"
    _journal(root, "g/j", 7)  # sealed [0, 105), [105, 210); open [210, 245)
    jdir = _jdir(root, "g/j")
    frags = sorted(jdir.glob("*.raw"))
    frags[-1].unlink()  # the last sealed fragment, right before the open one
    os.unlink(jdir / "@commit")
    with LocalJournalStore(root) as s:
        problems = s.check("g/j", repair=True)
        assert [p.repair is not None for p in problems] == [True] * len(problems)
        assert len([p for p in s.quarantined("g/j") if "missing" in p]) == 1
        assert s.check("g/j") == []
        assert s.append("g/j", _doc(9)).result().begin == 245
    assert _numbers(root, "g/j") == [0, 1, 2, 6, 9]


def test_check_beside_a_busy_writer_finds_nothing(tmp_path: Path) -> None:
    """A check takes no lock: appends and seals happening meanwhile are not problems."""
    import threading
    import time

    root = tmp_path / "store"
    _journal(root, "busy/j", 1, fragment_size=200)
    stop = threading.Event()

    def write() -> None:
        with LocalJournalStore(root, fragment_size=200) as s:
            i = 0
            while not stop.is_set():
                s.append("busy/j", _doc(i)).result()
                i += 1

    writer = threading.Thread(target=write)
    writer.start()
    try:
        deadline = time.monotonic() + 2.0
        checks = 0
        with LocalJournalStore(root) as s:
            while time.monotonic() < deadline:
                assert s.check("busy/j") == []
                checks += 1
    finally:
        stop.set()
        writer.join()
    assert checks > 5


def test_long_checks_say_how_far_they_are(tmp_path: Path) -> None:
    """Without a terminal, a long fsck prints a progress line every few
    seconds (EXACTLY_PROGRESS_EVERY here makes it every millisecond) on
    stderr; its report on stdout is unchanged."""
    root = tmp_path / "store"
    with LocalJournalStore(root) as s:
        s.create("big/j", {"content-type": "application/x-ndjson"})
        for i in range(5000):
            s.append("big/j", _doc(i))
        s.flush()
    env = {**os.environ, "EXACTLY_PROGRESS_EVERY": "0.001"}
    r = subprocess.run([sys.executable, "-m", "exactly", "--root", str(root), "fsck"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "checked 1 journal: no problem found"
    assert "reading big/j, frames: " in r.stderr and "so far" in r.stderr
    quiet = run(root, "fsck")
    assert quiet.returncode == 0 and "so far" not in quiet.stderr
