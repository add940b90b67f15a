"""The end of an upload body is said once, by whoever saw it end, never by an empty piece of it
(issue #14): aiohttp yields an empty piece at every chunk boundary of a chunked body, and the importer
reads an empty read as the end of its stream."""

from __future__ import annotations

import asyncio
from unittest import mock

import pytest
from aiohttp import streams

from cdi.importer import ImporterError
from cdi.importer.source import StreamOrigin
from cdi.uploadserver.feed import FedStream
from cdi.uploadserver.server import _as_received
from tests.support.streams import BytesStream


async def test_an_empty_chunk_is_not_the_end_of_the_body() -> None:
    queue = FedStream(asyncio.get_running_loop(), max_bytes=1 << 20)
    for chunk in (b"abc", b"", b"def", b""):
        assert await queue.put(chunk)
    queue.finish()
    read = await asyncio.to_thread(lambda: b"".join(bytes(c) for c in iter(lambda: queue.read(1 << 20), b"")))
    assert read == b"abcdef"


async def test_chunk_boundaries_of_a_chunked_body_are_not_pieces_of_it() -> None:
    protocol = mock.Mock(_reading_paused=False)
    reader = streams.StreamReader(protocol, limit=1 << 16, loop=asyncio.get_running_loop())
    reader.begin_http_chunk_receiving()
    reader.feed_data(b"first")
    request = mock.Mock(content=reader)
    pieces = _as_received(request)
    assert await pieces.__anext__() == b"first"
    reader.end_http_chunk_receiving()  # the chunk's end, parsed after its data was read: aiohttp yields b""
    reader.begin_http_chunk_receiving()
    reader.feed_data(b"second")
    reader.end_http_chunk_receiving()
    reader.feed_eof()
    assert [piece async for piece in pieces] == [b"second"]


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
