"""Straight to the upload server (issue #14): the same 64 MiB image arriving every way a request body
can (Content-Length, chunked in small, odd and large chunks, with trailers, behind `Expect:
100-continue`, a multipart form; sync and async endpoints) lands byte for byte, and a body that ends
early is never taken as complete. aiohttp marks the end of every chunk of a chunked body with an empty
piece; taken as the end of the body, it once made a piped upload "succeed" with its first few hundred KB."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from cdi.api import upload as names
from tests.support import rawhttp
from tests.support.cluster import async_wait_for
from tests.support.rawhttp import CUTS, WAYS, Framing, way_id

from .conftest import Running, UploadPki, make_volumes, start_server

SIZE = 128 << 20
IMAGE = os.urandom((64 << 20) + 777)


async def _send(running: Running, upload_pki: UploadPki, path: str, framing: Framing,
                cut_at: int | None = None) -> rawhttp.Answer:
    return await asyncio.to_thread(
        rawhttp.post, ("127.0.0.1", running.server.port), upload_pki.client_context(), "cdi-upload-disk.default.svc",
        path, IMAGE, framing, cut_at=cut_at)


def _holds_image(disk: Path) -> bool:
    with disk.open("rb") as f:
        if hashlib.sha256(f.read(len(IMAGE))).digest() != hashlib.sha256(IMAGE).digest():
            return False
        return not any(f.read())  # beyond the image: zeros (the volume's usable size)


@pytest.fixture
async def server(upload_pki: UploadPki, tmp_path: Path):  # type: ignore[no-untyped-def]
    running = await start_server(upload_pki, make_volumes(tmp_path, size=SIZE), size=SIZE)
    yield running
    await running.close()


@pytest.mark.parametrize("way", WAYS, ids=way_id)
async def test_every_way_a_body_arrives_lands_byte_for_byte(server: Running, upload_pki: UploadPki,
                                                            way: tuple[str, Framing]) -> None:
    path, framing = way
    answer = await _send(server, upload_pki, path, framing)
    assert answer.status == 200, answer
    session = server.server.session
    await server.finished(60)
    assert session.state == "done" and session.fatal is None
    assert _holds_image(server.volumes.image)


@pytest.mark.parametrize("way", CUTS, ids=way_id)
async def test_a_body_that_ends_early_fails_and_a_whole_one_follows(server: Running, upload_pki: UploadPki,
                                                                    way: tuple[str, Framing]) -> None:
    path, framing = way
    cut = rawhttp.framed_size(IMAGE, framing) // 2 + 3  # in the middle of a chunk, too
    answer = await _send(server, upload_pki, path, framing, cut_at=cut)
    assert answer.status != 200, answer
    session = server.server.session
    await async_wait_for(lambda: session.state == "idle", 30, message="the upload server ready again")
    assert not session.finished.is_set() and session.result is None
    answer = await _send(server, upload_pki, path, framing)  # from the start: the volume loses nothing
    assert answer.status == 200, answer
    await server.finished(60)
    assert _holds_image(server.volumes.image)


async def test_a_chunked_body_larger_than_the_volume_is_refused(upload_pki: UploadPki, tmp_path: Path) -> None:
    running = await start_server(upload_pki, make_volumes(tmp_path, size=32 << 20), size=32 << 20)
    try:
        answer = await _send(running, upload_pki, names.SYNC_PATHS[0], Framing(chunk=65536))
        assert answer.status == 400 and "larger than the usable space" in answer.text, answer
        assert running.server.session.state == "idle"
    finally:
        await running.close()
