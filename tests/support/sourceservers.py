"""The image set and the real source servers (HTTP and HTTPS file servers, S3 on moto, GCS on its
emulator, docker registries) with the test CA and the credentials they accept: session-scoped fixtures
shared by the importer's integration tests and the end-to-end tests, whose conftests re-export them (not
a plugin of tests/conftest.py: importing the servers' libraries would slow every unit test run)."""

from __future__ import annotations

import random
import subprocess
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from cdi.common import pki
from tests.support import oci
from tests.support.images import Image, build_image_set, sha256_file
from tests.support.servers import SERVE_HOST, FileServer, Registry, TLSMotoServer, TokenServer, htpasswd_file

# what the servers accept: basic auth of the HTTPS server and the registries, the S3 key pair
USER, PASSWORD = "cdi", "s3cr3t-pw"
S3_KEY, S3_SECRET = "AKIDCDITEST", "cdi-secret-key"


# -- images and CA --------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def images(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Image]:
    shared = tmp_path_factory.getbasetemp().parent / "cdi-importer-images"
    return build_image_set(shared)


@pytest.fixture(scope="session")
def ca() -> pki.KeyPair:
    return pki.make_ca("cdi importer test CA")


@pytest.fixture(scope="session")
def server_pair(ca: pki.KeyPair) -> pki.KeyPair:
    return pki.issue(ca, "localhost", sorted({"127.0.0.1", "localhost", SERVE_HOST}))


@pytest.fixture(scope="session")
def ca_dir(tmp_path_factory: pytest.TempPathFactory, ca: pki.KeyPair) -> Path:
    """What IMPORTER_CERT_DIR points to: the CA that signed every test server."""
    directory = tmp_path_factory.mktemp("certs")
    (directory / "ca.crt").write_bytes(ca.cert_pem)
    (directory / ".hidden").write_text("not a certificate, and ignored because it starts with a dot")
    return directory


@pytest.fixture(scope="session")
def served_dir(tmp_path_factory: pytest.TempPathFactory, images: dict[str, Image]) -> Path:
    """The file servers' root: the image set (symlinked) plus files tests add with unique names."""
    directory = tmp_path_factory.mktemp("served")
    for name, image in images.items():
        (directory / name).symlink_to(image.path)
    return directory


BIG = 48 << 20


@dataclass
class Big:
    raw: Image
    qcow2: Image
    xz: Image
    vmdk: Image  # monolithicSparse: 2 grain tables, spans of several grains
    vmdk_stream: Image  # streamOptimized: every grain deflated behind a marker


@pytest.fixture(scope="session")
def big(served_dir: Path) -> Iterator[Big]:
    """A 48 MiB disk with data everywhere, as raw, as (uncompressed) qcow2, as multi-block xz and as
    both kinds of sparse vmdk."""
    rng = random.Random(11)
    raw = served_dir / "resume-big.img"
    with open(raw, "wb") as f:
        for i in range(BIG // (1 << 20)):
            line = b"resume test line %06d\n" % i
            f.write(rng.randbytes(1 << 20) if i % 2 else (line * ((1 << 20) // len(line) + 1))[: 1 << 20])
    qcow2 = served_dir / "resume-big.qcow2"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "qcow2", str(raw), str(qcow2)], check=True)
    xz = served_dir / "resume-big.img.xz"
    with open(xz, "wb") as f:
        subprocess.run(["xz", "-0", "-T2", "--block-size=2MiB", "-c", str(raw)], stdout=f, check=True)
    vmdk = served_dir / "resume-big.vmdk"
    subprocess.run(["qemu-img", "convert", "-f", "raw", "-O", "vmdk", str(raw), str(vmdk)], check=True)
    vmdk_stream = served_dir / "resume-big-stream.vmdk"
    subprocess.run(
        ["qemu-img", "convert", "-f", "raw", "-O", "vmdk", "-o", "subformat=streamOptimized", str(raw),
         str(vmdk_stream)],
        check=True,
    )
    digest = sha256_file(raw)

    def image(path: Path, fmt: str) -> Image:
        return Image(path.name, path, fmt, "", digest, BIG, sha256_file(path), path.stat().st_size)

    yield Big(
        image(raw, "raw"), image(qcow2, "qcow2"), image(xz, "raw"), image(vmdk, "vmdk"),
        image(vmdk_stream, "vmdk"),
    )
    for path in (raw, qcow2, xz, vmdk, vmdk_stream):
        path.unlink()


# -- servers --------------------------------------------------------------------------------------------
@pytest.fixture(scope="session")
def https_server(
    served_dir: Path, server_pair: pki.KeyPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FileServer]:
    """HTTPS from the test CA, basic auth, Range support."""
    context = pki.server_context(server_pair, tmp_path_factory.mktemp("https-tls"))
    server = FileServer(served_dir, ssl_context=context, auth=(USER, PASSWORD))
    yield server
    server.close()


@pytest.fixture
def gated_server(served_dir: Path) -> Iterator[FileServer]:
    """Plain HTTP with Range support, a test's own: it closes the gate to hold a transfer part way (a stalled
    import, a crash or an upgrade in the middle of one), which must never stall another test's transfer."""
    server = FileServer(served_dir)
    yield server
    server.open_gate()
    server.close()


@pytest.fixture(scope="session")
def plain_server(served_dir: Path) -> Iterator[FileServer]:
    """Plain HTTP, anonymous, no Range support (every GET answers 200 with the whole file)."""
    server = FileServer(served_dir, ranges=False)
    yield server
    server.close()


@pytest.fixture(scope="session")
def range_server(served_dir: Path) -> Iterator[FileServer]:
    """Plain HTTP, anonymous, Range support: for tests that script failures and count bytes."""
    server = FileServer(served_dir)
    yield server
    server.close()


@dataclass
class S3:
    url: str  # plain HTTP endpoint
    tls_url: str  # the same buckets over TLS from the test CA
    bucket: str
    client: Any

    def endpoint(self, key: str, tls: bool = False) -> str:
        return f"{self.tls_url if tls else self.url}/{self.bucket}/{key}"

    def put(self, key: str, path: Path) -> None:
        self.client.upload_file(str(path), self.bucket, key)


@pytest.fixture(scope="session")
def s3(
    images: dict[str, Image], server_pair: pki.KeyPair, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[S3]:
    from moto.server import ThreadedMotoServer

    from tests.support.servers import free_port

    plain = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    plain.start()
    tls = TLSMotoServer(server_pair, tmp_path_factory.mktemp("moto-tls"))
    tls.start()
    host, port = plain.get_host_and_port()
    url = f"http://{host}:{port}"
    client = boto3.client(
        "s3",
        endpoint_url=url,
        aws_access_key_id=S3_KEY,
        aws_secret_access_key=S3_SECRET,
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="images")
    store = S3(url, f"https://127.0.0.1:{tls._port}", "images", client)
    for name, image in images.items():
        store.put(name, image.path)
    yield store
    plain.stop()
    tls.stop()



@dataclass
class Gcs:
    """gcp-storage-emulator on loopback, bucket `images`; objects are uploaded on first use."""

    api: str  # the emulator's endpoint, what STORAGE_EMULATOR_HOST names
    bucket: str
    client: Any
    images: dict[str, Image]
    uploaded: set[str]

    def put(self, name: str, path: Path) -> None:
        self.client.bucket(self.bucket).blob(name).upload_from_filename(str(path))
        self.uploaded.add(name)

    def url(self, name: str, form: str = "http") -> str:
        """CDI's URL forms: `http`: http(s)://endpoint/bucket/object; `gs`: gs://bucket/object."""
        if name in self.images and name not in self.uploaded:
            self.put(name, self.images[name].path)
        return f"gs://{self.bucket}/{name}" if form == "gs" else f"{self.api}/{self.bucket}/{name}"


@pytest.fixture(scope="session")
def gcs(images: dict[str, Image], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gcs]:
    from gcp_storage_emulator.server import create_server
    from google.api_core.client_options import ClientOptions
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    from tests.support.servers import free_port

    server = create_server("127.0.0.1", free_port(), in_memory=False, default_bucket="images",
                           data_dir=str(tmp_path_factory.mktemp("gcs")))
    server.start()
    api = f"http://127.0.0.1:{server._api._port}"
    client = storage.Client(project="test", credentials=AnonymousCredentials(),
                            client_options=ClientOptions(api_endpoint=api))
    yield Gcs(api, "images", client, images, set())
    server.stop()

class Registries:
    """docker-registry instances (htpasswd over HTTP, TLS from the test CA, bearer tokens) and the
    images pushed to them, pushed on first use."""

    def __init__(self, workdir: Path, ca: pki.KeyPair, ca_dir: Path, server_pair: pki.KeyPair) -> None:
        self.workdir = workdir
        self.ca_dir = ca_dir
        self.basic = Registry(workdir / "basic", htpasswd=htpasswd_file(workdir / "htpasswd", USER, PASSWORD))
        self.tls = Registry(workdir / "tls", tls=server_pair)
        self.token_server = TokenServer(ca, {USER: PASSWORD})
        self.token = Registry(workdir / "token", token=self.token_server, ca=ca)
        self._pushed: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()

    def push(
        self,
        registry: Registry,
        repo: str,
        build: Callable[[Path], None],
        tag: str = "v1",
        all_images: bool = False,
    ) -> str:
        """Build a layout with `build(layout_dir)` and push it once; returns the docker:// endpoint."""
        key = (registry.host, f"{repo}:{tag}")
        with self._lock:
            if key not in self._pushed:
                layout = self.workdir / "layouts" / f"{registry.port}-{repo.replace('/', '_')}-{tag}"
                build(layout)
                creds = None if registry is self.tls else f"{USER}:{PASSWORD}"
                cert_dir = self.ca_dir if registry.tls else None
                oci.push(
                    layout,
                    f"{registry.host}/{repo}:{tag}",
                    tag=tag,
                    creds=creds,
                    cert_dir=cert_dir,
                    tls_verify=registry.tls,
                    all_images=all_images,
                )
                self._pushed[key] = oci.digest_of(layout)
        return f"docker://{registry.host}/{repo}:{tag}"

    def digest(self, registry: Registry, repo: str, tag: str = "v1") -> str:
        return self._pushed[(registry.host, f"{repo}:{tag}")]

    def close(self) -> None:
        for r in (self.basic, self.tls, self.token):
            r.close()
        self.token_server.close()


@pytest.fixture(scope="session")
def registries(
    tmp_path_factory: pytest.TempPathFactory, ca: pki.KeyPair, ca_dir: Path, server_pair: pki.KeyPair
) -> Iterator[Registries]:
    regs = Registries(tmp_path_factory.mktemp("registries"), ca, ca_dir, server_pair)
    yield regs
    regs.close()
