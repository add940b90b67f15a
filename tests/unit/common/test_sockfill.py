"""`sockfill.Filler` over a real TLS connection (a socket pair), through the C loop and through the
`recv_into` loop it falls back to: the same bytes and the same ends in both."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from cdi.common import pki, sockfill

MiB = 1 << 20


@pytest.fixture(scope="module")
def contexts(tmp_path_factory: pytest.TempPathFactory) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    ca = pki.make_ca("test-ca")
    server = pki.server_context(pki.issue(ca, "receiver", ["127.0.0.1"]), tmp_path_factory.mktemp("pki"))
    return server, ssl.create_default_context(cadata=ca.cert_pem.decode())


@contextlib.contextmanager
def connected(contexts: tuple[ssl.SSLContext, ssl.SSLContext], send: Callable[[ssl.SSLSocket], object] = bool,
              *, hold: bool = True) -> Iterator[ssl.SSLSocket]:
    """A TLS connection over a socket pair: the receiving socket, while a thread sends with `send` and
    then (`hold`) keeps its end open until the block ends."""
    ours, theirs = socket.socketpair()
    server, client = contexts
    release = threading.Event()

    def sender() -> None:
        with client.wrap_socket(theirs, server_hostname="127.0.0.1") as tls:
            send(tls)
            if hold:
                release.wait(30)

    thread = threading.Thread(target=sender, daemon=True)
    thread.start()
    receiver = server.wrap_socket(ours, server_side=True)
    try:
        yield receiver
    finally:
        release.set()
        receiver.close()
        thread.join(10)
        assert not thread.is_alive()


@pytest.fixture(params=["c", "python"])
def filler_of(request: pytest.FixtureRequest) -> Callable[[socket.socket], sockfill.Filler]:
    def make(sock: socket.socket) -> sockfill.Filler:
        filler = sockfill.Filler(sock)
        if request.param == "python":
            filler._sslobj = None
        elif not sockfill.accelerated():
            pytest.skip(f"the C extension is not there (test_the_c_loop_is_built_and_bound fails): {sockfill.HOW}")
        else:
            assert filler._sslobj is not None, "TLS sockets are read by the C loop"
        return filler

    return make


def test_the_c_loop_is_built_and_bound() -> None:
    """`scripts/bootstrap` installs a C compiler, so the extension is built; without it uploads still
    work, only slower, which this test would not show otherwise."""
    assert sockfill.accelerated(), sockfill.HOW


def test_fills_whole_buffers_across_many_records(contexts, filler_of) -> None:
    data = os.urandom(3 * MiB + 12345)
    with connected(contexts, lambda tls: tls.sendall(data)) as receiver:
        filler = filler_of(receiver)
        received = hashlib.sha256()
        buffer = bytearray(MiB)
        sizes = []
        while (remaining := len(data) - sum(sizes)) > 0:
            n = filler.fill(memoryview(buffer)[:min(MiB, remaining)], 10.0, 10.0)
            assert n > 0
            received.update(memoryview(buffer)[:n])
            sizes.append(n)
        assert received.digest() == hashlib.sha256(data).digest()
        assert sizes == [MiB, MiB, MiB, 12345]  # full buffers, not a record each


def test_a_pause_hands_over_what_arrived(contexts, filler_of) -> None:
    """The sender stops after 100 KiB and waits: the filler returns those bytes instead of waiting for
    a full MiB."""
    data = os.urandom(100 << 10)
    with connected(contexts, lambda tls: tls.sendall(data)) as receiver:
        filler = filler_of(receiver)
        buffer = bytearray(MiB)
        got = b""
        while len(got) < len(data):
            n = filler.fill(buffer, 10.0, 0.05)
            assert 0 < n < len(buffer)
            got += buffer[:n]
        assert got == data


def test_nothing_arriving_is_a_timeout(contexts, filler_of) -> None:
    with connected(contexts) as receiver, pytest.raises(TimeoutError):
        filler_of(receiver).fill(bytearray(MiB), 0.1, 0.1)


@pytest.mark.parametrize("notify", [True, False], ids=["close_notify", "no_close_notify"])
def test_the_end_comes_after_the_bytes_before_it(contexts, filler_of, notify: bool) -> None:
    """The sender closes after 200 KiB (with or without TLS close_notify): those bytes first, then 0."""
    data = os.urandom(200 << 10)

    def send(tls: ssl.SSLSocket) -> None:
        tls.sendall(data)
        if notify:
            with contextlib.suppress(OSError):  # unwrap() also waits for the receiver's close_notify
                tls.unwrap()
        else:  # the TCP stream ends, the TLS session never does; the socket stays open until the end (closing
            tls.shutdown(socket.SHUT_WR)  # it with the session tickets unread would send a reset instead)

    with connected(contexts, send) as receiver:
        filler = filler_of(receiver)
        buffer = bytearray(MiB)
        got = b""
        while (n := filler.fill(buffer, 10.0, 10.0)) > 0:
            got += buffer[:n]
        assert got == data
        assert filler.fill(buffer, 10.0, 10.0) == 0  # and stays ended


def test_a_broken_tls_stream_fails_after_the_good_bytes(contexts, filler_of) -> None:
    """Bytes that are not TLS records after 64 KiB of good ones: those first, then ssl.SSLError."""
    data = os.urandom(64 << 10)

    def send(tls: ssl.SSLSocket) -> None:
        tls.sendall(data)
        raw = socket.socket(fileno=os.dup(tls.fileno()))
        raw.sendall(b"\x17\x03\x03\x00\x20" + b"x" * 32)  # an application-data record that does not decrypt
        raw.close()

    with connected(contexts, send, hold=False) as receiver:
        filler = filler_of(receiver)
        buffer = bytearray(MiB)
        got = b""
        while len(got) < len(data):
            n = filler.fill(buffer, 10.0, 10.0)
            assert n > 0
            got += buffer[:n]
        assert got == data
        with pytest.raises(ssl.SSLError):
            filler.fill(buffer, 10.0, 10.0)


def test_the_c_loop_refuses_a_connection_that_is_not_the_sockets(contexts) -> None:
    _tlsread = pytest.importorskip("cdi.common._tlsread")

    with connected(contexts) as receiver:
        with pytest.raises(ValueError, match="does not read from this socket"):
            _tlsread.fill(receiver._sslobj, receiver.fileno() + 1000, bytearray(16), 100, 100)
        with pytest.raises(TypeError, match="_SSLSocket"):
            _tlsread.fill(object(), receiver.fileno(), bytearray(16), 100, 100)


def test_bytes_trickling_into_an_unfinished_record_do_not_extend_the_wait(contexts, filler_of) -> None:
    """A sender that drips a TLS record's bytes slowly (a slow-loris client) gets the same timeout as a
    silent one: the wait is a deadline, not restarted by every packet."""
    stop = threading.Event()

    def send(tls: ssl.SSLSocket) -> None:
        raw = socket.socket(fileno=os.dup(tls.fileno()))
        raw.sendall(b"\x17\x03\x03\x40\x11")  # the head of a 16 KiB application-data record
        while not stop.wait(0.02):
            raw.send(b"x")
        raw.close()

    with connected(contexts, send, hold=False) as receiver:
        filler = filler_of(receiver)
        started = time.monotonic()
        try:
            with pytest.raises(TimeoutError):
                filler.fill(bytearray(MiB), 0.3, 0.3)
            assert time.monotonic() - started < 10  # the drip would go on for minutes
        finally:
            stop.set()
