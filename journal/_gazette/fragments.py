"""Persisted fragments, read straight from their fragment store.

A broker asked not to proxy (``do_not_proxy``) answers a read of a persisted
fragment with the fragment's metadata and a URL: ``file:///<path>`` for a
file store, or a signed ``https://`` (``http://`` for a local
S3-compatible server) GET URL for a cloud store, good for a minute. The
reader then fetches the fragment itself, and asks the broker again from the
fragment's end. Fragments are stored as Gazette writes them:

=========================  =======================================
codec                      what the bytes are
=========================  =======================================
NONE                       the content (a ranged GET starts at the offset)
GZIP                       a gzip stream
GZIP_OFFLOAD_DECOMPRESSION a gzip stream, stored with
                           ``Content-Encoding: gzip`` (decompressed here)
SNAPPY                     snappy's framing format
ZSTANDARD                  a zstandard stream
=========================  =======================================

``open_fragment`` returns a binary stream positioned at the requested offset,
or None where the URL cannot be opened here (the reader then reads through
a broker).
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import urllib.error
import urllib.request
from typing import IO, Final, cast
from urllib.parse import unquote, urlsplit

from . import broker_pb2 as pb

LOG: Final = logging.getLogger("journal")

#: Seconds an HTTP request for a fragment may take to answer.
HTTP_TIMEOUT: Final = 30.0
_SKIP: Final = 1 << 20


class FragmentUnreadable(Exception):  # noqa: N818 -- internal signal, never raised out
    """The fragment cannot be read from its store here."""


def _decoded(raw: IO[bytes], codec: int) -> IO[bytes]:
    """``raw`` (a fragment's stored bytes) as its content."""
    if codec == pb.NONE:
        return raw
    if codec in (pb.GZIP, pb.GZIP_OFFLOAD_DECOMPRESSION):
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    if codec == pb.ZSTANDARD:
        import zstandard

        return cast(IO[bytes], zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    if codec == pb.SNAPPY:
        import cramjam

        # Snappy's framing format, decoded whole (a fragment is bounded by
        # its journal's fragment length).
        with raw:
            data = bytes(cramjam.snappy.decompress(raw.read()))
        return io.BytesIO(data)
    raise FragmentUnreadable(f"unknown compression codec {codec}")


def _skip(stream: IO[bytes], count: int) -> None:
    while count:
        got = stream.read(min(count, _SKIP))
        if not got:
            raise FragmentUnreadable("the fragment ends early")
        count -= len(got)


def _open_file(url: str, fragment: pb.Fragment, skip: int, file_root: str | None) -> IO[bytes]:
    if file_root is None:
        raise FragmentUnreadable("no file_root: the file store is not mounted here")
    path = os.path.join(file_root, unquote(urlsplit(url).path).lstrip("/"))
    try:
        raw = open(path, "rb")  # noqa: SIM115 -- closed with the stream returned
    except OSError as err:
        raise FragmentUnreadable(f"{path}: {err.strerror or err}") from None
    if fragment.compression_codec == pb.NONE:
        raw.seek(skip)
        return raw
    stream = _decoded(raw, fragment.compression_codec)
    _skip(stream, skip)
    return stream


def _open_http(url: str, fragment: pb.Fragment, skip: int) -> IO[bytes]:
    plain = fragment.compression_codec == pb.NONE
    headers = {"Range": f"bytes={skip}-"} if plain and skip else {}
    try:
        resp = urllib.request.urlopen(
            urllib.request.Request(url, headers=headers), timeout=HTTP_TIMEOUT)
    except (urllib.error.URLError, OSError, ValueError) as err:
        raise FragmentUnreadable(f"GET failed: {err}") from None
    raw = cast(IO[bytes], resp)
    if plain:
        if resp.status != 206 and skip:
            _skip(raw, skip)  # a store that ignores ranges sends it all
        return raw
    stream = _decoded(raw, fragment.compression_codec)
    _skip(stream, skip)
    return stream


def open_fragment(
    url: str, fragment: pb.Fragment, offset: int, file_root: str | None
) -> IO[bytes] | None:
    """The content of ``fragment`` from ``offset`` on, read from its store at
    ``url``; None (with a log line) where it cannot be read here."""
    skip = offset - fragment.begin
    scheme = urlsplit(url).scheme
    try:
        if scheme == "file":
            return _open_file(url, fragment, skip, file_root)
        if scheme in ("http", "https"):
            return _open_http(url, fragment, skip)
        raise FragmentUnreadable(f"no way to read {scheme}:// URLs")
    except (FragmentUnreadable, OSError, EOFError, ImportError) as err:
        LOG.info("fragment [%d, %d) of %s: reading it through a broker (%s)",
                 fragment.begin, fragment.end, fragment.journal, err)
        return None
    except Exception as err:  # a codec's own error: a damaged stored fragment
        LOG.warning("fragment [%d, %d) of %s could not be decoded (%s): reading it through"
                    " a broker", fragment.begin, fragment.end, fragment.journal, err)
        return None
