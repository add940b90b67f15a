"""The pipeline's stream entry point, as the upload server will call it: a plain byte stream fed
from another thread, through the same detection, validation, conversion and checksum code."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdi.importer import (
    FileTarget,
    ImporterError,
    ImportOptions,
    Reason,
    import_stream,
)
from cdi.importer.checksum import expected_checksum
from cdi.uploadserver.feed import FedStream
from tests.support.images import Image, file_name, sha256_file

from .harness import OVERHEAD, REQUESTED, USABLE


def feed(stream: FedStream, path: Path, chunk: int = 100_000) -> threading.Thread:
    """An uploader from a thread, as the upload server's receiving thread: writes the file into the stream in
    odd-sized pieces, then finishes it (or stops when the pipeline has closed the stream)."""

    def run() -> None:
        with open(path, "rb") as f:
            while data := f.read(chunk):
                if not stream.put(data, threading.Event()):
                    return
        stream.finish()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def options(scratch: Path | None = None, checksum: str = "") -> ImportOptions:
    return ImportOptions(
        requested_size=REQUESTED,
        filesystem_overhead=OVERHEAD,
        scratch_dir=scratch,
        checksum=expected_checksum(checksum),
    )


@pytest.mark.parametrize(
    "name", [file_name("raw", "xz"), file_name("iso"), file_name("qcow2-compressed"), file_name("vhdx", "gz")]
)
def test_import_stream(name: str, images: dict[str, Image], tmp_path: Path) -> None:
    image = images[name]
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    body = FedStream(1 << 20)
    uploader = feed(body, image.path)
    result = import_stream(body, FileTarget(data), options(scratch, f"sha256:{image.file_sha256}"), size=None)
    uploader.join(30)
    assert result.virtual_size == image.virtual_size
    assert result.checksum == f"sha256:{image.file_sha256}"
    assert result.bytes_transferred == image.file_size
    assert sha256_file(data / "disk.img", image.virtual_size) == image.sha256
    assert (data / "disk.img").stat().st_size == USABLE
    assert list(scratch.iterdir()) == []


def test_import_stream_needs_scratch_for_vmdk(images: dict[str, Image], tmp_path: Path) -> None:
    image = images[file_name("vmdk")]
    body = FedStream(64 << 20)
    feed(body, image.path)
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(tmp_path), options())
    body.close()
    assert info.value.reason == Reason.SCRATCH_SPACE_REQUIRED
    assert info.value.scratch_space_required
    assert info.value.retryable


def test_import_stream_refuses_a_backing_file(tmp_path: Path) -> None:
    import subprocess

    subprocess.run(
        [
            "qemu-img",
            "create",
            "-u",
            "-f",
            "qcow2",
            "-b",
            "base.qcow2",
            "-F",
            "qcow2",
            str(tmp_path / "child.qcow2"),
            "10M",
        ],
        check=True,
        capture_output=True,
    )
    body = FedStream(64 << 20)
    feed(body, tmp_path / "child.qcow2")
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(data), options(tmp_path))
    body.close()
    assert info.value.reason == Reason.BACKING_FILE_NOT_ALLOWED
    assert not (data / "disk.img").exists()


def test_producer_failure_reaches_the_pipeline(tmp_path: Path) -> None:
    body = FedStream(64 << 20)
    assert body.put(b"\x00" * 1000, threading.Event())
    body.fail(ImporterError(Reason.CONNECTION_FAILED, "the client went away", retryable=True))
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(tmp_path), options())
    assert info.value.reason == Reason.CONNECTION_FAILED


@pytest.fixture(scope="module")
def late_l1(images: dict[str, Image], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Image]:
    """A qcow2 whose L1 table comes after all its data (a resize moved it to the end of the file)."""
    import subprocess

    base = images[file_name("raw")]
    path = tmp_path_factory.mktemp("late-l1") / "late.qcow2"
    subprocess.run(
        [
            "qemu-img",
            "convert",
            "-f",
            "raw",
            "-O",
            "qcow2",
            "-o",
            "cluster_size=512",
            str(base.path),
            str(path),
        ],
        check=True,
    )
    subprocess.run(
        ["qemu-img", "resize", "-f", "qcow2", str(path), str(base.virtual_size * 2)],
        check=True,
        capture_output=True,
    )
    header = path.read_bytes()[:72]
    assert int.from_bytes(header[40:48], "big") > path.stat().st_size // 2, "the L1 table did not move"
    return path, base


def test_streamed_qcow2_with_tables_after_the_data(late_l1: tuple[Path, Image], tmp_path: Path) -> None:
    path, base = late_l1
    body = FedStream(64 << 20)
    feed(body, path)
    result = import_stream(body, FileTarget(tmp_path), options())
    assert result.route == "qcow2-stream"
    assert result.virtual_size == base.virtual_size * 2
    assert sha256_file(tmp_path / "disk.img", base.virtual_size) == base.sha256
    assert result.scratch_bytes == 0  # held in memory


def test_streamed_qcow2_spills_to_scratch_when_memory_is_not_enough(
    late_l1: tuple[Path, Image], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdi.importer import qcow2_stream

    monkeypatch.setattr(qcow2_stream, "SPILL_MEMORY", 1 << 20)
    path, base = late_l1
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    body = FedStream(64 << 20)
    feed(body, path)
    result = import_stream(body, FileTarget(data), options(scratch))
    assert sha256_file(data / "disk.img", base.virtual_size) == base.sha256
    assert result.scratch_bytes > 0
    assert list(scratch.iterdir()) == []
    # and without scratch: ScratchSpaceRequired, nothing left behind
    body = FedStream(64 << 20)
    feed(body, path)
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(data), options())
    body.close()
    assert info.value.reason == Reason.SCRATCH_SPACE_REQUIRED
    assert not (data / "disk.img").exists()


TRAILING = b"\x00padding after the image\n" * 40_000  # ~1 MiB that is not a gzip member


@pytest.mark.parametrize("name", [file_name("raw", "gz"), file_name("qcow2")])
def test_bytes_after_the_image_are_hashed_with_it(name: str, images: dict[str, Image], tmp_path: Path) -> None:
    """The digest (and the checksum asked for) is of the file as sent, bytes after the image's end included."""
    import hashlib

    image = images[name]
    sent = tmp_path / f"padded-{name}"
    sent.write_bytes(image.path.read_bytes() + TRAILING)
    whole = hashlib.sha256(sent.read_bytes()).hexdigest()
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    body = FedStream(1 << 20)
    uploader = feed(body, sent)
    result = import_stream(body, FileTarget(data), options(scratch, f"sha256:{whole}"), size=sent.stat().st_size)
    uploader.join(30)
    assert (result.checksum, result.source_sha256) == (f"sha256:{whole}", whole)
    assert sha256_file(data / "disk.img", image.virtual_size) == image.sha256


def test_too_much_after_the_image_is_refused(
    images: dict[str, Image], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from cdi.importer.routes import context

    monkeypatch.setattr(context, "TRAILING_LIMIT", len(TRAILING) // 2)
    image = images[file_name("raw", "gz")]
    sent = tmp_path / "padded.gz"
    sent.write_bytes(image.path.read_bytes() + TRAILING)
    body = FedStream(1 << 20)
    feed(body, sent)
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(tmp_path), options())
    body.close()
    assert info.value.reason == Reason.INVALID_IMAGE
    assert "after the end of its image" in info.value.message
