"""The threaded front: it answers every request itself (a broken one 400); its threads are capped; it needs
no event loop (the test's loop runs only the clients)."""

from __future__ import annotations

import asyncio
import ssl
import threading
from pathlib import Path

import h11
import pytest

from cdi.common import pki, sockhttp, threadfront, tlsfront
from cdi.kube.tlswatch import DEFAULT_POLICY
from tests.support.cluster import async_wait_for


async def _front(monkeypatch: pytest.MonkeyPatch, limit: int) -> tuple[threadfront.ThreadFront, int]:
    monkeypatch.setattr(threadfront, "MAX_CONNECTIONS", limit)
    front = threadfront.ThreadFront(None, _ok)
    return front, front.start("127.0.0.1", 0)


async def _get(port: int) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    await writer.drain()
    try:
        data = await asyncio.wait_for(reader.read(), 10)
    except ConnectionResetError:  # closed unanswered after the request arrived: the kernel resets, same to a client
        data = b""
    writer.close()
    return data


def _ok(sock: threadfront.Conn, conn: h11.Connection, request: h11.Request) -> None:
    sockhttp.text_answer(sock, conn, 200, "ok")


async def test_a_request_is_answered_by_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    front, port = await _front(monkeypatch, 8)
    try:
        assert (await _get(port)).endswith(b"\r\n\r\nok")
    finally:
        front.stop()


async def test_a_request_h11_cannot_parse_is_answered_400(monkeypatch: pytest.MonkeyPatch) -> None:
    """No other server behind the front says what is wrong with a broken request: the front does."""
    front, port = await _front(monkeypatch, 8)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nbroken header\r\n\r\n")
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 400 ") and b"Bad Request" in answer
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


async def test_close_stops_accepting_and_ends_the_accepting_thread() -> None:
    front = threadfront.ThreadFront(None, _ok, name="closing")
    port = front.start("127.0.0.1", 0)
    assert (await _get(port)).endswith(b"ok")
    await asyncio.to_thread(front.close)
    with pytest.raises(ConnectionRefusedError):
        await asyncio.open_connection("127.0.0.1", port)
    await async_wait_for(lambda: not any(t.name == "closing-accept" for t in threading.enumerate()), 5.0,
                         message="the accepting thread to end")


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
async def test_stop_cuts_tls_connections_being_served(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                      native: bool) -> None:
    """A TLS client in the middle of its request head: `stop` ends its connection (and the thread), through
    either TLS implementation (`CDI_NO_EXTENSIONS=1`: the `ssl` module's)."""
    monkeypatch.setattr(threadfront, "HEAD_TIMEOUT", 60.0)
    if native:  # the parameter decides, whatever the run's environment says
        monkeypatch.delenv(tlsfront.NO_EXTENSIONS_ENV, raising=False)
    else:
        monkeypatch.setenv(tlsfront.NO_EXTENSIONS_ENV, "1")
    ca = pki.make_ca("test-ca")
    pki.server_context(pki.issue(ca, "front", ["127.0.0.1"]), tmp_path)
    tls = tlsfront.ServerTLS(tmp_path / "tls.crt", tmp_path / "tls.key", DEFAULT_POLICY)
    front = threadfront.ThreadFront(tls, _ok)
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
        await asyncio.to_thread(front.close)  # waits until the connection threads ended
        assert not front._threads
        writer.close()
    finally:
        front.stop()


async def _threads_end(front: threadfront.ThreadFront) -> None:
    await async_wait_for(lambda: not front._threads, 5.0, message="the connection threads to end")
