"""Real servers for the importer's integration tests, started by the tests themselves.

* `FileServer`: aiohttp serving a directory over HTTP or HTTPS, with basic auth, Range support
  (or none), counting the bytes it serves, and hooks to make it misbehave on purpose: a gate that
  holds every byte past an offset until the test opens it, scripted failures (5xx, dropped
  connections), redirects, and a bandwidth throttle. It records who asked (User-Agent), and it
  answers absolute-form requests (`GET http://host/name`) too, so it also serves as a plain-HTTP
  proxy in front of its own files.
* `TokenServer`: a registry token service (the WWW-Authenticate Bearer flow) issuing JWTs that
  docker-registry verifies against the test CA.
* `Registry`: Debian's docker-registry with a config written here (htpasswd, TLS, token auth).
* `TLSMotoServer`: moto's S3 server behind TLS from the test CA.
* `MuteServer`: takes requests and never answers (or cuts every connection before a response).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import email.utils
import hashlib
import json
import logging
import os
import re
import socket
import ssl
import subprocess
import threading
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from aiohttp import web
from cryptography.hazmat.primitives import serialization
from cryptography.x509 import load_pem_x509_certificate
from moto.server import DomainDispatcherApplication, ThreadedMotoServer, create_backend_app
from werkzeug.serving import make_server

from cdi.common import pki
from tests.support.waiting import wait_for

CHUNK = 256 * 1024
# importers killed on purpose leave responses half-written: not worth a traceback in the test log
logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)


# where the tests' file servers listen, and the address their URLs name: pods must reach it (`cdi up`'s run on
# this machine; a real cluster's reach the node's bridge address, see tests/e2e/target.py)
SERVE_HOST = os.environ.get("CDI_E2E_SERVE_HOST", "127.0.0.1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _LoopThread:
    """An asyncio loop in a daemon thread, for servers the test process hosts."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(30)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@dataclass
class Fault:
    """What the next matching request gets instead of a normal answer."""

    status: int = 503  # 200: no failure (lets one request through, to script "then fail")
    drop_after: int | None = None  # send headers and this many body bytes, then drop the connection


@dataclass
class _Body:
    name: str
    path: Path
    start: int
    length: int
    fault: Fault | None


@dataclass
class FileServer:
    root: Path
    ssl_context: ssl.SSLContext | None = None
    auth: tuple[str, str] | None = None
    ranges: bool = True
    throttle: float | None = None  # bytes per second per response
    validators: bool = True  # send ETag and Last-Modified
    bytes_served: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)
    agents: list[tuple[str, str]] = field(default_factory=list)  # (name, User-Agent) of every request
    faults: dict[str, list[Fault]] = field(default_factory=lambda: defaultdict(list))
    gate_offset: int | None = None  # bytes in [gate_offset, gate_end) wait for `open_gate()`
    gate_end: int | None = None
    host: str = field(default_factory=lambda: SERVE_HOST)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._gate = threading.Event()
        self._loop = _LoopThread()
        app = web.Application()
        app.router.add_route("GET", "/redirect/{name:.+}", self._redirect)
        app.router.add_route("*", "/{name:.+}", self._serve)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run(self._runner.setup())
        self.port = free_port()
        site = web.TCPSite(self._runner, self.host, self.port, ssl_context=self.ssl_context)
        self._loop.run(site.start())

    @property
    def url(self) -> str:
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

    def close(self) -> None:
        self._gate.set()
        self._loop.run(self._runner.cleanup())
        self._loop.stop()

    # -- test controls --------------------------------------------------------------------------------
    def reset_counters(self) -> None:
        with self._lock:
            self.bytes_served.clear()
            self.requests.clear()
            self.agents.clear()

    def served(self, name: str) -> int:
        with self._lock:
            return self.bytes_served.get(name, 0)

    def close_gate(self, offset: int, end: int | None = None) -> None:
        self._gate.clear()
        self.gate_offset, self.gate_end = offset, end

    def open_gate(self) -> None:
        self.gate_offset = None
        self._gate.set()

    def fail_next(self, name: str, *faults: Fault) -> None:
        with self._lock:
            self.faults[name].extend(faults)

    # -- handlers -------------------------------------------------------------------------------------
    async def _redirect(self, request: web.Request) -> web.StreamResponse:
        with self._lock:
            self.requests.append((request.method, "redirect/" + request.match_info["name"], None))
        raise web.HTTPFound(f"/{request.match_info['name']}")

    def _authorized(self, request: web.Request) -> bool:
        if self.auth is None:
            return True
        expected = "Basic " + base64.b64encode(f"{self.auth[0]}:{self.auth[1]}".encode()).decode()
        return request.headers.get("Authorization") == expected

    async def _serve(self, request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        with self._lock:
            self.requests.append((request.method, name, request.headers.get("Range")))
            self.agents.append((name, request.headers.get("User-Agent", "")))
            fault = self.faults[name].pop(0) if self.faults.get(name) else None
        if fault is not None and fault.status == 200 and fault.drop_after is None:
            fault = None
        if not self._authorized(request):
            return web.Response(status=401, headers={"WWW-Authenticate": 'Basic realm="images"'})
        path = self.root / name
        if not path.is_file():
            return web.Response(status=404, text="not found")
        if fault is not None and fault.drop_after is None:
            return web.Response(status=fault.status, text="scripted failure")
        st = path.stat()
        size = st.st_size
        headers = {"Content-Type": "application/octet-stream"}
        if self.validators:
            headers["ETag"] = f'"{st.st_mtime_ns:x}-{size:x}"'
            headers["Last-Modified"] = email.utils.formatdate(st.st_mtime, usegmt=True)
        start, end, status = 0, size - 1, 200
        range_header = request.headers.get("Range")
        if self.ranges:
            headers["Accept-Ranges"] = "bytes"
            match = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
            if match:
                start = int(match.group(1))
                end = min(int(match.group(2)) if match.group(2) else size - 1, size - 1)
                if start >= size:
                    return web.Response(status=416, headers={"Content-Range": f"bytes */{size}"})
                status = 206
                headers["Content-Range"] = f"bytes {start}-{end}/{size}"
        length = max(0, end - start + 1)
        headers["Content-Length"] = str(length)
        response = web.StreamResponse(status=status, headers=headers)
        await response.prepare(request)
        if request.method == "HEAD":
            return response
        await self._send_body(request, response, _Body(name, path, start, length, fault))
        return response

    async def _send_body(self, request: web.Request, response: web.StreamResponse, body: _Body) -> None:
        name, start, length, fault = body.name, body.start, body.length, body.fault
        sent = 0
        with body.path.open("rb") as f:  # small local files, in the server's own loop thread
            while sent < length:
                offset = start + sent
                gate = self.gate_offset
                gate_end = self.gate_end
                held = gate is not None and (gate_end is None or offset < gate_end)
                if held and gate is not None and offset + CHUNK > gate and not self._gate.is_set():
                    if offset < gate:
                        n = gate - offset
                    else:
                        while not self._gate.is_set():
                            await asyncio.sleep(0.02)
                        continue
                else:
                    n = min(CHUNK, length - sent)
                n = min(n, length - sent)
                if fault is not None and fault.drop_after is not None and sent + n > fault.drop_after:
                    n = fault.drop_after - sent
                    if n > 0:
                        await response.write(os.pread(f.fileno(), n, offset))
                        self._count(name, n)
                    transport = request.transport
                    if transport is not None:
                        transport.abort()
                    return
                data = os.pread(f.fileno(), n, offset)
                await response.write(data)
                self._count(name, len(data))
                sent += len(data)
                if self.throttle:
                    await asyncio.sleep(len(data) / self.throttle)

    def _count(self, name: str, n: int) -> None:
        with self._lock:
            self.bytes_served[name] += n


class MuteServer:
    """A TCP server that takes HTTP requests and never answers a byte: with `cut`, it closes each
    connection as soon as the request has arrived (every response cut before its first byte);
    without, it holds the connection open and says nothing (a server that accepts and never answers)."""

    def __init__(self, *, cut: bool) -> None:
        self.cut = cut
        self.requests = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._loop = _LoopThread()
        self._server = self._loop.run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                try:
                    await reader.readuntil(b"\r\n\r\n")  # a request (a GET has no body)
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                self.requests += 1
                if self.cut:
                    return
        finally:
            self._writers.discard(writer)
            writer.transport.abort()

    def close(self) -> None:
        async def shut() -> None:
            self._server.close()
            for writer in list(self._writers):
                writer.transport.abort()
        self._loop.run(shut())
        self._loop.stop()


# -- registry -----------------------------------------------------------------------------------------
def _key_id(cert_pem: bytes) -> str:
    """libtrust's key ID of a certificate's public key (how docker-registry names token signing keys)."""
    public = load_pem_x509_certificate(cert_pem).public_key()
    der = public.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    digest = base64.b32encode(hashlib.sha256(der).digest()[:30]).decode().rstrip("=")
    return ":".join(digest[i : i + 4] for i in range(0, len(digest), 4))


class TokenServer:
    """Issues registry bearer tokens for users it knows (the token realm of docker-registry)."""

    def __init__(
        self,
        ca: pki.KeyPair,
        users: dict[str, str],
        issuer: str = "cdi-test-issuer",
        service: str = "cdi-test-registry",
    ) -> None:
        self.signer = pki.issue(ca, "token-signer", server=False)
        self.users = users
        self.issuer = issuer
        self.service = service
        self.requests = 0
        self._loop = _LoopThread()
        app = web.Application()
        app.router.add_get("/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run(self._runner.setup())
        self.port = free_port()
        self._loop.run(web.TCPSite(self._runner, "127.0.0.1", self.port).start())

    @property
    def realm(self) -> str:
        return f"http://127.0.0.1:{self.port}/token"

    async def _token(self, request: web.Request) -> web.Response:
        self.requests += 1
        header = request.headers.get("Authorization", "")
        subject = ""
        if header.startswith("Basic "):
            user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            if self.users.get(user) != password:
                return web.Response(status=401, text="bad credentials")
            subject = user
        access = []
        for scope in request.query.getall("scope", []):
            kind, _, rest = scope.partition(":")
            repo, _, actions = rest.rpartition(":")
            allowed = actions.split(",") if subject else []
            access.append({"type": kind, "name": repo, "actions": allowed})
        now = int(time.time())
        claims = {
            "iss": self.issuer,
            "sub": subject,
            "aud": self.service,
            "exp": now + 300,
            "nbf": now - 10,
            "iat": now,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        token = jwt.encode(
            claims, self.signer.key_pem, algorithm="ES256", headers={"kid": _key_id(self.signer.cert_pem)}
        )
        return web.json_response({"token": token, "access_token": token})

    def close(self) -> None:
        self._loop.run(self._runner.cleanup())
        self._loop.stop()



GOOGLE_TOKEN_AUDIENCE = "https://oauth2.googleapis.com/token"  # google-auth's grants name it, whatever token_uri


class OAuthTokenServer:
    """Google's OAuth 2.0 token endpoint for service-account keys (the `token_uri` of a key file): it
    checks the signed JWT grant against the key it knows and answers with an access token."""

    def __init__(self) -> None:
        from cryptography.hazmat.primitives.asymmetric import rsa

        self.key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.grants: list[dict[str, Any]] = []  # verified claims, in order
        self.refused = 0
        self._loop = _LoopThread()
        app = web.Application()
        app.router.add_post("/token", self._token)
        self._runner = web.AppRunner(app, access_log=None)
        self._loop.run(self._runner.setup())
        self.port = free_port()
        self._loop.run(web.TCPSite(self._runner, "127.0.0.1", self.port).start())

    def key_file(self, *, other_key: bool = False) -> str:
        """A service-account key file (JSON) whose grants this server accepts (`other_key`: refuses)."""
        from cryptography.hazmat.primitives.asymmetric import rsa

        key = rsa.generate_private_key(public_exponent=65537, key_size=2048) if other_key else self.key
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        return json.dumps({
            "type": "service_account", "project_id": "cdi-test", "private_key_id": "k1", "private_key": pem,
            "client_email": "importer@cdi-test.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": f"http://127.0.0.1:{self.port}/token",
        })

    async def _token(self, request: web.Request) -> web.Response:
        form = await request.post()
        try:
            claims = jwt.decode(str(form.get("assertion", "")), self.key.public_key(), algorithms=["RS256"],
                                audience=GOOGLE_TOKEN_AUDIENCE)
        except jwt.PyJWTError as exc:
            self.refused += 1
            return web.json_response({"error": "invalid_grant", "error_description": str(exc)}, status=400)
        self.grants.append(claims)
        return web.json_response({"access_token": uuid.uuid4().hex, "token_type": "Bearer", "expires_in": 3600})

    def close(self) -> None:
        self._loop.run(self._runner.cleanup())
        self._loop.stop()

class Registry:
    """docker-registry on 127.0.0.1 with storage in a temp dir; htpasswd, TLS and token auth optional."""

    def __init__(
        self,
        workdir: Path,
        *,
        htpasswd: Path | None = None,
        tls: pki.KeyPair | None = None,
        token: TokenServer | None = None,
        ca: pki.KeyPair | None = None,
    ) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.tls = tls is not None
        lines = [
            "version: 0.1",
            "log:",
            "  level: error",
            "storage:",
            "  filesystem:",
            f"    rootdirectory: {workdir / 'data'}",
            "http:",
            f"  addr: 127.0.0.1:{self.port}",
        ]
        if tls is not None:
            tls.write(workdir / "tls.crt", workdir / "tls.key")
            lines += ["  tls:", f"    certificate: {workdir / 'tls.crt'}", f"    key: {workdir / 'tls.key'}"]
        if htpasswd is not None:
            lines += ["auth:", "  htpasswd:", "    realm: cdi-test", f"    path: {htpasswd}"]
        elif token is not None:
            assert ca is not None
            (workdir / "token-ca.crt").write_bytes(token.signer.cert_pem + ca.cert_pem)
            lines += [
                "auth:",
                "  token:",
                f"    realm: {token.realm}",
                f"    service: {token.service}",
                f"    issuer: {token.issuer}",
                f"    rootcertbundle: {workdir / 'token-ca.crt'}",
            ]
        (workdir / "config.yml").write_text("\n".join(lines) + "\n")
        self.log = open(workdir / "registry.log", "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(workdir / "config.yml")],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        wait_for(self._ready, 30, message="docker-registry to listen")

    def _ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"docker-registry exited: {Path(self.log.name).read_text()}")
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def htpasswd_file(path: Path, user: str, password: str) -> Path:
    subprocess.run(["htpasswd", "-B", "-b", "-c", str(path), user, password], check=True, capture_output=True)
    return path


class TLSMotoServer(ThreadedMotoServer):
    """moto's S3 server over TLS with a certificate from the test CA."""

    def __init__(self, pair: pki.KeyPair, workdir: Path) -> None:
        super().__init__(ip_address="127.0.0.1", port=free_port(), verbose=False)
        workdir.mkdir(parents=True, exist_ok=True)
        self._cert, self._key = workdir / "moto.crt", workdir / "moto.key"
        pair.write(self._cert, self._key)

    def _server_entry(self) -> None:
        app = DomainDispatcherApplication(create_backend_app)
        self._server = make_server(
            self._ip_address, self._port, app, True, ssl_context=(str(self._cert), str(self._key))
        )
        self._server_ready_event.set()
        self._server.serve_forever()


def json_bytes(data: Any) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


def contextual_close(*objs: Any) -> None:
    for obj in objs:
        with contextlib.suppress(Exception):
            obj.close()
