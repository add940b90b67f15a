"""Registry imports from Debian's docker-registry, images built as OCI layouts and pushed with skopeo:
every format x compression x volume mode, layer compressions, the three auth schemes, TLS with a
custom CA, image indexes, digests, labels, and the containerDisk layout rules."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cdi.common.imageprobe import ACCESS_STREAM
from tests.support import oci
from tests.support.images import Image, file_name
from tests.support.sourceservers import PASSWORD, USER, Registries

from .harness import (
    CHECKERBOARD,
    Case,
    Volume,
    assert_failed,
    assert_imported,
    rule_says_scratch,
    run_importer,
)

LABEL_ENV = [
    "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_PREFERENCE=fedora",
    "INSTANCETYPE_KUBEVIRT_IO_DEFAULT_INSTANCETYPE=u1.small",
    "KUBEVIRT_IO_OS=linux",
    "PATH=/usr/bin",
]
LABELS = {
    "instancetype.kubevirt.io/default-preference": "fedora",
    "instancetype.kubevirt.io/default-instancetype": "u1.small",
    "kubevirt.io/os": "linux",
}


def registry_env(endpoint: str, creds: bool = True, **extra: str) -> dict[str, str]:
    env = {"IMPORTER_SOURCE": "registry", "IMPORTER_ENDPOINT": endpoint, "INSECURE_TLS": "true"}
    if creds:
        env.update({"IMPORTER_ACCESS_KEY_ID": USER, "IMPORTER_SECRET_KEY": PASSWORD})
    env.update(extra)
    return env


def disk_image(
    image: Image, compression: str = "gzip", env: list[str] | None = None, name: str | None = None
) -> Callable[[Path], None]:
    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({f"disk/{name or image.name}": image.path}, compression)], env=env)

    return build


def expected_route(fmt: str, compression: str) -> str:
    if fmt in ("raw", "iso"):
        return "stream"
    return "qcow2-stream" if fmt.startswith("qcow2") else "scratch-convert"


@pytest.mark.parametrize("case", CHECKERBOARD, ids=str)
def test_registry_import(
    case: Case, images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    """The disk file itself in every format and compression, in a gzip layer (the usual containerDisk)."""
    image = images[case.name]
    repo = f"matrix/{case.fmt}-{case.compression or 'none'}"
    endpoint = registries.push(registries.basic, repo, disk_image(image, env=LABEL_ENV))
    route = expected_route(case.fmt, case.compression)
    assert (route == "scratch-convert") == rule_says_scratch(image, ACCESS_STREAM)  # the controller agrees
    volume = make_volume(case.mode, scratch=route == "scratch-convert")
    result = run_importer(volume, registry_env(endpoint))
    assert_imported(volume, image, result, route=route)
    assert result.message["labels"] == LABELS
    # what it received: the disk file in the layer, as sha256sum of the file put in the image says
    assert result.message["sourceSha256"] == image.file_sha256, result.message


@pytest.mark.parametrize("layer", ["", "zstd"])
@pytest.mark.parametrize("fmt", ["raw", "qcow2", "vmdk-stream"])
def test_layer_compressions(
    layer: str, fmt: str, images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name(fmt)]
    endpoint = registries.push(registries.basic, f"layers/{fmt}-{layer or 'plain'}", disk_image(image, layer))
    volume = make_volume("fs", scratch=True)
    assert_imported(volume, image, run_importer(volume, registry_env(endpoint)))


def test_raw_disk_needs_no_scratch(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw", "xz")]
    endpoint = registries.push(registries.basic, "noscratch/raw", disk_image(image))
    volume = make_volume("block")
    assert_imported(volume, image, run_importer(volume, registry_env(endpoint)), route="stream")


def test_qcow2_disk_needs_no_scratch(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    """The usual containerDisk (a qcow2 in a gzip layer): converted as the layer streams by."""
    image = images[file_name("qcow2-compressed")]
    endpoint = registries.push(registries.basic, "noscratch/qcow2", disk_image(image))
    volume = make_volume("block")
    assert_imported(volume, image, run_importer(volume, registry_env(endpoint)), route="qcow2-stream")


def test_vhd_disk_without_scratch_says_so(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("vhd")]
    endpoint = registries.push(registries.basic, "noscratch/vhd", disk_image(image))
    volume = make_volume("fs")
    result = run_importer(volume, registry_env(endpoint))
    assert_failed(result, "ScratchSpaceRequired", retryable=True)
    assert result.message["scratchSpaceRequired"] is True


def test_tls_registry_with_custom_ca(
    images: dict[str, Image], registries: Registries, ca_dir: Path, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("qcow2-compressed")]
    endpoint = registries.push(registries.tls, "tls/disk", disk_image(image))
    volume = make_volume("fs", scratch=True)
    result = run_importer(
        volume,
        {"IMPORTER_SOURCE": "registry", "IMPORTER_ENDPOINT": endpoint, "IMPORTER_CERT_DIR": str(ca_dir)},
    )
    assert_imported(volume, image, result)
    # without the CA (and without INSECURE_TLS) the registry is not trusted
    result = run_importer(
        make_volume("fs", scratch=True), {"IMPORTER_SOURCE": "registry", "IMPORTER_ENDPOINT": endpoint}
    )
    assert_failed(result, "TLSError", retryable=False)


def test_token_auth(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw", "gz")]
    endpoint = registries.push(registries.token, "token/disk", disk_image(image))
    before = registries.token_server.requests
    volume = make_volume("fs")
    assert_imported(volume, image, run_importer(volume, registry_env(endpoint)))
    assert registries.token_server.requests > before
    # an anonymous token carries no pull right: refused, permanently
    result = run_importer(make_volume("fs"), registry_env(endpoint, creds=False))
    assert_failed(result, "Unauthorized", retryable=False)


def test_basic_auth_refused(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]
    endpoint = registries.push(registries.basic, "auth/disk", disk_image(image))
    result = run_importer(make_volume("fs"), registry_env(endpoint, creds=False))
    assert_failed(result, "Unauthorized", "credentials", retryable=False)
    result = run_importer(make_volume("fs"), registry_env(endpoint, IMPORTER_SECRET_KEY="wrong"))
    assert_failed(result, "Unauthorized", retryable=False)


def test_image_index_by_architecture(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    amd64, arm64 = images[file_name("raw")], images[file_name("qcow2")]

    def build(layout: Path) -> None:
        oci.build(
            layout,
            [],
            multi_arch={
                "amd64": [oci.Layer({"disk/disk.img": amd64.path}, "gzip")],
                "arm64": [oci.Layer({"disk/disk.qcow2": arm64.path}, "gzip")],
            },
        )

    endpoint = registries.push(registries.basic, "multiarch/disk", build, all_images=True)
    volume = make_volume("fs", scratch=True)
    assert_imported(volume, amd64, run_importer(volume, registry_env(endpoint)))
    volume = make_volume("fs", scratch=True)
    result = run_importer(volume, registry_env(endpoint, IMPORTER_REGISTRY_IMAGE_ARCHITECTURE="arm64"))
    assert_imported(volume, arm64, result)
    result = run_importer(
        make_volume("fs"), registry_env(endpoint, IMPORTER_REGISTRY_IMAGE_ARCHITECTURE="s390x")
    )
    assert_failed(result, "NotFound", "s390x", "linux/amd64", retryable=False)


def test_pull_by_digest(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("vhd")]
    endpoint = registries.push(registries.basic, "digest/disk", disk_image(image))
    digest = registries.digest(registries.basic, "digest/disk")
    by_digest = endpoint.rsplit(":", 1)[0] + "@" + digest
    volume = make_volume("fs", scratch=True)
    assert_imported(volume, image, run_importer(volume, registry_env(by_digest)))


def test_disk_found_in_a_later_layer_with_whiteouts(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw", "zst")]

    def build(layout: Path) -> None:
        oci.build(
            layout,
            [
                oci.Layer({"etc/os-release": b"NAME=test\n"}, "gzip", dirs=("etc",)),
                oci.Layer(
                    {"./disk/.wh.old.img": b"", "./disk/disk.img.zst": image.path}, "", dirs=("./disk",)
                ),
            ],
        )

    endpoint = registries.push(registries.basic, "layout/later", build)
    volume = make_volume("fs")
    assert_imported(volume, image, run_importer(volume, registry_env(endpoint)))


def test_image_without_disk(registries: Registries, make_volume: Callable[..., Volume]) -> None:
    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({"etc/hostname": b"nodisk\n"}, "gzip", dirs=("etc",))])

    endpoint = registries.push(registries.basic, "layout/nodisk", build)
    volume = make_volume("fs", scratch=True)
    result = run_importer(volume, registry_env(endpoint))
    assert_failed(result, "DiskNotFoundInImage", "disk/", retryable=False)
    assert list(volume.data_dir.iterdir()) == []


def test_bootc_images_are_refused(
    images: dict[str, Image], registries: Registries, make_volume: Callable[..., Volume]
) -> None:
    image = images[file_name("raw")]

    def build(layout: Path) -> None:
        oci.build(layout, [oci.Layer({"disk/disk.img": image.path})], labels={"containers.bootc": "1"})

    endpoint = registries.push(registries.basic, "layout/bootc", build)
    result = run_importer(make_volume("fs"), registry_env(endpoint))
    assert_failed(result, "UnsupportedFormat", "bootc", retryable=False)


def test_missing_tag_is_not_found(registries: Registries, make_volume: Callable[..., Volume]) -> None:
    result = run_importer(
        make_volume("fs"), registry_env(f"docker://{registries.basic.host}/nothing/here:v9")
    )
    assert_failed(result, "NotFound", retryable=False)
