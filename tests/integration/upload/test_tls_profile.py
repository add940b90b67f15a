"""The upload server serves with the TLS profile its pod was given (CDI's `TLS_CIPHERS` and
`TLS_MIN_VERSION`), exactly, on both TLS paths (the conftest runs each test natively and with
`CDI_NO_EXTENSIONS=1`), as the real `openssl s_client` sees it."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from cdi.api import tlsprofile
from cdi.uploadserver.server import UploadServer
from tests.integration.upload.conftest import UploadPki, make_volumes, server_config
from tests.support import tlsprobe


@pytest.mark.parametrize("name", list(tlsprobe.EXPECTED))
async def test_the_server_offers_exactly_the_profile_of_its_environment(upload_pki: UploadPki, tmp_path: Path,
                                                                       name: str) -> None:
    # the pod's environment as the controller writes it, read as the program in the pod reads it
    written = tlsprofile.select(tlsprobe.profile(name)).to_env()
    spec = tlsprofile.TLSProfileSpec.from_environ({entry["name"]: entry["value"] for entry in written})
    config = replace(server_config(upload_pki, make_volumes(tmp_path)), tls_profile=spec)
    server = UploadServer(config)
    server.start()
    try:
        offer = await asyncio.to_thread(tlsprobe.offer, "127.0.0.1", server.port)
    finally:
        server.stop()
    assert offer.suites == tlsprobe.EXPECTED[name]


async def test_without_the_environment_the_server_offers_intermediate(upload_pki: UploadPki, tmp_path: Path) -> None:
    """A pod made by a controller that did not set the variables: TLS 1.2 and up, AEAD suites only (before,
    the native path also took CBC suites with SHA-1, and the two paths differed)."""
    server = UploadServer(server_config(upload_pki, make_volumes(tmp_path)))
    server.start()
    try:
        assert not await asyncio.to_thread(tlsprobe.accepts, "127.0.0.1", server.port, "TLSv1.1")
        assert await asyncio.to_thread(tlsprobe.handshake, "127.0.0.1", server.port, "TLSv1.2",
                                       ciphers="ECDHE-ECDSA-AES128-SHA") is None  # CBC: not in Intermediate
        assert await asyncio.to_thread(tlsprobe.accepts, "127.0.0.1", server.port, "TLSv1.2")
    finally:
        server.stop()
