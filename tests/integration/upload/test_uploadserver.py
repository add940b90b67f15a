"""The upload server in-process (its threaded front on a loopback port, the importer in a thread), with
the proxy's client certificate: CDI's endpoints and status codes, the formats through the importer's
data path, and the refusals."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from cdi.api.sizing import usable_space
from tests.support.cluster import async_wait_for
from tests.support.images import Image, file_name, sha256_file

from .conftest import OVERHEAD, VOLUME, Running, UploadPki, make_volumes, start_server

USABLE = usable_space(OVERHEAD, VOLUME)


def file_body(path: Path, chunk: int = 256 << 10) -> AsyncIterator[bytes]:
    data = path.read_bytes()

    async def gen() -> AsyncIterator[bytes]:
        for start in range(0, len(data), chunk):
            yield data[start:start + chunk]
    return gen()


async def post(running: Running, path: str, image: Path, **kw: object) -> tuple[int, str, dict[str, str]]:
    async with running.session.post(running.url + path, data=file_body(image), **kw) as resp:  # type: ignore[arg-type]
        return resp.status, await resp.text(), dict(resp.headers)


async def test_healthz_needs_no_client_certificate(upload_server: Running, upload_pki: UploadPki) -> None:
    async with aiohttp.ClientSession() as plain, plain.get(
            upload_server.url + "/healthz", ssl=upload_pki.client_context(anonymous=True)) as resp:
        assert resp.status == 200 and await resp.text() == "OK"


@pytest.mark.parametrize("name", [file_name("raw"), file_name("qcow2"), file_name("qcow2", "gz"), file_name("iso"),
                                  file_name("vmdk"), file_name("raw", "xz")])
async def test_sync_upload_of_each_format(upload_server: Running, images: dict[str, Image], name: str) -> None:
    image = images[name]
    status, text, _ = await post(upload_server, "/v1beta1/upload", image.path)
    assert (status, text) == (200, "")
    disk = upload_server.volumes.image
    assert sha256_file(disk, image.virtual_size) == image.sha256
    assert disk.stat().st_size == USABLE  # resized to the usable space, as an import
    session = upload_server.server.session
    assert session.state == "done" and session.finished.is_set()
    assert list(upload_server.volumes.scratch.iterdir()) == []  # type: ignore[union-attr]
    status, text, _ = await post(upload_server, "/v1beta1/upload", image.path)
    assert status == 409 and "already complete" in text


async def test_async_upload_answers_before_processing_ends(upload_server: Running, images: dict[str, Image]) -> None:
    image = images[file_name("qcow2")]
    async with upload_server.session.head(upload_server.url + "/v1alpha1/upload-async") as resp:
        assert resp.status == 200  # virtctl's capability probe
        assert resp.headers["Upload-State"] == "idle"
    status, text, _ = await post(upload_server, "/v1beta1/upload-async", image.path)
    assert (status, text) == (200, "")
    session = upload_server.server.session
    await upload_server.finished(30)
    assert session.state == "done" and session.result is not None and session.fatal is None
    assert sha256_file(upload_server.volumes.image, image.virtual_size) == image.sha256


async def test_form_upload_streams_the_file_part(upload_server: Running, images: dict[str, Image]) -> None:
    image = images[file_name("qcow2", "gz")]
    form = aiohttp.FormData()
    form.add_field("note", "parts before the file are skipped")
    form.add_field("file", file_body(image.path), filename=image.name, content_type="application/octet-stream")
    async with upload_server.session.post(upload_server.url + "/v1beta1/upload-form-async", data=form) as resp:
        assert resp.status == 200, await resp.text()
    await upload_server.finished(30)
    assert sha256_file(upload_server.volumes.image, image.virtual_size) == image.sha256


async def test_form_without_a_file_part_is_a_bad_request(upload_server: Running) -> None:
    form = aiohttp.FormData()
    form.add_field("image", b"not here", filename="x.img")
    async with upload_server.session.post(upload_server.url + "/v1beta1/upload-form", data=form) as resp:
        assert resp.status == 400 and "no part named 'file'" in await resp.text()
    assert upload_server.server.session.state == "idle"


async def test_block_volume(block_server: Running, images: dict[str, Image]) -> None:
    image = images[file_name("raw", "gz")]
    status, text, _ = await post(block_server, "/v1beta1/upload", image.path)
    assert (status, text) == (200, "")
    assert sha256_file(block_server.volumes.image, image.virtual_size) == image.sha256
    assert block_server.volumes.image.stat().st_size == 16 << 20


async def test_too_large_is_a_bad_request_and_the_server_stays_ready(
        upload_pki: UploadPki, tmp_path: Path, images: dict[str, Image]) -> None:
    running = await start_server(upload_pki, make_volumes(tmp_path), size=8 << 20)
    try:
        for name in (file_name("raw"), file_name("qcow2")):
            status, text, _ = await post(running, "/v1beta1/upload", images[name].path)
            assert status == 400
            assert text.startswith("effective image size is larger than the reported available storage: ")
            assert "larger than the usable space" in text
            assert running.server.session.state == "idle"
            assert not running.volumes.image.exists()  # nothing half-written left behind
        small = tmp_path / "small.img"
        small.write_bytes(b"\x01" * (1 << 20))
        status, text, _ = await post(running, "/v1beta1/upload", small)
        assert (status, text) == (200, "")
    finally:
        await running.close()


async def test_a_second_upload_during_the_first_gets_503(upload_server: Running, images: dict[str, Image]) -> None:
    image = images[file_name("raw")]
    release = asyncio.Event()

    data = image.path.read_bytes()

    async def slow_body() -> AsyncIterator[bytes]:
        yield data[:1 << 20]
        await release.wait()
        yield data[1 << 20:]

    first = asyncio.ensure_future(upload_server.session.post(upload_server.url + "/v1beta1/upload", data=slow_body()))
    session = upload_server.server.session
    while session.state != "uploading":
        await asyncio.sleep(0.01)
    status, text, headers = await post(upload_server, "/v1beta1/upload-async", image.path)
    assert status == 503 and "another upload is in progress" in text
    assert headers["Upload-State"] == "uploading"
    release.set()
    resp = await first
    assert resp.status == 200
    resp.release()


async def test_requests_without_the_proxy_certificate_are_refused(
        upload_server: Running, upload_pki: UploadPki, images: dict[str, Image]) -> None:
    image = images[file_name("raw")]
    for context in (upload_pki.client_context(anonymous=True), upload_pki.client_context(upload_pki.stranger)):
        async with aiohttp.ClientSession() as other, other.post(
                upload_server.url + "/v1beta1/upload", data=image.path.read_bytes(), ssl=context) as resp:
            assert resp.status == 401
    async with upload_server.session.get(upload_server.url + "/v1beta1/upload") as resp:
        assert resp.status == 404  # only POST, as CDI
    assert upload_server.server.session.state == "idle"


@pytest.fixture
def child_qcow2(tmp_path: Path) -> Path:
    child = tmp_path / "child.qcow2"
    subprocess.run(["qemu-img", "create", "-u", "-f", "qcow2", "-b", "/etc/passwd", "-F", "raw", str(child), "10M"],
                   check=True, capture_output=True)
    return child


async def test_an_unsafe_image_is_refused_with_its_reason(upload_server: Running, child_qcow2: Path) -> None:
    child = child_qcow2
    status, text, _ = await post(upload_server, "/v1beta1/upload", child)
    assert status == 400 and text.startswith("Saving stream failed: BackingFileNotAllowed: ")
    assert upload_server.server.session.state == "idle"


async def test_archive(upload_pki: UploadPki, tmp_path: Path) -> None:
    import tarfile
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.txt").write_text("hello")
    archive = tmp_path / "files.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(tree / "a.txt", arcname="a.txt")
    running = await start_server(upload_pki, make_volumes(tmp_path / "vol"), content_type="archive")
    try:
        status, text, _ = await post(running, "/v1beta1/upload-archive", archive)
        assert (status, text) == (200, "")
        assert (running.volumes.data / "a.txt").read_text() == "hello"
    finally:
        await running.close()


class ClientGaveUp(Exception):
    pass


async def cut_upload(running: Running, data: bytes, cut: int, path: str = "/v1beta1/upload", offset: int = 0) -> None:
    """POST `data` but abort the connection after `cut` bytes, as a dropped network would; returns once the
    server has seen the request (a HEAD right after the client gave up may come before it: still `idle`)."""
    before = running.server.session.bytes_received
    async def body():
        sent = 0
        while sent < cut:
            piece = data[sent:min(cut, sent + 100_000)]
            sent += len(piece)
            yield piece
            await asyncio.sleep(0)
        raise ClientGaveUp()

    with pytest.raises((aiohttp.ClientError, ClientGaveUp)):
        async with running.session.post(running.url + path, data=body(),
                                        headers={"Content-Length": str(len(data)),
                                                 **({"Upload-Offset": str(offset)} if offset else {})}) as resp:
            await resp.read()
    await async_wait_for(lambda: running.server.session.bytes_received > before, 30.0, 0.01,
                         message="the upload server to see the cut request")


async def offset_when_idle(running: Running) -> int:
    for _ in range(3000):
        async with running.session.head(running.url + "/v1beta1/upload") as resp:
            assert resp.status == 200
            if resp.headers["Upload-State"] == "idle":
                return int(resp.headers["Upload-Offset"])
        await asyncio.sleep(0.01)
    raise AssertionError("the upload server never noticed the cut")


def disk_bytes(seed: int, size: int) -> bytes:
    import random
    rng = random.Random(seed)
    data = bytearray(rng.randbytes(size))
    data[3 << 20:(4 << 20) + 12345] = bytes((1 << 20) + 12345)  # a zero run, not block aligned
    return bytes(data)


async def test_a_cut_raw_upload_resumes_from_the_durable_offset(upload_server: Running) -> None:
    data = disk_bytes(1, (12 << 20) + 777)
    await cut_upload(upload_server, data, 7_000_001)
    offset = await offset_when_idle(upload_server)
    assert 0 < offset <= 7_000_001
    async with upload_server.session.post(upload_server.url + "/v1beta1/upload", data=data[offset:] + b"",
                                          headers={"Upload-Offset": str(offset + 1)}) as resp:
        assert resp.status == 409 and f"holds {offset} resumable bytes" in await resp.text()
        assert resp.headers["Upload-Offset"] == str(offset)
    async with upload_server.session.post(upload_server.url + "/v1beta1/upload", data=data[offset:],
                                          headers={"Upload-Offset": str(offset)}) as resp:
        assert resp.status == 200, await resp.text()
    import hashlib
    disk = upload_server.volumes.image.read_bytes()
    assert hashlib.sha256(disk[:len(data)]).hexdigest() == hashlib.sha256(data).hexdigest()
    assert disk[len(data):] == bytes(len(disk) - len(data))
    result = upload_server.server.session.result
    assert result is not None and result.resumed_bytes == offset


async def test_a_cut_resumed_upload_can_resume_again(block_server: Running) -> None:
    data = disk_bytes(2, 10 << 20)
    await cut_upload(block_server, data, 3_000_000)
    first = await offset_when_idle(block_server)
    await cut_upload(block_server, data[first:], 3_000_000, offset=first)
    second = await offset_when_idle(block_server)
    assert second > first
    async with block_server.session.post(block_server.url + "/v1beta1/upload-async", data=data[second:],
                                         headers={"Upload-Offset": str(second)}) as resp:
        assert resp.status == 200, await resp.text()
    await block_server.finished(30)
    assert block_server.volumes.image.read_bytes()[:len(data)] == data


async def test_a_cut_qcow2_upload_starts_over(upload_server: Running, images: dict[str, Image]) -> None:
    data = images[file_name("qcow2")].path.read_bytes()
    await cut_upload(upload_server, data, len(data) // 2)
    assert await offset_when_idle(upload_server) == 0
    status, _, _ = await post(upload_server, "/v1beta1/upload", images[file_name("qcow2")].path)
    assert status == 200


async def test_a_silent_connection_is_given_up_and_can_be_resumed(upload_pki: UploadPki, tmp_path: Path) -> None:
    running = await start_server(upload_pki, make_volumes(tmp_path), idle_timeout=0.5)
    data = disk_bytes(3, 6 << 20)
    sent = 2_000_000
    forever = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield data[:sent]
        await forever.wait()  # the connection stays open and says nothing more

    try:
        hanging = asyncio.ensure_future(running.session.post(running.url + "/v1beta1/upload", data=body(),
                                                             headers={"Content-Length": str(len(data))}))
        offset = 0
        for _ in range(200):
            await asyncio.sleep(0.05)
            if running.server.session.state == "idle" and running.server.session.offset:
                offset = running.server.session.offset
                break
        assert offset == sent
        response = await hanging  # the server answered the silent request and closed it
        assert response.status == 400 and "stalled" in await response.text()
        response.release()
        async with running.session.post(running.url + "/v1beta1/upload", data=data[offset:],
                                        headers={"Upload-Offset": str(offset)}) as resp:
            assert resp.status == 200, await resp.text()
        assert running.volumes.image.read_bytes()[:len(data)] == data
    finally:
        forever.set()
        await running.close()


async def post_a_form_then_fall_silent(running: Running, head: bytes) -> tuple[int, str]:
    """A form whose client sends `head`, then keeps the connection open and says nothing more."""
    forever = asyncio.Event()

    async def body() -> AsyncIterator[bytes]:
        yield head
        await forever.wait()

    headers = {"Content-Length": str(len(head) + (4 << 20)), "Content-Type": "multipart/form-data; boundary=cut"}
    try:
        async with asyncio.timeout(30), running.session.post(running.url + "/v1beta1/upload-form", data=body(),
                                                             headers=headers) as resp:
            return resp.status, await resp.text()
    finally:
        forever.set()


async def test_a_form_silent_inside_its_file_part_is_a_stalled_upload(upload_pki: UploadPki,
                                                                      tmp_path: Path) -> None:
    """Once the part `file` began, the import watches the form as it watches a raw body: a quiet client is
    told the upload stalled (and after how many bytes), as for a raw upload, not that it went away."""
    running = await start_server(upload_pki, make_volumes(tmp_path), idle_timeout=0.5)
    head = (b"--cut\r\nContent-Disposition: form-data; name=\"file\"; filename=\"disk.raw\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n") + disk_bytes(5, 2_000_000)
    try:
        status, text = await post_a_form_then_fall_silent(running, head)
        assert status == 400, text
        assert "the upload stalled after" in text and "went away" not in text, text
        assert running.server.session.state == "idle"
    finally:
        await running.close()


async def test_a_form_silent_before_its_file_part_is_given_up(upload_pki: UploadPki, tmp_path: Path,
                                                               images: dict[str, Image]) -> None:
    """Until the part `file` begins no import watches a form: a client that sends the parts before it and then
    nothing would hold the server in `uploading` (every other upload refused) for ever. After `idle_timeout`
    it gets 408 and the server takes the next upload."""
    running = await start_server(upload_pki, make_volumes(tmp_path), idle_timeout=0.5)
    try:
        status, text = await post_a_form_then_fall_silent(
            running, b"--cut\r\nContent-Disposition: form-data; name=\"note\"\r\n\r\nfirst, a note\r\n")
        assert status == 408, text
        assert "stalled before its part 'file'" in text
        assert running.server.session.state == "idle"
        image = images[file_name("raw")]
        form = aiohttp.FormData()
        form.add_field("file", file_body(image.path), filename=image.name, content_type="application/octet-stream")
        async with running.session.post(running.url + "/v1beta1/upload-form", data=form) as resp:
            assert resp.status == 200, await resp.text()
        assert sha256_file(running.volumes.image, image.virtual_size) == image.sha256
    finally:
        await running.close()


@pytest.mark.parametrize("cut", [7_000_001, 4 << 20], ids=["in-data", "in-a-zero-run"])
async def test_a_restarted_upload_server_resumes_from_the_offset_kept_on_the_volume(
        upload_pki: UploadPki, tmp_path: Path, cut: int) -> None:
    """Everything a new upload server process knows comes from its configuration and the volume: a new
    server on the same volume answers the offset the first one kept, with digests of those bytes (also
    when the last of them are zeros the fresh file never got written)."""
    import hashlib

    from cdi.api.upload import parse_kept
    volumes = make_volumes(tmp_path)
    data = disk_bytes(4, (12 << 20) + 999)
    first = await start_server(upload_pki, volumes)
    try:
        await cut_upload(first, data, cut)
        offset = await offset_when_idle(first)
    finally:
        await first.close()
    assert (volumes.data / ".cdi-upload-state").exists()
    assert data[offset - 1:offset] == b"\0" or cut != 4 << 20
    second = await start_server(upload_pki, volumes)
    try:
        async with second.session.head(second.url + "/v1beta1/upload") as resp:
            assert resp.headers["Upload-State"] == "idle" and int(resp.headers["Upload-Offset"]) == offset > 0
            regions = parse_kept(resp.headers["Upload-Kept-Sha256"])
        assert regions and max(s + n for s, n, _ in regions) == offset
        assert all(hashlib.sha256(data[s:s + n]).hexdigest() == d for s, n, d in regions)
        async with second.session.post(second.url + "/v1beta1/upload", data=data[offset:],
                                       headers={"Upload-Offset": str(offset)}) as resp:
            assert resp.status == 200, await resp.text()
        disk = volumes.image.read_bytes()
        assert disk[:len(data)] == data
        assert not (volumes.data / ".cdi-upload-state").exists()  # done: nothing to resume any more
    finally:
        await second.close()


@pytest.mark.parametrize("change", ["volume-rewritten", "offset-forged", "digest-forged", "garbage"])
async def test_a_kept_offset_the_volume_does_not_back_is_not_offered(upload_pki: UploadPki, tmp_path: Path,
                                                                      change: str) -> None:
    """A stale or forged record never makes a server skip bytes that are not on the volume: it checks the
    regions again, and starts over (offset 0, the record removed) when they do not match."""
    import json
    volumes = make_volumes(tmp_path)
    data = disk_bytes(5, 10 << 20)
    first = await start_server(upload_pki, volumes)
    try:
        await cut_upload(first, data, 6_000_000)
        offset = await offset_when_idle(first)
    finally:
        await first.close()
    record = volumes.data / ".cdi-upload-state"
    body = json.loads(record.read_text())
    if change == "volume-rewritten":
        image = bytearray(volumes.image.read_bytes())
        image[offset - 10] ^= 0xFF
        volumes.image.write_bytes(image)
    elif change == "offset-forged":
        body["offset"] = offset + (1 << 20)
    elif change == "digest-forged":
        body["regions"][-1][2] = "0" * 64
    if change == "garbage":
        record.write_text("{not json")
    else:
        record.write_text(json.dumps(body))
    second = await start_server(upload_pki, volumes)
    try:
        async with second.session.head(second.url + "/v1beta1/upload") as resp:
            assert resp.headers["Upload-Offset"] == "0" and "Upload-Kept-Sha256" not in resp.headers
        async with second.session.post(second.url + "/v1beta1/upload", data=data[offset:],
                                       headers={"Upload-Offset": str(offset)}) as resp:
            assert resp.status == 409  # the server holds nothing to continue
        assert not record.exists()
    finally:
        await second.close()


async def test_a_cut_form_upload_fails_and_the_next_one_is_taken(upload_server: Running,
                                                                 images: dict[str, Image]) -> None:
    """A form whose connection drops inside its `file` part is not taken as complete (a form streams into
    the importer part by part, so the cut is seen there), and the server takes a new upload."""
    image = images[file_name("raw")]
    data = image.path.read_bytes()
    head = (b"--cut\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.img\"\r\n"
            b"Content-Type: application/octet-stream\r\n\r\n")
    whole = head + data + b"\r\n--cut--\r\n"
    before = upload_server.server.session.bytes_received

    async def body() -> AsyncIterator[bytes]:
        yield whole[:len(head) + len(data) // 2]
        raise ClientGaveUp()

    with pytest.raises((aiohttp.ClientError, ClientGaveUp)):
        async with upload_server.session.post(upload_server.url + "/v1beta1/upload-form", data=body(), headers={
                "Content-Length": str(len(whole)), "Content-Type": "multipart/form-data; boundary=cut"}) as resp:
            await resp.read()
    await async_wait_for(lambda: upload_server.server.session.bytes_received > before, 30.0, 0.01,
                         message="the upload server to see the cut form")
    await offset_when_idle(upload_server)
    assert upload_server.server.session.result is None
    form = aiohttp.FormData()
    form.add_field("file", file_body(image.path), filename=image.name, content_type="application/octet-stream")
    async with upload_server.session.post(upload_server.url + "/v1beta1/upload-form", data=form) as resp:
        assert resp.status == 200, await resp.text()
    assert sha256_file(upload_server.volumes.image, image.virtual_size) == image.sha256


async def test_metrics_say_how_far_an_upload_is_without_a_client_certificate(upload_server: Running,
                                                                            upload_pki: UploadPki) -> None:
    """An upload held half way: `GET /metrics` (the controller's scrape, no client certificate) says the transfer
    step with the bytes received of the Content-Length, as the controller reads an importer's."""
    from cdi.controller.progress import parse_progress, parse_step

    data = disk_bytes(2, 8 << 20)
    half = len(data) // 2
    release = asyncio.Event()
    owner = upload_server.server.config.owner_uid

    async def body() -> AsyncIterator[bytes]:
        yield data[:half]
        await release.wait()
        yield data[half:]

    async def scrape() -> str:
        async with aiohttp.ClientSession() as plain, plain.get(
                upload_server.url + "/metrics", ssl=upload_pki.client_context(anonymous=True)) as resp:
            assert resp.status == 200
            return await resp.text()

    assert await scrape() == ""  # nothing before the first upload
    posted = asyncio.ensure_future(upload_server.session.post(
        upload_server.url + "/v1beta1/upload", data=body(), headers={"Content-Length": str(len(data))}))
    try:
        async def half_way() -> str | None:
            text = await scrape()
            step = parse_step(text, owner)
            return text if step is not None and step.done >= half else None

        text = await async_wait_for(half_way, 30.0, message="the metrics showing the first half")
        step = parse_step(text, owner)
        assert step is not None and (step.phase, step.done, step.total) == ("TransferDataFile", half, len(data))
        progress = parse_progress(text, owner)
        assert progress is not None and 40 < progress < 50
    finally:
        release.set()
    async with await posted as resp:
        assert resp.status == 200
    assert parse_progress(await scrape(), owner) == 100
