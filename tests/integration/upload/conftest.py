"""Fixtures of the upload tests: the upload PKI, an in-process upload server on temp-dir volumes (its
threads serve the test's client; it has no event loop, the test's loop runs only the client), and
the importer tests' image set (built once per session, in a directory of its own per builder version,
so that worktrees with another version of the image builder never rebuild it under our feet).

Every test here runs twice: with the upload server's TLS through the C extension, and through the `ssl`
module (`CDI_NO_EXTENSIONS=1`), so that both paths are tested in CI."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from cdi.api import upload as names
from cdi.common import pki, tlsfront
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.server import UploadServer
from tests.support.images import Image, upload_image_set

VOLUME = 32 << 20
OVERHEAD = "0.055"


@pytest.fixture(autouse=True, params=["native", "python"])
def tls_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Which TLS implementation the servers started by the test use (`cdi.common.tlsfront`)."""
    if request.param == "python":
        monkeypatch.setenv(tlsfront.NO_EXTENSIONS_ENV, "1")
    else:
        monkeypatch.delenv(tlsfront.NO_EXTENSIONS_ENV, raising=False)
        assert tlsfront.native_enabled(), tlsfront.how()
    return str(request.param)


@dataclass(frozen=True)
class UploadPki:
    directory: Path
    server_ca: pki.KeyPair
    client_ca: pki.KeyPair
    client: pki.KeyPair
    stranger: pki.KeyPair  # signed by the client CA, with the wrong CN

    def client_context(self, pair: pki.KeyPair | None = None, *, anonymous: bool = False) -> ssl.SSLContext:
        """Trusting the server CA, presenting `pair` (default: the proxy's client certificate)."""
        context = ssl.create_default_context(cadata=self.server_ca.cert_pem.decode())
        chosen = None if anonymous else pair or self.client
        if chosen is not None:
            path = self.directory / f"client-{chosen.certificate().serial_number}"
            path.mkdir(exist_ok=True)
            chosen.write(path / "tls.crt", path / "tls.key")
            context.load_cert_chain(path / "tls.crt", path / "tls.key")
        return context


@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    return upload_image_set(tmp_path_factory)


@pytest.fixture(scope="session")
def upload_pki(tmp_path_factory: pytest.TempPathFactory) -> UploadPki:
    directory = tmp_path_factory.mktemp("upload-pki")
    server_ca, client_ca = pki.make_ca("cdi-uploadserver-signer"), pki.make_ca("cdi-uploadserver-client-signer")
    server = pki.issue(server_ca, "cdi-upload-disk.default.svc", ["127.0.0.1", "cdi-upload-disk.default.svc"])
    server.write(directory / "tls.crt", directory / "tls.key")
    (directory / "ca.crt").write_bytes(client_ca.cert_pem)
    client = pki.issue(client_ca, names.CLIENT_NAME, None, server=False, client=True)
    stranger = pki.issue(client_ca, "somebody-else", None, server=False, client=True)
    return UploadPki(directory, server_ca, client_ca, client, stranger)


@dataclass
class Volumes:
    data: Path
    scratch: Path | None
    block: Path | None
    termination_log: Path

    @property
    def image(self) -> Path:
        return self.block if self.block is not None else self.data / "disk.img"


def make_volumes(root: Path, *, block: bool = False, scratch: bool = True, size: int = VOLUME) -> Volumes:
    data = root / "data"
    data.mkdir(parents=True)
    scratch_dir = root / "scratch" if scratch else None
    if scratch_dir is not None:
        scratch_dir.mkdir()
    device = None
    if block:
        device = root / "cdi-block-volume"
        with open(device, "wb") as f:
            f.truncate(size)
    return Volumes(data, scratch_dir, device, root / "termination-log")


def server_config(upload_pki: UploadPki, volumes: Volumes, *, size: int = VOLUME, content_type: str = "kubevirt",
                  preallocation: bool = False, idle_timeout: float = 120.0) -> UploadServerConfig:
    return UploadServerConfig(
        listen_host="127.0.0.1", listen_port=0, cert_file=upload_pki.directory / "tls.crt",
        key_file=upload_pki.directory / "tls.key", client_ca_file=upload_pki.directory / "ca.crt",
        client_name=names.CLIENT_NAME, destination=volumes.block or volumes.data / "disk.img", image_size=size,
        filesystem_overhead="0" if volumes.block else OVERHEAD, preallocation=preallocation,
        content_type=content_type, owner_uid="uid-1", scratch_dir=volumes.scratch,
        termination_log=volumes.termination_log, idle_timeout=idle_timeout,
        state_dir=volumes.scratch if volumes.block else volumes.data)


@dataclass
class Running:
    server: UploadServer
    volumes: Volumes
    session: aiohttp.ClientSession

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.server.port}"

    async def finished(self, timeout: float) -> None:
        """Until the upload server's upload ended (done, or failed after its answer): time for it to exit."""
        assert await asyncio.to_thread(self.server.session.finished.wait, timeout), "the upload never finished"

    async def close(self) -> None:
        await self.session.close()
        await asyncio.to_thread(self.server.stop)  # waits for its connection threads


async def start_server(upload_pki: UploadPki, volumes: Volumes, **kw: object) -> Running:
    server = UploadServer(server_config(upload_pki, volumes, **kw))  # type: ignore[arg-type]
    server.start()
    connector = aiohttp.TCPConnector(ssl=upload_pki.client_context(), force_close=True)
    return Running(server, volumes, aiohttp.ClientSession(connector=connector))


@pytest.fixture
async def upload_server(upload_pki: UploadPki, tmp_path: Path) -> AsyncIterator[Running]:
    running = await start_server(upload_pki, make_volumes(tmp_path))
    yield running
    await running.close()


@pytest.fixture
async def block_server(upload_pki: UploadPki, tmp_path: Path) -> AsyncIterator[Running]:
    running = await start_server(upload_pki, make_volumes(tmp_path, block=True, size=16 << 20), size=16 << 20)
    yield running
    await running.close()
