"""Where a store's journals live on disk: a journal's name to its
directory (checked: valid components, no link out of the root), the
directories below a root that may be journals', and the files in one that
hold a journal's data. ``LocalJournalStore`` asks; nothing here writes."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Final

from .._errors import CorruptJournalError, InvalidJournalNameError
from .._spec import validate_journal_name
from ..durable import TEMP_PREFIX
from .files import JournalDir
from .fragment import COMMIT_FILE, START_FILE, parse_open_name, parse_sealed_name

# A directory name component is at most 255 bytes on common file systems.
_MAX_COMPONENT: Final = 255
# A component shaped like a Gazette fragment name would collide with the
# parent journal's fragment files.
_RESERVED_COMPONENT: Final = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{40}(\.\w*)?")


def journal_dir(root: str, real_root: str, name: str) -> JournalDir:
    """The directory of journal ``name`` under ``root`` (whose real path is
    ``real_root``): ``InvalidJournalNameError`` for a name that cannot be
    one, ``CorruptJournalError`` for a directory reached through a symbolic
    link out of the root (its files would be written elsewhere)."""
    validate_journal_name(name)
    for part in name.split("/"):
        if len(part.encode()) > _MAX_COMPONENT:
            raise InvalidJournalNameError(
                name, f"a path component is longer than {_MAX_COMPONENT} bytes"
            )
        if _RESERVED_COMPONENT.fullmatch(part):
            raise InvalidJournalNameError(
                name, f"component {part!r} is reserved (shaped like a fragment name)"
            )
    jd = JournalDir.of(root, name)
    path = root
    for part in name.split("/"):
        path = os.path.join(path, part)
        if not os.path.islink(path):
            continue
        target = os.path.realpath(path)
        if os.path.commonpath([real_root, target]) != real_root:
            raise CorruptJournalError(
                name, path,
                f"is a symbolic link out of the store's root (to {target}): not followed",
            )
    return jd


def journal_directories(root: str) -> Iterator[tuple[str, str]]:
    """``(name, path)`` of every directory below ``root`` that could be a
    journal's (names never begin with ``@``), found as it walks."""
    stack = [(root, "")]
    while stack:
        path, prefix = stack.pop()
        try:
            entries = list(os.scandir(path))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for entry in entries:
            if entry.name.startswith("@") or not entry.is_dir(follow_symlinks=False):
                continue
            name = prefix + entry.name
            stack.append((entry.path, name + "/"))
            yield name, entry.path


def journal_data(path: str) -> set[str]:
    """The names of the files in a journal directory that hold a journal's
    data: fragments, the commit record, the recorded start, temporary files."""
    try:
        entries = list(os.scandir(path))
    except FileNotFoundError:
        return set()
    return {
        e.name for e in entries
        if e.is_file(follow_symlinks=False) and (
            parse_sealed_name(e.name) is not None
            or parse_open_name(e.name) is not None
            or e.name.startswith(TEMP_PREFIX)
            or e.name in (COMMIT_FILE, START_FILE)
        )
    }
