"""An HTTPS-intercepting proxy, as corporate networks run them (and what CDIConfig's
`importProxy.trustedCAProxy` exists for): it answers `CONNECT host:port`, then, instead of relaying
the client's TLS, completes the handshake itself with a certificate for `host` signed by its own CA,
and forwards the decrypted bytes to the real server over a TLS connection of its own. A client gets
through only if it trusts the proxy's CA.

`hold()` keeps every new tunnel waiting after its CONNECT until `release()`, so a test can look at
the client while it is connected; `tunnels` lists the CONNECT targets, `intercepted` counts the
handshakes clients completed under the proxy's certificate."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
from pathlib import Path

from cdi.common import pki
from tests.support.servers import _LoopThread


class InterceptingProxy:
    def __init__(self, ca: pki.KeyPair, upstream_ca: bytes, workdir: Path) -> None:
        self.ca = ca
        self.tunnels: list[str] = []
        self.intercepted = 0
        self._workdir = workdir
        self._upstream = ssl.create_default_context(cadata=upstream_ca.decode())
        self._contexts: dict[str, ssl.SSLContext] = {}
        self._lock = threading.Lock()
        self._loop = _LoopThread()
        self._released = asyncio.Event()
        self._loop.run(self._set_released())
        self._server: asyncio.Server = self._loop.run(asyncio.start_server(self._accept, "127.0.0.1", 0))
        self.port = int(self._server.sockets[0].getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def hold(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._released.clear)

    def release(self) -> None:
        self._loop.loop.call_soon_threadsafe(self._released.set)

    def close(self) -> None:
        self.release()
        self._server.close()
        self._loop.stop()

    async def _set_released(self) -> None:
        self._released.set()

    def _context_for(self, host: str) -> ssl.SSLContext:
        if host not in self._contexts:
            pair = pki.issue(self.ca, host, [host])
            self._contexts[host] = pki.server_context(pair, self._workdir / f"leaf-{host}")
        return self._contexts[host]

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            method, target, _ = (await reader.readline()).decode("latin-1").split(" ", 2)
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass
            if method != "CONNECT":
                writer.write(b"HTTP/1.1 405 Method Not Allowed\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
                return
            with self._lock:
                self.tunnels.append(target)
            await self._released.wait()
            host, _, port = target.rpartition(":")
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
            await writer.drain()
            await writer.start_tls(self._context_for(host))
            with self._lock:
                self.intercepted += 1
            up_reader, upstream = await asyncio.open_connection(host, int(port), ssl=self._upstream,
                                                                server_hostname=host)
            await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
        except (OSError, ValueError, ssl.SSLError, asyncio.IncompleteReadError):
            pass  # a client that gave up (or refused our certificate): nothing to forward
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(256 * 1024):
            writer.write(chunk)
            await writer.drain()
    except (OSError, ssl.SSLError):
        pass
    finally:
        with contextlib.suppress(OSError, RuntimeError):
            writer.close()
