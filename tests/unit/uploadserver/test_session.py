"""The upload session as the connection's thread drives it (`admit`, `receive`, `put`/`quiet`/`end`,
`answer`), without sockets: the states and answers CDI's clients see, a silent body given up as a stalled
one (and kept for a resume), and a connection thread that fails never leaves the server `uploading`."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from cdi.api import upload as names
from cdi.uploadserver.config import UploadServerConfig
from cdi.uploadserver.session import DONE, IDLE, UPLOADING, UploadSession
from tests.support.waiting import wait_for

MIB = 1 << 20


def config(tmp_path: Path, *, idle_timeout: float = 120.0) -> UploadServerConfig:
    data = tmp_path / "data"
    data.mkdir()
    return UploadServerConfig(
        listen_host="127.0.0.1", listen_port=0, cert_file=tmp_path / "tls.crt", key_file=tmp_path / "tls.key",
        client_ca_file=None, client_name=names.CLIENT_NAME, destination=data / "disk.img", image_size=16 * MIB,
        filesystem_overhead="0", preallocation=False, content_type="kubevirt", owner_uid="uid-1", scratch_dir=None,
        termination_log=tmp_path / "termination-log", idle_timeout=idle_timeout, state_dir=data)


def image(size: int) -> bytes:
    return random.Random(size).randbytes(size)


def test_a_sync_upload_is_answered_once_the_image_is_durable(tmp_path: Path) -> None:
    session = UploadSession(config(tmp_path))
    data = image(3 * MIB)
    assert session.admit(0) is None and session.state == UPLOADING
    with session.receive(archive=False, wait_for_durable=True, length=len(data)) as upload:
        for start in range(0, len(data), MIB):
            assert upload.put(data[start:start + MIB])
        upload.end()
    assert upload.answer().status == 200
    assert session.state == DONE and session.finished.is_set() and session.result is not None
    assert (tmp_path / "data" / "disk.img").read_bytes()[:len(data)] == data
    refused = session.admit(0)
    assert refused is not None and refused.status == 409 and refused.headers[names.STATE_HEADER] == DONE


def test_an_upload_while_one_is_received_is_refused_503(tmp_path: Path) -> None:
    session = UploadSession(config(tmp_path))
    assert session.admit(0) is None
    refused = session.admit(0)
    assert refused is not None and refused.status == 503 and "another upload is in progress" in refused.message
    assert refused.headers[names.STATE_HEADER] == UPLOADING


def test_an_async_upload_is_answered_and_then_ends_the_session_alone(tmp_path: Path) -> None:
    session = UploadSession(config(tmp_path))
    data = image(2 * MIB)
    assert session.admit(0) is None
    with session.receive(archive=False, wait_for_durable=False, length=len(data)) as upload:
        assert upload.put(data)
        upload.end()
    assert upload.answer().status == 200
    wait_for(session.finished.is_set, 30, 0.01, message="the import to end")
    assert session.state == DONE and session.fatal is None and session.result is not None


def test_a_silent_body_is_given_up_as_stalled_and_kept_for_a_resume(tmp_path: Path) -> None:
    session = UploadSession(config(tmp_path, idle_timeout=0.05))
    data = image(4 * MIB)
    sent = 2 * MIB + 12345
    assert session.admit(0) is None
    with session.receive(archive=False, wait_for_durable=True, length=len(data)) as upload:
        assert upload.put(data[:sent])
        wait_for(lambda: not upload.quiet(), 10, 0.01, message="the upload to give up the silent client")
    outcome = upload.answer()
    assert outcome.status == 400
    assert outcome.message.startswith(f"Saving stream failed: the upload stalled after {sent} bytes")
    assert session.state == IDLE and session.offset == sent
    assert outcome.headers[names.OFFSET_HEADER] == str(sent)
    assert session.admit(sent) is None  # the rest, from there
    with session.receive(archive=False, wait_for_durable=True, offset=sent, length=len(data) - sent) as upload:
        assert upload.put(data[sent:sent + MIB])
        # its progress is the whole image's ("Transfer: 3.0 MiB of 4.0 MiB"), not the 1.8 MiB sent this time's
        wait_for(lambda: upload.progress.snapshot().phases.get("TransferDataFile") == [sent + MIB, len(data)], 10,
                 0.01, message="the progress of the continued upload")
        assert upload.put(data[sent + MIB:])
        upload.end()
    assert upload.answer().status == 200
    assert (tmp_path / "data" / "disk.img").read_bytes()[:len(data)] == data


def test_a_connection_thread_that_fails_leaves_the_session_ready(tmp_path: Path) -> None:
    session = UploadSession(config(tmp_path))
    assert session.admit(0) is None
    upload = session.receive(archive=False, wait_for_durable=True)

    def read_and_fail() -> None:
        with upload:
            assert upload.put(image(MIB))
            raise RuntimeError("a bug in the reading thread")

    with pytest.raises(RuntimeError):
        read_and_fail()
    assert session.state == IDLE
    assert upload.answer().status == 400  # the body counts as cut off
    assert session.admit(0) is None
