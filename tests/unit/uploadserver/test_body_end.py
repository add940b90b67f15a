"""The end of an upload body is said once, by whoever saw it end, never by an empty piece of it
(issue #14): a reader that yields an empty piece at a chunk boundary of a chunked body ends the
importer's stream early, since the importer reads an empty read as the end of its stream."""

from __future__ import annotations

import socket
import threading

import h11
import pytest

from cdi.importer import ImporterError
from cdi.importer.source import StreamOrigin
from cdi.uploadserver.feed import FedStream
from cdi.uploadserver.front import _Pieces
from tests.support.streams import BytesStream


def test_an_empty_chunk_is_not_the_end_of_the_body() -> None:
    queue = FedStream(max_bytes=1 << 20)
    for chunk in (b"abc", b"", b"def", b""):
        assert queue.put(chunk, threading.Event())
    queue.finish()
    assert b"".join(bytes(c) for c in iter(lambda: queue.read(1 << 20), b"")) == b"abcdef"


def test_chunk_boundaries_of_a_chunked_body_are_not_pieces_of_it() -> None:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(b"POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
                       b"5\r\nfirst\r\n0000\r\n")  # a last chunk written as 0000 is the end, nothing empty before
        conn = h11.Connection(h11.SERVER)
        conn.receive_data(ours.recv(65536))
        assert isinstance(conn.next_event(), h11.Request)
        pieces = iter(_Pieces(ours, conn))
        assert next(pieces) == b"first"
        theirs.sendall(b"Trailer-Field: x\r\n\r\n")
        assert list(pieces) == []


def test_a_stream_origin_checks_that_its_body_ended_at_its_size() -> None:
    origin = StreamOrigin(BytesStream(b"x" * 1000), size=2000)
    assert origin.stream().read(4096) == b"x" * 1000
    with pytest.raises(ImporterError, match="ended after 1000 of its 2000 bytes"):
        origin.finish()


def test_what_follows_the_end_of_an_image_is_read_before_it_counts_as_received() -> None:
    size = 5 << 20  # more than the head read for format detection
    origin = StreamOrigin(BytesStream(b"x" * size), size=size)
    assert origin.stream().read(1000) == b"x" * 1000  # the image's format said it ended here
    origin.finish()
    assert origin.meter.total == size
