"""The per-pod certificates the controller issues live as long as the CDI resource's certConfig says."""

from __future__ import annotations

import datetime

from cdi.common import pki
from cdi.controller.datavolume.uploadpki import UploadPki, cert_days


def test_upload_server_and_clone_client_certificates_follow_cert_config() -> None:
    cdi = {"spec": {"certConfig": {"server": {"duration": "2h"}, "client": {"duration": "90m"}}}}
    assert cert_days(cdi, "server") * 24 == 2 and cert_days(cdi, "client") * 24 * 60 == 90
    assert cert_days(None, "server") == cert_days({"spec": {}}, "client") == 1.0  # CDI's 24h
    assert cert_days({"spec": {"certConfig": {"server": {"duration": "soon"}}}}, "server") == 1.0
    signer = pki.make_ca("signer")
    upload = UploadPki(signer, signer, signer)
    leaf = upload.server_certificate("cdi-upload-disk", "ns", cert_days(cdi, "server")).certificate()
    assert leaf.not_valid_after_utc - leaf.not_valid_before_utc <= datetime.timedelta(hours=2, minutes=5)
