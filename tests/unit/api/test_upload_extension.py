"""The paths of uploads through the API server (`upload.extensions.cdi.dev`): the proxy's own upload paths
under a claim's `uploads/<pvc>/proxy`, and nothing else."""

from __future__ import annotations

import pytest

from cdi.api import upload as names


@pytest.mark.parametrize("upload_path", names.PROXY_PATHS)
def test_every_upload_path_of_the_proxy_round_trips(upload_path: str) -> None:
    path = names.extension_base("tenant-1", "fedora.disk") + upload_path
    assert path.startswith("/apis/upload.extensions.cdi.dev/v1beta1/namespaces/tenant-1/uploads/fedora.disk/proxy/")
    assert names.parse_extension_path(path) == ("tenant-1", "fedora.disk", upload_path)


@pytest.mark.parametrize("path", [
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/proxy",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/proxy/",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/proxy/healthz",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/proxy/v1beta1/upload-archive",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/status/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/things/disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/uploads/disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1/namespaces/ns/uploads/disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/NS/uploads/disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/../proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/-disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/di%2Fsk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces//uploads/disk/proxy/v1beta1/upload",
    "/apis/upload.extensions.cdi.dev/v1beta1/namespaces/ns/uploads/disk/proxy/v1beta1/upload/extra",
])
def test_anything_else_is_no_upload(path: str) -> None:
    assert names.parse_extension_path(path) is None
