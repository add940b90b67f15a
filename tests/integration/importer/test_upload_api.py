"""The pipeline's stream entry point, as the upload server will call it: a plain byte stream fed
from another thread, through the same detection, validation, conversion and checksum code."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from cdi.importer import (
    Checksum,
    FileTarget,
    ImporterError,
    ImportOptions,
    QueueStream,
    Reason,
    import_stream,
)

from .harness import OVERHEAD, REQUESTED, USABLE
from .images import Image, file_name, sha256_file


def feed(stream: QueueStream, path: Path, chunk: int = 100_000) -> threading.Thread:
    """An uploader: writes the file into the stream in odd-sized pieces, then finishes it."""

    def run() -> None:
        try:
            with open(path, "rb") as f:
                while data := f.read(chunk):
                    stream.feed(data, timeout=30)
            stream.finish()
        except BrokenPipeError:
            pass

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def options(scratch: Path | None = None, checksum: str = "") -> ImportOptions:
    return ImportOptions(
        requested_size=REQUESTED,
        filesystem_overhead=OVERHEAD,
        scratch_dir=scratch,
        checksum=Checksum.parse(checksum),
    )


@pytest.mark.parametrize(
    "name", [file_name("raw", "xz"), file_name("iso"), file_name("qcow2-compressed"), file_name("vhdx", "gz")]
)
def test_import_stream(name: str, images: dict[str, Image], tmp_path: Path) -> None:
    image = images[name]
    data, scratch = tmp_path / "data", tmp_path / "scratch"
    data.mkdir()
    scratch.mkdir()
    body = QueueStream(max_bytes=1 << 20)
    uploader = feed(body, image.path)
    result = import_stream(body, FileTarget(data), options(scratch, f"sha256:{image.file_sha256}"), size=None)
    uploader.join(30)
    assert result.virtual_size == image.virtual_size
    assert result.checksum == f"sha256:{image.file_sha256}"
    assert result.bytes_transferred == image.file_size
    assert sha256_file(data / "disk.img", image.virtual_size) == image.sha256
    assert (data / "disk.img").stat().st_size == USABLE
    assert list(scratch.iterdir()) == []


def test_import_stream_needs_scratch_for_qcow2(images: dict[str, Image], tmp_path: Path) -> None:
    image = images[file_name("qcow2")]
    body = QueueStream()
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
    body = QueueStream()
    feed(body, tmp_path / "child.qcow2")
    data = tmp_path / "data"
    data.mkdir()
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(data), options(tmp_path))
    body.close()
    assert info.value.reason == Reason.BACKING_FILE_NOT_ALLOWED
    assert not (data / "disk.img").exists()


def test_producer_failure_reaches_the_pipeline(tmp_path: Path) -> None:
    body = QueueStream()
    body.feed(b"\x00" * 1000)
    body.fail(ImporterError(Reason.CONNECTION_FAILED, "the client went away", retryable=True))
    with pytest.raises(ImporterError) as info:
        import_stream(body, FileTarget(tmp_path), options())
    assert info.value.reason == Reason.CONNECTION_FAILED
