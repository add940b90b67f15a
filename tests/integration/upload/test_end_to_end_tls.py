"""End-to-end TLS at the upload server (`cdi.api.upload`): the proxy's upgrade request (mutual TLS, with a
nonce) is answered 101, and the client's own TLS session on that connection is served only with that
nonce. Driven with blocking sockets and h11, as the proxy and `cdi image-upload` do."""

from __future__ import annotations

import asyncio
import secrets
import socket
import ssl
from dataclasses import dataclass

import h11

from cdi.api import upload as names
from cdi.common import sockhttp
from tests.support.images import Image, file_name, sha256_file

from .conftest import Running, UploadPki

SERVER_NAME = "cdi-upload-disk.default.svc"


@dataclass
class Answer:
    status: int
    text: str


def _answer(sock: socket.socket, conn: h11.Connection, event: h11.Event | None = None) -> Answer:
    """The answer (from `event`, when its head was read already)."""
    event = event or sockhttp.read_event(sock, conn)
    assert isinstance(event, h11.Response), event
    body = bytearray()
    while isinstance(chunk := sockhttp.read_event(sock, conn), h11.Data):
        body += chunk.data
    return Answer(event.status_code, body.decode())


def upgrade(running: Running, context: ssl.SSLContext, nonce: str, path: str = "/v1beta1/upload",
            body: bytes = b"") -> socket.socket | Answer:
    """The proxy's part: the upgrade request; the plain socket after a 101, else the refusal."""
    sock = context.wrap_socket(socket.create_connection(("127.0.0.1", running.server.port), timeout=30),
                               server_hostname=SERVER_NAME)
    conn = h11.Connection(h11.CLIENT)
    headers = [(b"Host", b"x"), (b"Content-Length", str(len(body)).encode()), (b"Connection", b"Upgrade"),
               (b"Upgrade", names.TLS_UPGRADE.encode()), (names.NONCE_HEADER.encode(), nonce.encode())]
    sock.sendall(conn.send(h11.Request(method=b"POST", target=path, headers=headers)) + body)
    event = sockhttp.read_event(sock, conn)
    if isinstance(event, h11.InformationalResponse) and event.status_code == 101:
        return sockhttp.unwrap(sock)
    with sock:
        return _answer(sock, conn, event)


def send_upload(plain: socket.socket, upload_pki: UploadPki, nonce: str, data: bytes) -> Answer:
    """The client's part: TLS with the upload server (trusting its CA), the upload with the nonce."""
    context = ssl.create_default_context(cadata=upload_pki.server_ca.cert_pem.decode())
    with context.wrap_socket(plain, server_hostname=SERVER_NAME) as sock:
        conn = h11.Connection(h11.CLIENT)
        sock.sendall(conn.send(h11.Request(method=b"POST", target="/ignored", headers=[
            (b"Host", SERVER_NAME.encode()), (b"Content-Length", str(len(data)).encode()),
            (names.NONCE_HEADER.encode(), nonce.encode())])) + data)
        return _answer(sock, conn)


async def test_an_upgraded_upload_lands_on_the_volume(upload_server: Running, upload_pki: UploadPki,
                                                      images: dict[str, Image]) -> None:
    image = images[file_name("qcow2")]
    nonce = secrets.token_urlsafe(32)

    def run() -> Answer:
        plain = upgrade(upload_server, upload_pki.client_context(), nonce)
        assert isinstance(plain, socket.socket), plain
        return send_upload(plain, upload_pki, nonce, image.path.read_bytes())

    assert await asyncio.to_thread(run) == Answer(200, "")
    assert sha256_file(upload_server.volumes.image, image.virtual_size) == image.sha256
    assert upload_server.server.session.state == "done"


async def test_only_the_proxy_can_upgrade(upload_server: Running, upload_pki: UploadPki) -> None:
    nonce = secrets.token_urlsafe(32)
    for context in (upload_pki.client_context(anonymous=True), upload_pki.client_context(upload_pki.stranger)):
        answer = await asyncio.to_thread(upgrade, upload_server, context, nonce)
        assert answer == Answer(401, f"a client certificate for {names.CLIENT_NAME} is required")
    assert upload_server.server.session.state == "idle"


async def test_malformed_upgrades_are_refused(upload_server: Running, upload_pki: UploadPki) -> None:
    context = upload_pki.client_context()
    wanted = f"an upgrade to {names.TLS_UPGRADE} needs a raw upload path, no body and a {names.NONCE_HEADER}"
    for nonce, path, body in (("short", "/v1beta1/upload", b""),
                              (secrets.token_urlsafe(32), "/v1beta1/upload-form", b""),
                              (secrets.token_urlsafe(32), "/v1beta1/upload", b"a body")):
        answer = await asyncio.to_thread(upgrade, upload_server, context, nonce, path, body)
        assert isinstance(answer, Answer) and answer.status == 400 and answer.text.startswith(wanted), answer
    assert upload_server.server.session.state == "idle"


async def test_a_session_without_the_nonce_is_refused_and_loses_nothing(
        upload_server: Running, upload_pki: UploadPki, images: dict[str, Image]) -> None:
    """Somebody who took over the TCP connection after the switch has no nonce: 401, and the server
    stays ready for the real upload."""
    image = images[file_name("raw")]
    nonce = secrets.token_urlsafe(32)

    def hijacked() -> Answer:
        plain = upgrade(upload_server, upload_pki.client_context(), nonce)
        assert isinstance(plain, socket.socket), plain
        return send_upload(plain, upload_pki, secrets.token_urlsafe(32), image.path.read_bytes())

    assert await asyncio.to_thread(hijacked) == Answer(401, f"{names.NONCE_HEADER} does not match")
    assert upload_server.server.session.state == "idle"

    def honest() -> Answer:
        other = secrets.token_urlsafe(32)
        plain = upgrade(upload_server, upload_pki.client_context(), other)
        assert isinstance(plain, socket.socket), plain
        return send_upload(plain, upload_pki, other, image.path.read_bytes())

    assert await asyncio.to_thread(honest) == Answer(200, "")
    assert sha256_file(upload_server.volumes.image, image.virtual_size) == image.sha256
