"""`sockfill.Filler` over a real TLS connection (a socket pair), through the native TLS connection
(`cdi.common._tlsfront`) and through the `ssl` module's (`CDI_NO_EXTENSIONS=1`): the same bytes and the
same ends in both."""

from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from cdi.common import pki, sockfill, tlsfront
from cdi.kube.tlswatch import DEFAULT_POLICY

MiB = 1 << 20


@pytest.fixture(scope="module")
def pki_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[tlsfront.ServerTLS, ssl.SSLContext]:
    ca = pki.make_ca("test-ca")
    directory = tmp_path_factory.mktemp("pki")
    pki.server_context(pki.issue(ca, "receiver", ["127.0.0.1"]), directory)
    server = tlsfront.ServerTLS(directory / "tls.crt", directory / "tls.key", DEFAULT_POLICY)
    return server, ssl.create_default_context(cadata=ca.cert_pem.decode())


@pytest.fixture(params=["native", "python"])
def contexts(request: pytest.FixtureRequest, pki_files, monkeypatch: pytest.MonkeyPatch
             ) -> tuple[tlsfront.Acceptor, ssl.SSLContext]:
    """The receiving side through the C extension, and through the `ssl` module (CDI_NO_EXTENSIONS=1)."""
    server, client = pki_files
    if request.param == "python":
        monkeypatch.setenv(tlsfront.NO_EXTENSIONS_ENV, "1")
    else:  # the parameter decides, whatever the run's environment says
        monkeypatch.delenv(tlsfront.NO_EXTENSIONS_ENV, raising=False)
        assert tlsfront.native_available(), tlsfront.how()
    acceptor = server.acceptor()
    assert (acceptor.native is not None) == (request.param == "native")
    return acceptor, client


@contextlib.contextmanager
def connected(contexts: tuple[tlsfront.Acceptor, ssl.SSLContext], send: Callable[[ssl.SSLSocket], object] = bool,
              *, hold: bool = True) -> Iterator[tlsfront.Conn]:
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
    receiver = server.accept(ours, 10.0)
    try:
        yield receiver
    finally:
        release.set()
        receiver.close()
        thread.join(10)
        assert not thread.is_alive()


def filler_of(sock: tlsfront.Conn) -> sockfill.Filler:
    return sockfill.Filler(sock)


def test_the_native_path_is_built() -> None:
    """`scripts/bootstrap` installs a C compiler and OpenSSL's headers, so the extension is built; without
    it uploads still work, only slower, which this test would not show otherwise."""
    assert tlsfront.native_available(), tlsfront.how()


def test_the_switch_turns_the_native_path_off(pki_files, monkeypatch: pytest.MonkeyPatch) -> None:
    server, _ = pki_files
    monkeypatch.setenv(tlsfront.NO_EXTENSIONS_ENV, "1")
    assert not tlsfront.native_enabled()
    assert server.acceptor().native is None
    assert "CDI_NO_EXTENSIONS" in tlsfront.how()


def test_fills_whole_buffers_across_many_records(contexts) -> None:
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


def test_a_pause_hands_over_what_arrived(contexts) -> None:
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


def test_nothing_arriving_is_a_timeout(contexts) -> None:
    with connected(contexts) as receiver, pytest.raises(TimeoutError):
        filler_of(receiver).fill(bytearray(MiB), 0.1, 0.1)


@pytest.mark.parametrize("notify", [True, False], ids=["close_notify", "no_close_notify"])
def test_the_end_comes_after_the_bytes_before_it(contexts, notify: bool) -> None:
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


def test_a_broken_tls_stream_fails_after_the_good_bytes(contexts) -> None:
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


def test_bytes_trickling_into_an_unfinished_record_do_not_extend_the_wait(contexts) -> None:
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


def test_no_code_reads_cpythons_private_ssl_structures() -> None:
    """Issue 20: the native path owns its OpenSSL objects; nothing under cdi/ reaches into the `ssl`
    module's (its `_sslobj`, or the layout of `_ssl._SSLSocket` from C)."""
    root = Path(__file__).resolve().parents[3] / "cdi"
    offenders = [str(p.relative_to(root)) for p in root.rglob("*") if p.suffix in (".py", ".c")
                 and any(word in p.read_text(errors="replace") for word in ("_sslobj", "_SSLSocket", "import _ssl"))]
    assert offenders == []
