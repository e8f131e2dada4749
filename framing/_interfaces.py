"""The contracts of the framing package: what a reader must offer and what a
framing must implement. Implementations live in their own modules."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeAlias, runtime_checkable

from ._constants import DEFAULT_CHUNK_SIZE

#: One complete frame, as ``Framing.read_frames`` yields it: ``bytes``, or a
#: ``memoryview`` into a read buffer (which stays valid, but keeps the buffer
#: alive: copy it with ``bytes(frame)`` to keep it for long).
Frame: TypeAlias = bytes | memoryview

#: Decodes the next frame of a reader into the message it is given. Returned
#: by ``Framing.new_unmarshal_func``.
UnmarshalFunc: TypeAlias = Callable[[Any], None]


class ByteReader(Protocol):
    """The least a framing needs from its input: ``read``.

    ``read(n)`` returns between 1 and ``n`` bytes, and ``b""`` only at the end
    of the input. It may block until at least one byte is available (a reader
    that follows a growing journal); it should not wait for all ``n``.
    Readers that also offer ``readline``, ``peek`` (``io.BufferedReader``) or
    ``seek`` let the per-frame functions work with fewer reads and copies.
    """

    def read(self, size: int, /) -> bytes: ...


@runtime_checkable
class Framing(Protocol):
    """How messages are encoded to and decoded from a journal's bytes.

    A journal's ``content-type`` label names its framing; see
    ``framing_by_content_type``. Messages are duck-typed: each framing looks
    for its own hooks on them (``marshal_json``, ``marshal_csv``,
    ``SerializeToString``, ...) and raises ``UnsupportedMessageError`` for a
    message it cannot handle.

    There are two ways to decode. ``new_unmarshal_func`` reads one frame per
    call and never reads past it, which suits readers shared with other code.
    The bulk path, ``read_frames`` then ``unmarshal_frame``, reads large
    chunks and finds the frames inside them: it is the fast one, and the one
    the journal read iterators use. Both find the same frames and raise the
    same errors for the same input.
    """

    @property
    def content_type(self) -> str:
        """The content type this framing is registered under."""
        ...

    def marshal(self, msg: Any, /) -> bytes:
        """Encode ``msg`` as one complete frame."""
        ...

    def new_unmarshal_func(self, r: ByteReader, /) -> UnmarshalFunc:
        """A function that decodes the next frame of ``r`` into the message it
        is given, consuming exactly that frame's bytes.

        It raises ``EOFError`` at a clean end of input (on a frame boundary),
        ``TruncatedFrameError`` if the input ends inside a frame (the partial
        frame is consumed, so the next call raises ``EOFError``),
        ``FrameDecodeError`` for a complete frame whose content is invalid, and
        ``DesyncError`` for bytes that are not a frame. After either of the
        last two, the next call goes on with the next frame.
        """
        ...

    def read_frames(
        self, r: ByteReader, /, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, int, Frame]]:
        """The bulk path: ``(begin, end, frame)`` for every complete frame of ``r``.

        ``r`` is read with ``r.read(chunk_size)`` (it may block; it returns at
        least one byte, or ``b""`` only at the end). Frames are found inside
        each chunk without a read per frame; an incomplete tail is kept and
        joined with the next chunk. ``begin`` and ``end`` are offsets relative
        to the reader's position when iteration started, and each frame's
        ``begin`` is the previous frame's ``end``. A frame includes its
        newline or header; pass it to ``unmarshal_frame``.

        At a clean end of input the iterator stops. If the input ends inside a
        frame it raises ``TruncatedFrameError`` with ``.data`` (the partial
        frame) and ``.offset`` (its ``begin``). Bytes that are not a frame
        (fixed framing: a run that does not start with the magic word, up to
        the next magic word or the end) are yielded as a frame of their own,
        for which ``unmarshal_frame`` raises ``DesyncError``; iteration goes on.
        """
        ...

    def unmarshal_frame(self, frame: Frame, msg: Any, /) -> None:
        """Decode one complete frame, as ``read_frames`` yields it, into ``msg``.

        Raises ``FrameDecodeError`` if its content cannot be decoded and
        ``DesyncError`` for a run of bytes that is not a frame.
        """
        ...


@runtime_checkable
class BatchFraming(Framing, Protocol):
    """A framing that can also hand out its frames a chunk at a time.

    Readers that go over frames in C use it (no tuple per frame); a reader
    checks ``isinstance(framing, BatchFraming)`` and uses ``read_frames``
    otherwise. ``framing.testing.check_framing`` checks that both give the
    same frames and raise the same errors.
    """

    def read_frame_batches(
        self, r: ByteReader, /, *, chunk_size: int = DEFAULT_CHUNK_SIZE
    ) -> Iterator[tuple[int, list[bytes]]]:
        """``read_frames`` by chunk: ``(begin, frames)`` for each chunk's
        complete frames, ``begin`` being where the first one begins (the end
        of the previous batch's last frame); the same frames as
        ``read_frames``, and the same ``TruncatedFrameError`` at the end."""
        ...


@runtime_checkable
class PlainJsonFraming(BatchFraming, Protocol):
    """A framing of one JSON document per line that lets bulk readers and
    writers encode and decode plain documents (dicts) without a call into
    the framing per message. ``check_framing`` checks each promise below on
    the messages it is given."""

    @property
    def newline_delimited(self) -> bool:
        """True if every frame is one line, through its newline, and every
        newline ends a frame: a reader may split the bytes into frames itself."""
        ...

    def plain_dumps(self) -> tuple[Callable[[Any], bytes], set[type]]:
        """``(dumps, types)``: ``marshal(msg)`` of a message whose type is in
        ``types`` (a set that only grows) is ``dumps(msg) + b"\\n"``; if
        ``dumps`` raises, the error to report is ``marshal``'s."""
        ...

    def plain_json(self) -> tuple[Callable[[Frame], Any], set[type]]:
        """``(loads, types)``: decoding a frame into a message whose type is
        in ``types`` (a set that only grows) is ``loads(frame)``, which must
        give a ``dict``, merged into the emptied message; any other outcome
        is ``unmarshal_frame``'s to handle."""
        ...
