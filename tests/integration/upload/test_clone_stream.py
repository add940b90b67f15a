"""The host-assisted clone stream between the real clone source program (`cdi.cloner.source`) and a
real upload server: only allocated extents travel, the target ends byte-identical and sparse, a
Block target's old contents between extents read as zeros afterwards, and a client without the clone
source's certificate is refused."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
from pathlib import Path

import pytest

from cdi.cloner.source import CloneError, Progress, SourceConfig, send
from cdi.common import clonestream
from tests.integration.upload.conftest import UploadPki, make_volumes, start_server
from tests.support.cluster import async_wait_for

MIB = 1 << 20


def sparse_source(path: Path, size: int) -> bytes:
    """A sparse image with data at three places; returns its bytes."""
    with open(path, "wb") as f:
        f.truncate(size)
        for offset in (0, 5 * MIB + 123, size - 4096):
            f.seek(offset)
            f.write(os.urandom(4096))
    return path.read_bytes()


def config(upload_pki: UploadPki, port: int, source_dir: Path, *, stranger: bool = False) -> SourceConfig:
    pair = upload_pki.stranger if stranger else upload_pki.client
    return SourceConfig(upload_url=f"https://127.0.0.1:{port}/v1beta1/upload", server_name="",
                        client_cert=pair.cert_pem.decode(), client_key=pair.key_pem.decode(),
                        server_ca=upload_pki.server_ca.cert_pem.decode(), owner_uid="uid-1", block=False,
                        mount_point=source_dir, pod_ip="")


@pytest.mark.parametrize("block", [False, True])
async def test_extents_arrive_identical_and_sparse(upload_pki: UploadPki, tmp_path: Path, block: bool) -> None:
    volumes = make_volumes(tmp_path / "target", block=block, scratch=False, size=16 * MIB)
    if block:
        assert volumes.block is not None
        volumes.block.write_bytes(b"\xff" * 16 * MIB)  # old contents that must not survive between extents
    running = await start_server(upload_pki, volumes, size=16 * MIB)
    try:
        source_dir = tmp_path / "source"
        source_dir.mkdir()
        original = sparse_source(source_dir / "disk.img", 16 * MIB)
        progress = Progress("uid-1")
        sent = await asyncio.to_thread(send, config(upload_pki, running.server.port, source_dir), progress)
        assert 3 * 4096 <= sent <= 4 * 4096  # only the data blocks (page-rounded by the file system) travel
        assert progress.percent == 100.0
        assert running.server.clone_result is not None and running.server.clone_done.is_set()
        copy = volumes.image.read_bytes()
        assert hashlib.sha256(copy[:16 * MIB]).hexdigest() == hashlib.sha256(original).hexdigest()
        if not block:
            assert os.stat(volumes.image).st_blocks * 512 <= 256 * 1024, "the copy lost its holes"
    finally:
        await running.close()


async def test_a_client_without_the_clone_sources_certificate_is_refused(upload_pki: UploadPki,
                                                                          tmp_path: Path) -> None:
    volumes = make_volumes(tmp_path / "target", scratch=False)
    running = await start_server(upload_pki, volumes)
    try:
        source_dir = tmp_path / "source"
        source_dir.mkdir()
        sparse_source(source_dir / "disk.img", 16 * MIB)
        with pytest.raises(CloneError, match="401"):
            await asyncio.to_thread(send, config(upload_pki, running.server.port, source_dir, stranger=True),
                                    Progress("uid-1"))
        assert running.server.clone_result is None
        assert not (volumes.data / "disk.img").exists()
    finally:
        await running.close()


def _send_cut(upload_pki: UploadPki, port: int, size: int, sent: int) -> None:
    """A clone stream that announces one extent of 1 MiB but stops after `sent` bytes of it: the source
    pod died (its connection closes)."""
    stream = clonestream.MAGIC + clonestream.HEADER.pack(size) + clonestream.EXTENT.pack(0, MIB)
    length = len(stream) + MIB + clonestream.EXTENT.size
    context = upload_pki.client_context()
    with context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=30),
                             server_hostname="127.0.0.1") as sock:
        sock.sendall(f"POST /v1beta1/upload HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n"
                     f"x-cdi-content-type: {clonestream.FILESYSTEM_CLONE}\r\n\r\n".encode()
                     + stream + os.urandom(sent))


async def test_a_cut_stream_fails_the_clone_and_a_retry_succeeds(upload_pki: UploadPki, tmp_path: Path) -> None:
    """The source pod's connection ends inside an extent: the server does not complete the clone (it
    would otherwise exit with a truncated image as `Clone Complete`); the stream sent again
    from the start completes it."""
    volumes = make_volumes(tmp_path / "target", scratch=False, size=16 * MIB)
    running = await start_server(upload_pki, volumes, size=16 * MIB)
    try:
        await asyncio.to_thread(_send_cut, upload_pki, running.server.port, 16 * MIB, 300 << 10)
        # the server took the stream (it created the image) and is done with it
        await async_wait_for(lambda: volumes.image.exists() and running.server.in_flight == 0, 30)
        assert running.server.clone_result is None and not running.server.clone_done.is_set()
        source_dir = tmp_path / "source"
        source_dir.mkdir()
        original = sparse_source(source_dir / "disk.img", 16 * MIB)
        await asyncio.to_thread(send, config(upload_pki, running.server.port, source_dir), Progress("uid-1"))
        assert running.server.clone_done.is_set()
        assert hashlib.sha256(volumes.image.read_bytes()[:16 * MIB]).digest() == hashlib.sha256(original).digest()
    finally:
        await running.close()
