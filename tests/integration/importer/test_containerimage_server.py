"""The node-pull server (registry `pullMethod: node`) against hostile clients (issue 26, point 3).

The server listens on the pod's IP, where any pod of the cluster can reach it while the import runs.
The one it replaced overflowed its stack on a 12 KiB header. Here the server is installed as the
init container installs it (`cdi-importer --install-containerimage-server`), run with the pod's
command line on loopback over a directory holding one image, and sent oversized heads, malformed
request lines, NUL bytes, absurd ranges, path traversal, pipelined requests, silent clients and
clients that hang up mid-request. Each must get an HTTP answer (a crashed worker gives none) that
never carries wrong bytes of the image nor any other file; and afterwards the server still serves
the image, whole and by ranges, as the importer reads it, and stops on the done file."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import os
import re
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cdi.importer import containerimage
from tests.support.servers import free_port
from tests.support.waiting import wait_for

IMAGE_NAME = "disk.qcow2"
IMAGE_SIZE = 3 * (1 << 20) + 123  # not a multiple of anything the importer reads in
SECRET = b"a file beside the image that no client may read"
PREFERENCE = "fedora \"quoted\" \\ and\ttabbed"


@dataclass
class Server:
    """A running server and what it serves: the tests compare every byte it sends with `image`."""

    process: subprocess.Popen[bytes]
    address: tuple[str, int]
    image: bytes
    shared: Path
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


def start(tmp: Path, image_dir: Path, env: dict[str, str] | None = None) -> tuple[subprocess.Popen[bytes], Path,
                                                                                     Path, int]:
    """Install the server into a fresh shared directory and run it with the pod's command line."""
    shared = tmp / "shared"
    shared.mkdir()
    assert containerimage.install(str(shared / "server")) == 0
    port = free_port()
    log = tmp / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [str(shared / "server"), "-p", str(port), "-image-dir", str(image_dir),
             "-ready-file", str(shared / "ready"), "-done-file", str(shared / "done")],
            env={"PATH": os.environ.get("PATH", ""), "POD_IP": "127.0.0.1", **(env or {})},
            stdout=out, stderr=subprocess.STDOUT)
    return process, shared, log, port


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("nodepull-server")
    image_dir = tmp / "disk"
    image_dir.mkdir()
    image = os.urandom(IMAGE_SIZE)
    (image_dir / IMAGE_NAME).write_bytes(image)
    (tmp / "secret").write_bytes(SECRET)
    process, shared, log, port = start(
        tmp, image_dir, {"INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE": PREFERENCE})
    try:
        wait_for(lambda: (shared / "ready").exists() or process.poll() is not None, timeout=30,
                 message="the server's ready file")
        assert process.poll() is None, log.read_text()
        yield Server(process, ("127.0.0.1", port), image, shared, log)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- a client that sends exactly the bytes the test says --------------------------------------------------
@dataclass(frozen=True)
class Answer:
    status: int | None  # None: the connection closed without an answer
    headers: dict[str, str]
    body: bytes


def exchange(address: tuple[str, int], raw: bytes, *, hang_up: bool = False, timeout: float = 10.0) -> Answer:
    """Send `raw` (all of it, unless the server answers and closes first) and read one answer; with
    `hang_up` the request ends there (shut for writing)."""
    with socket.create_connection(address, timeout=timeout) as sock:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(raw)
            if hang_up:
                sock.shutdown(socket.SHUT_WR)
        return read_answer(sock)


def read_answer(sock: socket.socket, data: bytes = b"") -> Answer:
    """One answer, as long as its Content-Length says (a server may keep the connection open), or up
    to the close without one; status None if the connection closes before a whole head."""
    buf = bytearray(data)

    def more() -> bool:
        with contextlib.suppress(ConnectionResetError):
            if chunk := sock.recv(1 << 16):
                buf.extend(chunk)
                return True
        return False

    while b"\r\n\r\n" not in buf:
        if not more():
            return Answer(None, {}, bytes(buf))
    answer = parse(bytes(buf))
    length = answer.headers.get("content-length")
    while (len(answer.body) < int(length)) if length is not None else True:
        if not more():
            break
        answer = parse(bytes(buf))
    return answer


def parse(data: bytes) -> Answer:
    head, _, body = data.partition(b"\r\n\r\n")
    match = re.match(rb"HTTP/1\.[01] (\d{3}) ", head)
    if not match:
        return Answer(None, {}, data)
    headers = {}
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.decode("latin-1").partition(":")
        headers[key.strip().lower()] = value.strip()
    return Answer(int(match.group(1)), headers, body)


def check_answer(server: Server, answer: Answer, allowed: set[int | None]) -> None:
    """An answer the test allows, never wrong bytes of the image, never another file."""
    assert answer.status in allowed, (answer.status, answer.body[:300])
    assert SECRET not in answer.body
    assert not answer.body.startswith((b"#!", b"\x7fELF"))  # neither the script nor busybox
    if answer.status == 200 and answer.headers.get("content-length") == str(IMAGE_SIZE):
        assert answer.body == server.image
    if answer.status == 206:
        match = re.fullmatch(r"bytes (\d+)-(\d+)/(\d+)", answer.headers.get("content-range", ""))
        assert match, answer.headers
        first, last, total = map(int, match.groups())
        assert total == len(server.image)
        assert answer.body == server.image[first:last + 1]


def get(server: Server, path: str, headers: dict[str, str] | None = None, method: str = "GET"
        ) -> tuple[int, dict[str, str], bytes]:
    """A request as the importer's HTTP client sends it."""
    conn = http.client.HTTPConnection(*server.address, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def assert_still_serving(server: Server) -> None:
    assert server.process.poll() is None, server.log_text()
    status, _, body = get(server, f"/{IMAGE_NAME}")
    assert status == 200 and hashlib.sha256(body).digest() == hashlib.sha256(server.image).digest()
    status, headers, body = get(server, f"/{IMAGE_NAME}", {"Range": "bytes=1048576-2097151"})
    assert status == 206 and headers["content-range"] == f"bytes 1048576-2097151/{IMAGE_SIZE}"
    assert hashlib.sha256(body).digest() == hashlib.sha256(server.image[1 << 20:2 << 20]).digest()


# -- what the importer asks -------------------------------------------------------------------------------
def test_the_importer_reads_the_image_whole_by_ranges_and_its_labels(server: Server) -> None:
    assert (server.shared / "ready").read_text() == IMAGE_NAME
    status, headers, body = get(server, f"/{IMAGE_NAME}", method="HEAD")
    assert status == 200 and int(headers["content-length"]) == IMAGE_SIZE and body == b""
    # the importer's first request: the first MiB, whose answer gives the size
    status, headers, body = get(server, f"/{IMAGE_NAME}", {"Range": "bytes=0-1048575"})
    assert status == 206 and headers["content-range"] == f"bytes 0-1048575/{IMAGE_SIZE}"
    assert body == server.image[:1 << 20]
    # then spans up to the end, the last one short
    status, headers, body = get(server, f"/{IMAGE_NAME}", {"Range": f"bytes={3 << 20}-{(4 << 20) - 1}"})
    assert status == 206 and body == server.image[3 << 20:]
    assert_still_serving(server)
    labels = containerimage.info_labels(f"http://{server.address[0]}:{server.address[1]}/{IMAGE_NAME}")
    assert labels["instancetype.kubevirt.io/default-preference"] == PREFERENCE
    status, _, body = get(server, "/info")
    assert "POD_IP=127.0.0.1" in json.loads(body)["Env"]


# -- hostile requests ---------------------------------------------------------------------------------------
DISK = f"/{IMAGE_NAME}".encode()
ANSWERED = {200, 206, 400, 404, 413, 416, 431}
REFUSED = {400, 403, 404}
HOSTILE = {
    # oversized heads: one long header line, and many short ones
    "12KiB header line": (b"GET %s HTTP/1.1\r\nX-Big: %s\r\n\r\n" % (DISK, b"a" * (12 << 10)), ANSWERED),
    "64KiB header line": (b"GET %s HTTP/1.1\r\nX-Big: %s\r\n\r\n" % (DISK, b"a" * (64 << 10)), ANSWERED),
    "1MiB header line": (b"GET %s HTTP/1.1\r\nX-Big: %s\r\n\r\n" % (DISK, b"a" * (1 << 20)), ANSWERED),
    "64KiB of headers": (b"GET %s HTTP/1.1\r\n%s\r\n" % (DISK, b"X-Many: b\r\n" * ((64 << 10) // 11)),
                         {200, 413, 431}),
    "12KiB request target": (b"GET /%s HTTP/1.1\r\n\r\n" % (b"a" * (12 << 10)), {400, 404, 414, 431}),
    "LF without CR": (b"GET %s HTTP/1.1\nHost: x\n\n" % DISK, {200, 400}),
    "NUL in the target": (b"GET /disk\x00.qcow2 HTTP/1.1\r\n\r\n", REFUSED),
    "NUL in a header": (b"GET %s HTTP/1.1\r\nX-Nul: a\x00b\r\n\r\n" % DISK, {200, 400}),
    "NUL bytes only": (b"\x00" * 4096 + b"\r\n\r\n", {400, None}),
    # ranges the importer never sends
    "huge range start": (b"GET %s HTTP/1.1\r\nRange: bytes=99999999999999999999999-\r\n\r\n" % DISK, {200, 416}),
    "20000-digit range": (b"GET %s HTTP/1.1\r\nRange: bytes=%s-\r\n\r\n" % (DISK, b"9" * 20000), {200, 413, 416, 431}),
    "negative range": (b"GET %s HTTP/1.1\r\nRange: bytes=-5-10\r\n\r\n" % DISK, {200, 206, 416}),
    "backwards range": (b"GET %s HTTP/1.1\r\nRange: bytes=5-2\r\n\r\n" % DISK, {200, 416}),
    "range end past 2^64": (b"GET %s HTTP/1.1\r\nRange: bytes=0-18446744073709551616\r\n\r\n" % DISK, {200, 206}),
    "range end 2^63-1": (b"GET %s HTTP/1.1\r\nRange: bytes=1-9223372036854775807\r\n\r\n" % DISK, {200, 206}),
    "range past the end": (b"GET %s HTTP/1.1\r\nRange: bytes=%d-%d\r\n\r\n" % (DISK, IMAGE_SIZE, IMAGE_SIZE + 9),
                           {200, 416}),
    "multiple ranges": (b"GET %s HTTP/1.1\r\nRange: bytes=0-1,5-9\r\n\r\n" % DISK, {200, 206, 416}),
    "not a range": (b"GET %s HTTP/1.1\r\nRange: pages=1-2\r\n\r\n" % DISK, {200}),
    # request lines
    "a word": (b"GARBAGE\r\n\r\n", {400, 501}),
    "a method alone": (b"GET\r\n\r\n", {400}),
    "no version": (b"GET %s\r\n\r\n" % DISK, {400}),
    "an empty line": (b"\r\n\r\n", {400, None}),
    "an unknown version": (b"GET /info HTTP/9.9\r\n\r\n", {200, 400, 505}),
    "POST": (b"POST %s HTTP/1.1\r\nContent-Length: 3\r\n\r\nabc" % DISK, {400, 405, 501}),
    "DELETE": (b"DELETE %s HTTP/1.1\r\n\r\n" % DISK, {400, 405, 501}),
    "absolute URI": (b"GET http://127.0.0.1/disk.qcow2 HTTP/1.1\r\n\r\n", {200, 400, 404}),
    # other files
    "../": (b"GET /../secret HTTP/1.1\r\n\r\n", REFUSED),
    "%2e%2e": (b"GET /%2e%2e/secret HTTP/1.1\r\n\r\n", REFUSED),
    "%2E%2E twice": (b"GET /%2E%2E/%2E%2E/secret HTTP/1.1\r\n\r\n", REFUSED),
    "..%2f": (b"GET /..%2fsecret HTTP/1.1\r\n\r\n", REFUSED),
    "through the image": (b"GET /disk.qcow2/../../secret HTTP/1.1\r\n\r\n", REFUSED),
    "the server script": (b"GET /server HTTP/1.1\r\n\r\n", REFUSED),
    "busybox": (b"GET /busybox HTTP/1.1\r\n\r\n", REFUSED),
    "the ready file": (b"GET /ready HTTP/1.1\r\n\r\n", REFUSED),
    "the httpd configuration": (b"GET /httpd.conf HTTP/1.1\r\n\r\n", REFUSED),
    "a CGI": (b"GET /cgi-bin/sh HTTP/1.1\r\n\r\n", REFUSED),
    "the root": (b"GET / HTTP/1.1\r\n\r\n", REFUSED),
    "an absolute path": (b"GET /etc/passwd HTTP/1.1\r\n\r\n", REFUSED),
}


@pytest.mark.parametrize(("raw", "allowed"), HOSTILE.values(), ids=HOSTILE.keys())
def test_a_hostile_request_gets_an_answer_and_nothing_it_should_not(server: Server, raw: bytes,
                                                                    allowed: set[int | None]) -> None:
    check_answer(server, exchange(server.address, raw), allowed)
    assert_still_serving(server)


def test_a_head_without_its_end_gets_an_answer_or_a_close(server: Server) -> None:
    """A client that sends a header line without CRLF and stops sending (its half-close is the end)."""
    answer = exchange(server.address, b"GET %s HTTP/1.1\r\nHost: x" % DISK, hang_up=True)
    check_answer(server, answer, {200, 400, None})
    assert_still_serving(server)


def test_pipelined_requests(server: Server) -> None:
    """Two requests in one send: the first is answered in full, and the second, if the server keeps
    the connection, with the right bytes too."""
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"GET /info HTTP/1.1\r\n\r\nGET %s HTTP/1.1\r\nRange: bytes=0-9\r\n\r\n" % DISK)
        first = read_answer(sock)
        assert first.status == 200
        length = int(first.headers["content-length"])
        assert json.loads(first.body[:length])["Env"]
        second = read_answer(sock, first.body[length:])
    assert second.status in (206, None) and SECRET not in second.body
    if second.status == 206:
        assert second.body == server.image[:10]
    assert_still_serving(server)


def test_clients_that_hang_up_mid_request(server: Server) -> None:
    for cut in (1, 5, 20, len(DISK) + 10, 40):
        raw = b"GET %s HTTP/1.1\r\nRange: bytes=0-1048575\r\n\r\n" % DISK
        with socket.create_connection(server.address, timeout=10) as sock:
            sock.sendall(raw[:cut])
    # and one that hangs up while the image is on its way
    with socket.create_connection(server.address, timeout=10) as sock:
        sock.sendall(b"GET %s HTTP/1.1\r\n\r\n" % DISK)
        assert sock.recv(100).startswith(b"HTTP/1.1 200")
    assert_still_serving(server)


def test_silent_clients_do_not_hold_up_the_importer(server: Server) -> None:
    """Connections that send nothing, or half a head and then nothing, stay open while the importer's
    own requests are answered at once."""
    silent = []
    try:
        for i in range(20):
            sock = socket.create_connection(server.address, timeout=10)
            if i % 2:
                sock.sendall(b"GET %s HTTP/1.1\r\nRange: by" % DISK)
            silent.append(sock)
        done = threading.Event()
        failure: list[BaseException] = []

        def importer() -> None:
            try:
                assert_still_serving(server)
            except BaseException as exc:  # handed to the test's thread
                failure.append(exc)
            done.set()

        threading.Thread(target=importer, daemon=True).start()
        assert done.wait(15), "the image was not served while silent clients were connected"
        assert not failure, failure
    finally:
        for sock in silent:
            sock.close()


def test_it_stops_on_the_done_file_and_says_what_it_did(tmp_path: Path) -> None:
    """The importer's done file stops the server (its own, not the module's: tests may run in any
    order), which exits 0 and removes its files."""
    image_dir = tmp_path / "disk"
    image_dir.mkdir()
    (image_dir / "disk.img").write_bytes(b"x" * 4096)
    process, shared, log, port = start(tmp_path, image_dir)
    try:
        wait_for(lambda: (shared / "ready").exists() or process.poll() is not None, timeout=30,
                 message="the server's ready file")
        assert (shared / "ready").read_text() == "disk.img"
        (shared / "done").touch()
        assert process.wait(timeout=15) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert not (shared / "ready").exists() and not (shared / "done").exists()
    assert log.read_text().splitlines() == [f"Serving {image_dir} on HTTP port: {port}", "Importer has completed"]


# -- what it refuses to serve -------------------------------------------------------------------------------
@pytest.mark.parametrize("files", [[], ["a.img", "b.img"]], ids=["no file", "two files"])
def test_an_image_without_exactly_one_file_is_refused(tmp_path: Path, files: list[str]) -> None:
    image_dir = tmp_path / "disk"
    image_dir.mkdir()
    for name in files:
        (image_dir / name).write_bytes(b"x")
    process, shared, log, _ = start(tmp_path, image_dir)
    assert process.wait(timeout=30) == 1
    assert "Invalid container image" in log.read_text()
    assert not (shared / "ready").exists()


def test_a_port_in_use_fails_the_server_instead_of_a_silent_wait(tmp_path: Path) -> None:
    """httpd cannot bind: the server exits 1 and never writes the ready file, so the importer's wait
    ends in its timeout rather than in requests to some other program on that port."""
    image_dir = tmp_path / "disk"
    image_dir.mkdir()
    (image_dir / "disk.img").write_bytes(b"x")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        shared = tmp_path / "shared"
        shared.mkdir()
        assert containerimage.install(str(shared / "server")) == 0
        log = tmp_path / "server.log"
        with log.open("wb") as out:
            code = subprocess.run(
                [str(shared / "server"), "-p", str(port), "-image-dir", str(image_dir),
                 "-ready-file", str(shared / "ready"), "-done-file", str(shared / "done")],
                env={"POD_IP": "127.0.0.1"}, stdout=out, stderr=subprocess.STDOUT, timeout=60, check=False).returncode
    assert code == 1
    assert f"httpd could not serve on 127.0.0.1:{port}" in log.read_text()
    assert not (shared / "ready").exists()
