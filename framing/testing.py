"""Testing help for framings: a conformance check that every ``Framing``
must pass, and a reader that behaves like a slow stream.

Check a framing of your own in one call::

    from framing.testing import check_framing

    def test_my_framing_conforms():
        check_framing(MyFraming(), [MyMsg(1), MyMsg(2), MyMsg(3)], new_message=MyMsg)
"""

from __future__ import annotations

import io
import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from typing import Any, final

from ._errors import TruncatedFrameError
from ._interfaces import BatchFraming, Frame, Framing, PlainJsonFraming

__all__ = ["ShortReader", "check_framing"]


@final
class ShortReader:
    """A reader of ``data`` that has nothing but ``read`` (and ``tell``, for
    tests), and returns at most ``max_read`` bytes per call: the behaviour of
    a socket, a pipe, or a reader that follows a growing journal.

    ``reads`` counts the calls of ``read``.
    """

    __slots__ = ("_data", "_max_read", "_pos", "reads")

    def __init__(self, data: bytes, max_read: int = 1) -> None:
        if max_read < 1:
            raise ValueError(f"max_read must be positive, not {max_read}")
        self._data = bytes(data)
        self._max_read = max_read
        self._pos = 0
        self.reads = 0

    def read(self, size: int = -1, /) -> bytes:
        self.reads += 1
        n = self._max_read if size is None or size < 0 else min(size, self._max_read)
        out = self._data[self._pos : self._pos + n]
        self._pos += len(out)
        return out

    def tell(self) -> int:
        """Bytes consumed so far."""
        return self._pos


def _fail(what: str) -> None:
    # ``raise``, not ``assert``: the check must hold under ``python -O`` too.
    raise AssertionError(what)


def _readers(data: bytes) -> Iterator[tuple[str, Any]]:
    """The kinds of reader a framing must handle, each over ``data``."""
    yield "BytesIO", io.BytesIO(data)
    yield "BufferedReader(buffer_size=16)", io.BufferedReader(io.BytesIO(data), buffer_size=16)
    yield "ShortReader(max_read=1)", ShortReader(data, 1)
    yield "ShortReader(max_read=7)", ShortReader(data, 7)


def _cut_points(size: int, bounds: Sequence[int], limit: int) -> list[int]:
    """Offsets strictly inside frames; at most ``limit`` of them, spread evenly."""
    boundaries = set(bounds)
    cuts = [c for c in range(1, size) if c not in boundaries]
    if len(cuts) > limit:
        step = len(cuts) / limit
        cuts = [cuts[int(i * step)] for i in range(limit)]
    return cuts


def check_framing(
    framing: Framing,
    messages: Sequence[Any],
    new_message: Callable[[], Any],
    *,
    equal: Callable[[Any, Any], bool] = operator.eq,
    chunk_sizes: Sequence[int] = (1, 2, 3, 7, 64, 1 << 20),
    max_cut_points: int = 300,
) -> None:
    """Check that ``framing`` keeps the ``Framing`` contract; raise
    ``AssertionError`` saying what broke if it does not.

    ``messages`` (several, of a type the framing handles) are encoded with
    ``marshal``, and the stream of their frames is decoded back into
    ``new_message()`` instances, which must be ``equal`` to the originals:

    - through ``new_unmarshal_func``, over several kinds of reader (buffered,
      unbuffered, short reads), consuming exactly one frame per call, then
      ``EOFError`` at the end, and again on the next call;
    - through ``read_frames`` with each of ``chunk_sizes``, whose offsets
      must be contiguous from 0 to the end, and ``unmarshal_frame``; and, if
      the framing is a ``BatchFraming``, through ``read_frame_batches``
      too, which must give the same frames;
    - if it is a ``PlainJsonFraming``: with ``newline_delimited``, each
      frame is one line ending in its only newline; ``plain_dumps`` and
      ``plain_json`` keep their promises for every message whose type they
      name;
    - empty input is a clean end for both;
    - input cut inside a frame, at every offset (up to ``max_cut_points``
      of them), decodes the frames before the cut, then raises
      ``TruncatedFrameError`` with the partial frame as ``.data`` (and, from
      ``read_frames``, its start as ``.offset``), then ``EOFError``.
    """
    if not messages:
        raise ValueError("check_framing needs at least one message")
    if not isinstance(framing.content_type, str) or not framing.content_type:
        _fail(f"{framing!r}: content_type must be a non-empty str")

    frames: list[bytes] = []
    for i, msg in enumerate(messages):
        frame = framing.marshal(msg)
        if not isinstance(frame, bytes) or not frame:
            _fail(f"marshal(messages[{i}]) returned {frame!r}, not a non-empty bytes frame")
        frames.append(frame)
    data = b"".join(frames)
    bounds = [0]
    for frame in frames:
        bounds.append(bounds[-1] + len(frame))

    _check_unmarshal_func(framing, messages, new_message, equal, data, bounds)
    if isinstance(framing, PlainJsonFraming):
        _check_plain_json(framing, messages, new_message, equal, frames)
    _check_read_frames(framing, messages, new_message, equal, data, frames, chunk_sizes)
    _check_empty(framing, new_message)
    for cut in _cut_points(len(data), bounds, max_cut_points):
        _check_truncated(framing, messages, new_message, equal, data, bounds, cut)


def _check_plain_json(
    framing: PlainJsonFraming,
    messages: Sequence[Any],
    new_message: Callable[[], Any],
    equal: Callable[[Any, Any], bool],
    frames: Sequence[bytes],
) -> None:
    if framing.newline_delimited:
        for i, frame in enumerate(frames):
            if not frame.endswith(b"\n") or b"\n" in frame[:-1]:
                _fail(f"newline_delimited, but frame {i} is not one line: {frame!r}")
    dumps, dump_types = framing.plain_dumps()
    loads, load_types = framing.plain_json()
    for i, (msg, frame) in enumerate(zip(messages, frames, strict=True)):
        if type(msg) in dump_types and dumps(msg) + b"\n" != frame:
            _fail(f"plain_dumps: messages[{i}] gives {dumps(msg)!r}, marshal gives {frame!r}")
        got = new_message()
        if type(got) in load_types:
            decoded = loads(frame)
            if not isinstance(decoded, dict):
                _fail(f"plain_json: frame {i} loads as {decoded!r}, not a dict")
            got.clear()
            got.update(decoded)
            _check_decoded(equal, got, messages[i], f"plain_json, frame {i}")


def _check_decoded(equal: Callable[[Any, Any], bool], got: Any, want: Any, where: str) -> None:
    if not equal(got, want):
        _fail(f"{where}: decoded {got!r}, expected {want!r}")


def _expect_eof(
    unmarshal: Callable[[Any], None], new_message: Callable[[], Any], where: str
) -> None:
    try:
        unmarshal(new_message())
    except EOFError:
        return
    _fail(f"{where}: expected EOFError at the end of the input")


def _check_unmarshal_func(
    framing: Framing,
    messages: Sequence[Any],
    new_message: Callable[[], Any],
    equal: Callable[[Any, Any], bool],
    data: bytes,
    bounds: Sequence[int],
) -> None:
    for kind, reader in _readers(data):
        unmarshal = framing.new_unmarshal_func(reader)
        for i, want in enumerate(messages):
            where = f"new_unmarshal_func({kind}), frame {i}"
            got = new_message()
            unmarshal(got)
            _check_decoded(equal, got, want, where)
            if reader.tell() != bounds[i + 1]:
                _fail(
                    f"{where}: reader is at {reader.tell()} after the frame,"
                    f" expected {bounds[i + 1]} (a frame must consume exactly its bytes)"
                )
        _expect_eof(unmarshal, new_message, f"new_unmarshal_func({kind})")
        _expect_eof(unmarshal, new_message, f"new_unmarshal_func({kind}), called again")


def _check_read_frames(
    framing: Framing,
    messages: Sequence[Any],
    new_message: Callable[[], Any],
    equal: Callable[[Any, Any], bool],
    data: bytes,
    frames: Sequence[bytes],
    chunk_sizes: Sequence[int],
) -> None:
    for chunk_size in chunk_sizes:
        for kind, reader in (
            ("BytesIO", io.BytesIO(data)),
            ("ShortReader(max_read=3)", ShortReader(data, 3)),
        ):
            where = f"read_frames({kind}, chunk_size={chunk_size})"
            got = list(framing.read_frames(reader, chunk_size=chunk_size))
            if len(got) != len(frames):
                _fail(f"{where}: {len(got)} frames, expected {len(frames)}")
            end = 0
            for i, (begin, stop, frame) in enumerate(got):
                if begin != end or stop <= begin:
                    _fail(f"{where}, frame {i}: offsets [{begin}, {stop}) after {end}")
                end = stop
                if bytes(frame) != frames[i] or stop - begin != len(frames[i]):
                    _fail(f"{where}, frame {i}: {bytes(frame)!r}, expected {frames[i]!r}")
                msg = new_message()
                framing.unmarshal_frame(frame, msg)
                _check_decoded(equal, msg, messages[i], f"{where}, unmarshal_frame {i}")
            if end != len(data):
                _fail(f"{where}: frames end at {end}, expected {len(data)}")
            if isinstance(framing, BatchFraming):
                batched = _batched_frames(framing, io.BytesIO(data), chunk_size)
                if batched != [(b, e, bytes(f)) for b, e, f in got]:
                    _fail(f"read_frame_batches(chunk_size={chunk_size}): not read_frames' frames")


def _batched_frames(framing: Any, r: Any, chunk_size: int) -> list[tuple[int, int, bytes]]:
    """The frames of ``read_frame_batches`` (an optional method) as
    ``read_frames`` gives them, checking that each batch's frames are
    contiguous with what came before."""
    out: list[tuple[int, int, bytes]] = []
    pos = 0
    for begin, frames in framing.read_frame_batches(r, chunk_size=chunk_size):
        if begin != pos or not frames:
            _fail(f"read_frame_batches: a batch of {len(frames)} frames at {begin}, after {pos}")
        for frame in frames:
            out.append((pos, pos + len(frame), bytes(frame)))
            pos += len(frame)
    return out


def _check_empty(framing: Framing, new_message: Callable[[], Any]) -> None:
    _expect_eof(framing.new_unmarshal_func(io.BytesIO(b"")), new_message, "empty input")
    if list(framing.read_frames(io.BytesIO(b""))):
        _fail("read_frames: yielded a frame for empty input")


def _check_truncated(
    framing: Framing,
    messages: Sequence[Any],
    new_message: Callable[[], Any],
    equal: Callable[[Any, Any], bool],
    data: bytes,
    bounds: Sequence[int],
    cut: int,
) -> None:
    whole = next(i for i in range(len(bounds)) if bounds[i + 1] > cut)  # Frames before the cut.
    partial = data[bounds[whole] : cut]

    where = f"new_unmarshal_func, input cut at {cut}"
    unmarshal = framing.new_unmarshal_func(io.BytesIO(data[:cut]))
    for i in range(whole):
        msg = new_message()
        unmarshal(msg)
        _check_decoded(equal, msg, messages[i], f"{where}, frame {i}")
    try:
        unmarshal(new_message())
    except TruncatedFrameError as e:
        if e.data != partial:
            _fail(f"{where}: TruncatedFrameError.data is {e.data!r}, expected {partial!r}")
    except EOFError:
        _fail(f"{where}: EOFError inside frame {whole}, expected TruncatedFrameError")
    else:
        _fail(f"{where}: decoded a message from a partial frame {partial!r}")
    _expect_eof(unmarshal, new_message, f"{where}, after TruncatedFrameError")

    chunk_size = cut % 5 + 1  # Vary the chunk boundaries from one cut to the next.
    where = f"read_frames(chunk_size={chunk_size}), input cut at {cut}"
    got: list[tuple[int, int, Frame]] = []
    try:
        got.extend(framing.read_frames(io.BytesIO(data[:cut]), chunk_size=chunk_size))
    except TruncatedFrameError as e:
        if e.data != partial or e.offset != bounds[whole]:
            _fail(
                f"{where}: TruncatedFrameError(data={e.data!r}, offset={e.offset}),"
                f" expected data={partial!r}, offset={bounds[whole]}"
            )
    else:
        _fail(f"{where}: ended cleanly inside frame {whole}, expected TruncatedFrameError")
    offsets = [(b, e) for b, e, _ in got]
    if offsets != list(itertools.pairwise(bounds[: whole + 1])):
        _fail(f"{where}: frames {offsets} before the cut")
    if isinstance(framing, BatchFraming):
        where = f"read_frame_batches(chunk_size={chunk_size}), input cut at {cut}"
        try:
            _batched_frames(framing, io.BytesIO(data[:cut]), chunk_size)
        except TruncatedFrameError as e:
            if e.data != partial or e.offset != bounds[whole]:
                _fail(f"{where}: TruncatedFrameError(data={e.data!r}, offset={e.offset})")
        else:
            _fail(f"{where}: ended cleanly inside frame {whole}, expected TruncatedFrameError")
