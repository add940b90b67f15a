"""The threaded front: plain requests it declines reach the asyncio server; its threads are capped."""

from __future__ import annotations

import asyncio
import socket
import ssl
from pathlib import Path

import pytest

from cdi.common import pki, threadfront, tlsfront
from tests.support.cluster import async_wait_for


async def _front(monkeypatch: pytest.MonkeyPatch, limit: int) -> tuple[threadfront.ThreadFront, int]:
    monkeypatch.setattr(threadfront, "MAX_CONNECTIONS", limit)
    tasks: set[asyncio.Task[None]] = set()

    async def adopt(sock: socket.socket, peer: object) -> None:
        async def answer() -> None:
            reader, writer = await asyncio.open_connection(sock=sock)
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        task = asyncio.ensure_future(answer())
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    front = threadfront.ThreadFront(asyncio.get_running_loop(), None, lambda *_: False, adopt)
    return front, front.start("127.0.0.1", 0)


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    data = await asyncio.wait_for(reader.read(), 10)
    writer.close()
    return data


async def test_a_declined_request_is_answered_by_the_asyncio_server(monkeypatch: pytest.MonkeyPatch) -> None:
    front, port = await _front(monkeypatch, 8)
    try:
        assert (await _get(port)).endswith(b"\r\n\r\nok")
    finally:
        front.stop()


async def test_connections_beyond_the_cap_are_closed_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    front, port = await _front(monkeypatch, 1)
    try:
        _, idle = await asyncio.open_connection("127.0.0.1", port)  # holds the only thread, sends nothing
        for _ in range(100):  # until the front has counted it
            if front._threads:
                break
            await asyncio.sleep(0.02)
        assert await _get(port) == b""  # closed without an answer
        idle.close()
        await _threads_end(front)  # when the idle client goes; then a request is served
        assert (await _get(port)).endswith(b"ok")
    finally:
        front.stop()


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
async def test_stop_cuts_tls_connections_being_served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      native: bool) -> None:
    """A TLS client in the middle of its request head: `stop` ends its connection (and the thread), through
    either TLS implementation (`CDI_NO_EXTENSIONS=1`: the `ssl` module's)."""
    monkeypatch.setattr(threadfront, "HEAD_TIMEOUT", 60.0)
    if not native:
        monkeypatch.setenv(tlsfront.NO_EXTENSIONS_ENV, "1")
    ca = pki.make_ca("test-ca")
    pki.server_context(pki.issue(ca, "front", ["127.0.0.1"]), tmp_path)
    tls = tlsfront.ServerTLS.from_files(tmp_path / "tls.crt", tmp_path / "tls.key")
    front = threadfront.ThreadFront(asyncio.get_running_loop(), tls, lambda *_: False, _never_adopted)
    assert (front.acceptor is not None and front.acceptor.native is not None) == native
    port = front.start("127.0.0.1", 0)
    client = ssl.create_default_context(cadata=ca.cert_pem.decode())
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client, server_hostname="127.0.0.1")
        writer.write(b"POST / HTTP/1.1\r\n")  # and nothing more
        await writer.drain()
        for _ in range(250):
            if any(tlsfront.is_tls(s) for s in front._open):
                break
            await asyncio.sleep(0.02)
        front.stop()
        assert await asyncio.wait_for(reader.read(), 10) == b""
        await _threads_end(front)
        writer.close()
    finally:
        front.stop()


async def _never_adopted(sock: socket.socket, peer: object) -> None:
    raise AssertionError("nothing is delegated in this test")


async def _handed_over_request(adopt: threadfront.Adopt) -> tuple[threadfront.ThreadFront, asyncio.StreamReader,
                                                                 asyncio.StreamWriter]:
    """A front, and a client whose GET it has handed over to `adopt`."""
    front = threadfront.ThreadFront(asyncio.get_running_loop(), None, lambda *_: False, adopt)
    port = front.start("127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    await async_wait_for(lambda: front._handed_over, 5.0, message="the connection handed over")
    return front, reader, writer


async def _threads_end(front: threadfront.ThreadFront) -> None:
    await async_wait_for(lambda: not front._threads, 5.0, message="the connection threads to end")


async def test_an_answer_written_while_stopping_still_reaches_the_client() -> None:
    """The asyncio server answers after `stop` (its shutdown lets handlers finish): the client gets the
    answer, not a connection closed without one (which the upload proxy reported as 502)."""
    release = asyncio.Event()
    request_ended = asyncio.Event()

    async def adopt(sock: socket.socket, peer: object) -> None:
        async def answer() -> None:
            reader, writer = await asyncio.open_connection(sock=sock)
            await reader.readuntil(b"\r\n\r\n")
            if await reader.read() == b"":  # stopping ends the request's bytes, not the connection
                request_ended.set()
            await release.wait()
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
            await writer.drain()
            writer.close()

        tasks.add(asyncio.ensure_future(answer()))

    tasks: set[asyncio.Future[None]] = set()
    front, reader, writer = await _handed_over_request(adopt)
    try:
        front.stop()
        await asyncio.wait_for(request_ended.wait(), 10)
        release.set()
        await asyncio.gather(*tasks)
        await front.closed(10)
        assert (await asyncio.wait_for(reader.read(), 10)).endswith(b"\r\n\r\nok")
        assert front._threads == 0
    finally:
        writer.close()
        front.stop()


async def test_closed_cuts_a_handed_over_connection_the_asyncio_server_keeps_open() -> None:
    kept: list[socket.socket] = []

    async def adopt(sock: socket.socket, peer: object) -> None:
        kept.append(sock)  # never answered, never closed

    front, reader, writer = await _handed_over_request(adopt)
    try:
        front.stop()
        await front.closed(0.2)
        assert await asyncio.wait_for(reader.read(), 10) == b""
        await _threads_end(front)
    finally:
        writer.close()
        for sock in kept:
            sock.close()
