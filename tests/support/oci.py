"""containerDisk images built by hand as OCI layouts and pushed with skopeo.

A layout is what `skopeo copy oci:DIR:tag docker://...` reads: `oci-layout`, `index.json`, and
content-addressed blobs (a layer tar holding `disk/<file>`, the image config with its Env, the
manifest). `multi_arch` adds an image index with one manifest per architecture.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zstandard

LAYER_MEDIA = {
    "": "application/vnd.oci.image.layer.v1.tar",
    "gzip": "application/vnd.oci.image.layer.v1.tar+gzip",
    "zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
}


def _blob(layout: Path, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    (layout / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (layout / "blobs" / "sha256" / digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


@dataclass
class Layer:
    files: dict[str, Path | bytes] = field(default_factory=dict)  # tar path -> file or contents
    compression: str = ""
    dirs: tuple[str, ...] = ("disk",)

    def tar(self) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as t:
            for d in self.dirs:
                info = tarfile.TarInfo(d)
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                t.addfile(info)
            for name, content in self.files.items():
                if isinstance(content, Path):
                    t.add(content, arcname=name)
                else:
                    info = tarfile.TarInfo(name)
                    info.size = len(content)
                    t.addfile(info, io.BytesIO(content))
        data = out.getvalue()
        if self.compression == "gzip":
            return gzip.compress(data, 1)
        if self.compression == "zstd":
            return zstandard.ZstdCompressor(level=1).compress(data)
        return data


def _manifest(
    layout: Path, layers: list[Layer], env: list[str], arch: str, labels: dict[str, str] | None = None
) -> dict[str, Any]:
    descs, diff_ids = [], []
    for layer in layers:
        raw = layer.tar()
        descs.append(_blob(layout, raw, LAYER_MEDIA[layer.compression]))
        plain = (
            gzip.decompress(raw)
            if layer.compression == "gzip"
            else (zstandard.ZstdDecompressor().decompress(raw) if layer.compression == "zstd" else raw)
        )
        diff_ids.append("sha256:" + hashlib.sha256(plain).hexdigest())
    config = {
        "architecture": arch,
        "os": "linux",
        "config": {"Env": env, "Labels": labels or {}},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }
    config_desc = _blob(layout, json.dumps(config).encode(), "application/vnd.oci.image.config.v1+json")
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_desc,
        "layers": descs,
    }
    return _blob(layout, json.dumps(manifest).encode(), "application/vnd.oci.image.manifest.v1+json")


def build(
    layout: Path,
    layers: list[Layer],
    *,
    env: list[str] | None = None,
    arch: str = "amd64",
    tag: str = "v1",
    labels: dict[str, str] | None = None,
    multi_arch: dict[str, list[Layer]] | None = None,
) -> None:
    """An OCI layout with one image, or with an index of `multi_arch` {arch: layers} images."""
    layout.mkdir(parents=True, exist_ok=True)
    (layout / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    if multi_arch:
        entries = []
        for architecture, arch_layers in multi_arch.items():
            desc = _manifest(layout, arch_layers, env or [], architecture, labels)
            desc["platform"] = {"architecture": architecture, "os": "linux"}
            entries.append(desc)
        index = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": entries,
        }
        top = _blob(layout, json.dumps(index).encode(), "application/vnd.oci.image.index.v1+json")
    else:
        top = _manifest(layout, layers, env or [], arch, labels)
    top["annotations"] = {"org.opencontainers.image.ref.name": tag}
    (layout / "index.json").write_text(json.dumps({"schemaVersion": 2, "manifests": [top]}))


def push(
    layout: Path,
    destination: str,
    *,
    tag: str = "v1",
    creds: str | None = None,
    cert_dir: Path | None = None,
    tls_verify: bool = True,
    all_images: bool = False,
) -> None:
    cmd = ["skopeo", "copy", "--quiet", "--preserve-digests"]
    if all_images:
        cmd.append("--all")
    if creds:
        cmd += ["--dest-creds", creds]
    if cert_dir is not None:
        cmd += ["--dest-cert-dir", str(cert_dir)]
    if not tls_verify:
        cmd.append("--dest-tls-verify=false")
    cmd += [f"oci:{layout}:{tag}", f"docker://{destination}"]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"skopeo copy failed: {result.stderr}")


def digest_of(layout: Path) -> str:
    return str(json.loads((layout / "index.json").read_text())["manifests"][0]["digest"])
