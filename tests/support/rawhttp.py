"""An HTTP/1.1 upload sent byte by byte as the test says, over TLS: every way a request body can be framed
(Content-Length, chunked with small or large chunks, with trailers, behind `Expect: 100-continue`, a
multipart form) and cut short at any byte. HTTP client libraries choose the framing themselves and never
send a broken body; the upload tests need both under their control."""

from __future__ import annotations

import contextlib
import socket
import ssl
from collections.abc import Iterator
from dataclasses import dataclass, field

BOUNDARY = "cdi-test-boundary-7f3a"


@dataclass(frozen=True)
class Framing:
    """How the body goes on the wire."""

    chunk: int | None = None  # chunked with chunks of this size; None: Content-Length
    trailers: tuple[tuple[str, str], ...] = ()
    expect: bool = False  # send `Expect: 100-continue` and wait for the 100 before the body
    form: bool = False  # the image as the `file` part of a multipart/form-data body
    extra_headers: tuple[tuple[str, str], ...] = field(default=())

    @property
    def name(self) -> str:
        parts = [f"chunked-{self.chunk}" if self.chunk else "length"]
        parts += ["trailers"] * bool(self.trailers) + ["expect"] * self.expect + ["form"] * self.form
        return "-".join(parts)


@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the connection closed without an answer
    text: str


def payload(image: bytes, framing: Framing) -> bytes:
    """The request's content before transfer framing (the image itself, or the form around it)."""
    if not framing.form:
        return image
    head = (f"--{BOUNDARY}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"disk.img\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n").encode()
    return head + image + f"\r\n--{BOUNDARY}--\r\n".encode()


def post(address: tuple[str, int], context: ssl.SSLContext, server_hostname: str, path: str, image: bytes,
         framing: Framing, *, headers: dict[str, str] | None = None, cut_at: int | None = None,
         timeout: float = 120.0) -> Answer:
    """POST `image` framed as `framing`; with `cut_at`, only that many bytes of the (framed) body are
    sent before the connection is shut for writing: a body that ends early."""
    content = payload(image, framing)
    head = [f"POST {path} HTTP/1.1", f"Host: {server_hostname}", "Connection: close"]
    head += [f"{k}: {v}" for k, v in (headers or {}).items()]
    head += [f"{k}: {v}" for k, v in framing.extra_headers]
    if framing.form:
        head.append(f"Content-Type: multipart/form-data; boundary={BOUNDARY}")
    else:
        head.append("Content-Type: application/octet-stream")
    if framing.chunk:
        head.append("Transfer-Encoding: chunked")
        if framing.trailers:
            head.append("Trailer: " + ", ".join(k for k, _ in framing.trailers))
    else:
        head.append(f"Content-Length: {len(content)}")
    if framing.expect:
        head.append("Expect: 100-continue")
    raw = socket.create_connection(address, timeout=timeout)
    with context.wrap_socket(raw, server_hostname=server_hostname) as sock:
        sock.sendall(("\r\n".join(head) + "\r\n\r\n").encode())
        received = b""
        if framing.expect:
            received = _read_until_status(sock)
            if not received.startswith(b"HTTP/1.1 100"):
                return _parse(received + _read_all(sock))
            received = received.split(b"\r\n\r\n", 1)[1]
        sent = 0
        with contextlib.suppress(OSError):  # the server may answer and close before the whole body
            for piece in _framed(content, framing):
                if cut_at is not None and sent + len(piece) >= cut_at:
                    sock.sendall(piece[:cut_at - sent])
                    break
                sock.sendall(piece)
                sent += len(piece)
            if cut_at is not None:
                socket.socket.shutdown(sock, socket.SHUT_WR)  # the body ends here, early
        return _parse(received + _read_all(sock))


def _framed(content: bytes, framing: Framing) -> Iterator[bytes]:
    view = memoryview(content)
    if not framing.chunk:
        for start in range(0, len(view), 1 << 20):
            yield view[start:start + (1 << 20)].tobytes()
        return
    size = framing.chunk
    batch: list[bytes] = []
    for start in range(0, len(view), size):  # many small chunks go out in batches of about a MiB
        piece = view[start:start + size]
        batch.append(b"%x\r\n" % len(piece) + piece.tobytes() + b"\r\n")
        if len(batch) * size >= 1 << 20:
            yield b"".join(batch)
            batch = []
    trailers = "".join(f"{k}: {v}\r\n" for k, v in framing.trailers).encode()
    yield b"".join(batch) + b"0\r\n" + trailers + b"\r\n"


def _read_until_status(sock: ssl.SSLSocket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        if not more:
            break
        data += more
    return data


def _read_all(sock: ssl.SSLSocket) -> bytes:
    data = b""
    with contextlib.suppress(OSError):
        while more := sock.recv(65536):
            data += more
    return data


def _parse(raw: bytes) -> Answer:
    while raw.startswith(b"HTTP/1.1 100"):
        raw = raw.split(b"\r\n\r\n", 1)[1]
    if not raw.startswith(b"HTTP/1.1 "):
        return Answer(None, raw.decode(errors="replace"))
    head, _, body = raw.partition(b"\r\n\r\n")
    return Answer(int(head.split()[1]), body.decode(errors="replace"))


# Every way a body can arrive at an upload endpoint (path, framing): the upload integrity tests send the
# same image each way, through the proxy and straight to the upload server.
WAYS: tuple[tuple[str, Framing], ...] = (
    ("/v1beta1/upload", Framing()),
    ("/v1beta1/upload-async", Framing(expect=True)),
    ("/v1beta1/upload", Framing(chunk=4096)),
    ("/v1beta1/upload-async", Framing(chunk=8 << 20)),
    ("/v1beta1/upload", Framing(chunk=65536, trailers=(("X-Upload-Note", "the end"),), expect=True)),
    ("/v1beta1/upload-async", Framing(chunk=1000, expect=True)),
    ("/v1beta1/upload-form", Framing(form=True)),
    ("/v1beta1/upload-form-async", Framing(form=True, chunk=65536, expect=True)),
)
# A body of each kind that ends early: Content-Length, chunked (in the middle of a chunk), a form.
CUTS: tuple[tuple[str, Framing], ...] = (
    ("/v1beta1/upload", Framing()),
    ("/v1beta1/upload-async", Framing(chunk=65536)),
    ("/v1beta1/upload-form-async", Framing(form=True, chunk=65536)),
)


def way_id(way: tuple[str, Framing]) -> str:
    return f"{way[0].rsplit('/', 1)[1]}-{way[1].name}"


def framed_size(image: bytes, framing: Framing) -> int:
    return sum(len(piece) for piece in _framed(payload(image, framing), framing))
