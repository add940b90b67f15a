"""Real OCI images on the local node: pulled from their registry with skopeo, unpacked into a root
file system, cached by manifest digest under the node's directory (`images/<digest>/`).

**Pulling**: `skopeo copy docker://IMAGE oci:DIR` (skopeo picks the node's architecture from an
index). Registries on the loopback are reached without TLS verification, as Docker and containerd
treat them; others in the node's insecure list too. `imagePullSecrets` become a skopeo auth file
(the `.dockerconfigjson` / `.dockercfg` of each secret, merged). `imagePullPolicy`: `Always` pulls
every time (a new digest is unpacked, an unchanged one reused), `IfNotPresent` uses what this node
pulled before under the same name, `Never` only that.

**Unpacking** assumes every layer is hostile. Each entry's path is made relative and normalised;
one that climbs out (`..`) is refused. Paths are resolved inside the root file system, symlinks
included, as a runtime's securejoin does: a symlink (absolute or relative) is followed as if the
root were `/`, never to the host, so a layer cannot write through a symlink an earlier one planted
(`etc -> /etc`). The final component is never followed: an existing entry is replaced. Hard links
must point at a regular file inside the root. Whiteouts (`.wh.NAME`) remove what lower layers left,
opaque whiteouts (`.wh..wh..opq`) empty a directory. Device nodes, FIFOs and setuid/setgid bits are
not created (a pod cannot use them: the sandbox has no `mknod` and runs with no-new-privileges).
Files keep their modes and owners (within the node's user namespace the same numbers)."""

from __future__ import annotations

import base64
import contextlib
import gzip
import hashlib
import json
import logging
import os
import shutil
import stat
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO, Any

log = logging.getLogger(__name__)

Obj = dict[str, Any]
WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"
MAX_SYMLINKS = 40


class PullError(Exception):
    """The image cannot be had (reason ErrImagePull; ErrImageNeverPull when `never` is set)."""

    def __init__(self, message: str, never: bool = False) -> None:
        super().__init__(message)
        self.never = never


class UnsafeLayer(Exception):
    """A layer tries to write outside the root file system, or holds what an image may not."""


@dataclass(frozen=True)
class PulledImage:
    reference: str
    digest: str
    rootfs: Path
    config: Obj = field(default_factory=dict)  # the image config's `config`: Entrypoint, Cmd, Env, User, ...

    @property
    def entrypoint(self) -> list[str]:
        return [str(a) for a in self.config.get("Entrypoint") or []]

    @property
    def cmd(self) -> list[str]:
        return [str(a) for a in self.config.get("Cmd") or []]

    @property
    def env(self) -> list[str]:
        return [str(e) for e in self.config.get("Env") or []]

    @property
    def working_dir(self) -> str:
        return str(self.config.get("WorkingDir") or "")

    @property
    def user(self) -> str:
        return str(self.config.get("User") or "")


def registry_host(reference: str) -> str:
    """`127.0.0.1:5000/a/b:v1` -> `127.0.0.1:5000`; a name without a registry is Docker Hub's."""
    first = reference.split("/", 1)[0]
    if "/" in reference and ("." in first or ":" in first or first == "localhost"):
        return first
    return "docker.io"


def loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if not host.startswith("[") else host.split("]", 1)[0] + "]"
    return name in ("localhost", "[::1]") or name.startswith("127.")


def auth_file(secrets: Iterable[Obj]) -> Obj:
    """A skopeo/Docker auth file from `kubernetes.io/dockerconfigjson` and `dockercfg` secrets."""
    auths: Obj = {}
    for secret in secrets:
        data = secret.get("data") or {}
        for key, nested in ((".dockerconfigjson", True), (".dockercfg", False)):
            if key not in data:
                continue
            try:
                parsed = json.loads(base64.b64decode(data[key]))
            except (ValueError, TypeError):
                continue
            entries = parsed.get("auths", {}) if nested else parsed
            for host, entry in (entries or {}).items():
                if not isinstance(entry, dict):
                    continue
                if not entry.get("auth") and entry.get("username"):
                    token = f"{entry['username']}:{entry.get('password', '')}".encode()
                    entry = {"auth": base64.b64encode(token).decode()}
                if entry.get("auth"):
                    auths.setdefault(str(host).removeprefix("https://").removeprefix("http://").rstrip("/"),
                                     {"auth": entry["auth"]})
    return {"auths": auths}


# -- unpacking --------------------------------------------------------------------------------------------

def _relative(name: str) -> PurePosixPath:
    """A layer entry's path relative to the root; UnsafeLayer when it climbs out."""
    parts: list[str] = []
    for part in name.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise UnsafeLayer(f"layer entry {name!r} climbs out of the root file system")
        parts.append(part)
    return PurePosixPath(*parts) if parts else PurePosixPath(".")


def resolve(root: Path, path: PurePosixPath | str, follow_last: bool = True) -> Path:
    """`path` inside `root`, symlinks followed as if `root` were `/` (never leaving it)."""
    pending = [p for p in str(path).split("/") if p not in ("", ".")]
    done: list[str] = []
    links = 0
    while pending:
        part = pending.pop(0)
        if part == "..":
            if done:
                done.pop()
            continue
        candidate = root.joinpath(*done, part)
        last = not pending
        if candidate.is_symlink() and (follow_last or not last):
            links += 1
            if links > MAX_SYMLINKS:
                raise UnsafeLayer(f"too many levels of symbolic links in {path}")
            target = os.readlink(candidate)
            if target.startswith("/"):
                done = []
            pending = [p for p in target.split("/") if p not in ("", ".")] + pending
            continue
        done.append(part)
    return root.joinpath(*done)


def _remove(path: Path) -> None:
    if path.is_symlink() or not path.is_dir():
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    else:
        shutil.rmtree(path)


def _open_layer(blob: Path, media_type: str) -> IO[bytes]:
    raw = open(blob, "rb")  # noqa: SIM115 - returned
    head = raw.read(4)
    raw.seek(0)
    if "zstd" in media_type or head == b"\x28\xb5\x2f\xfd":
        import zstandard
        return zstandard.ZstdDecompressor().stream_reader(raw, closefd=True)  # type: ignore[no-any-return]
    if "gzip" in media_type or head[:2] == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # closed with the tarfile
    return raw


def apply_layer(root: Path, layer: IO[bytes]) -> None:
    """Apply one layer tar onto `root` (see the module's docstring for what is refused)."""
    with tarfile.open(fileobj=layer, mode="r|") as tar:
        for member in tar:
            rel = _relative(member.name)
            if rel == PurePosixPath("."):
                continue
            parent = resolve(root, rel.parent)
            name = rel.name
            if name == OPAQUE:
                if parent.is_dir() and not parent.is_symlink():
                    for entry in list(parent.iterdir()):
                        _remove(entry)
                continue
            if name.startswith(WHITEOUT):
                hidden = name[len(WHITEOUT):]
                if hidden in ("", ".", "..") or "/" in hidden:
                    raise UnsafeLayer(f"whiteout {member.name!r} names no entry")
                if parent.is_dir() and not parent.is_symlink():
                    _remove(parent / hidden)
                continue
            if not os.path.lexists(parent):
                parent.mkdir(parents=True, mode=0o755)  # not there: no symlink on the way (resolve followed them)
            if not parent.is_dir() or parent.is_symlink():
                raise UnsafeLayer(f"layer entry {member.name!r}: its directory is not a directory")
            target = parent / name
            mode = member.mode & 0o1777  # no setuid/setgid
            if member.isdir():
                if target.is_symlink() or (target.exists() and not target.is_dir()):
                    _remove(target)
                target.mkdir(exist_ok=True)
                os.chmod(target, mode | 0o700)
            elif member.isreg():
                _remove(target)
                source = tar.extractfile(member)
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
                with os.fdopen(fd, "wb") as out:
                    if source is not None:
                        shutil.copyfileobj(source, out, 1 << 20)
                os.chmod(target, mode)
            elif member.issym():
                _remove(target)
                os.symlink(member.linkname, target)
            elif member.islnk():
                source_path = resolve(root, _relative(member.linkname), follow_last=False)
                if source_path.is_symlink() or not source_path.is_file():
                    raise UnsafeLayer(f"hard link {member.name!r} to {member.linkname!r}: not a file of the image")
                _remove(target)
                os.link(source_path, target, follow_symlinks=False)
                continue
            else:
                continue  # devices and FIFOs: not for a pod
            with contextlib.suppress(OSError):
                os.lchown(target, member.uid, member.gid)
            if member.isdir() or member.isreg():
                os.chmod(target, mode if member.isreg() else mode | 0o700)


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, value = digest.partition(":")
    if algorithm != "sha256" or len(value) != 64 or not all(c in "0123456789abcdef" for c in value):
        raise PullError(f"unsupported digest {digest!r}")
    return layout / "blobs" / "sha256" / value


def _read_json(path: Path) -> Obj:
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise PullError(f"{path.name}: not a JSON object")
    return data


def unpack(layout: Path, target: Path) -> tuple[str, Obj]:
    """Unpack the one image of an OCI layout into `target`: (manifest digest, image config)."""
    index = _read_json(layout / "index.json")
    manifests = index.get("manifests") or []
    if len(manifests) != 1:
        raise PullError("the pulled layout holds no single image")
    digest = str(manifests[0]["digest"])
    manifest_blob = _blob(layout, digest)
    if "sha256:" + hashlib.sha256(manifest_blob.read_bytes()).hexdigest() != digest:
        raise PullError("the manifest does not match its digest")
    manifest = _read_json(manifest_blob)
    config = _read_json(_blob(layout, str(manifest["config"]["digest"])))
    target.mkdir(parents=True)
    os.chmod(target, 0o755)
    for layer in manifest.get("layers") or []:
        with _open_layer(_blob(layout, str(layer["digest"])), str(layer.get("mediaType", ""))) as stream:
            apply_layer(target, stream)
    return digest, dict(config.get("config") or {})


# -- the store --------------------------------------------------------------------------------------------

class ImageStore:
    """Images this node pulled: `images/<digest>/rootfs` and `config.json`, `images/refs.json` (name ->
    digest). Pulls run in a thread (skopeo and unpacking block); one at a time per store."""

    def __init__(self, root: Path, insecure_registries: Iterable[str] = (), skopeo: str = "skopeo") -> None:
        self.root = root
        self.insecure = set(insecure_registries)
        self.skopeo = skopeo
        self._lock = threading.Lock()

    def _refs(self) -> dict[str, str]:
        try:
            return {str(k): str(v) for k, v in _read_json(self.root / "refs.json").items()}
        except (OSError, ValueError, PullError):
            return {}

    def _cached(self, digest: str, reference: str) -> PulledImage | None:
        base = self.root / digest.replace(":", "-")
        try:
            config = _read_json(base / "config.json")
        except (OSError, ValueError, PullError):
            return None
        return PulledImage(reference, digest, base / "rootfs", config) if (base / "rootfs").is_dir() else None

    def get(self, reference: str, policy: str = "IfNotPresent", secrets: Iterable[Obj] = ()) -> PulledImage:
        with self._lock:
            if policy in ("IfNotPresent", "Never"):
                digest = self._refs().get(reference)
                present = self._cached(digest, reference) if digest else None
                if present is not None:
                    return present
                if policy == "Never":
                    raise PullError(f'Container image "{reference}" is not present with pull policy of Never',
                                    never=True)
            return self._pull(reference, list(secrets))

    def _pull(self, reference: str, secrets: list[Obj]) -> PulledImage:
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".pull-") as work:
            layout = Path(work) / "layout"
            cmd = [self.skopeo, "copy", "--quiet", "--retry-times", "1"]
            host = registry_host(reference)
            if loopback(host) or host in self.insecure:
                cmd.append("--src-tls-verify=false")
            auths = auth_file(secrets)
            if auths["auths"]:
                authfile = Path(work) / "auth.json"
                fd = os.open(authfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as f:
                    json.dump(auths, f)
                cmd += ["--src-authfile", str(authfile)]
            cmd += [f"docker://{reference}", f"oci:{layout}:image"]
            try:
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False,
                                      stdin=subprocess.DEVNULL)
            except (OSError, subprocess.TimeoutExpired) as exc:
                raise PullError(f'failed to pull and unpack image "{reference}": {exc}') from exc
            if done.returncode != 0:
                detail = " ".join(done.stderr.split())[-600:]
                raise PullError(f'failed to pull and unpack image "{reference}": {detail}')
            digest = str(_read_json(layout / "index.json")["manifests"][0]["digest"])
            present = self._cached(digest, reference)
            if present is None:
                staging = Path(work) / "image"
                try:
                    digest, config = unpack(layout, staging / "rootfs")
                except (UnsafeLayer, tarfile.TarError, OSError, KeyError, ValueError) as exc:
                    raise PullError(f'failed to pull and unpack image "{reference}": {exc}') from exc
                (staging / "config.json").write_text(json.dumps(config))
                final = self.root / digest.replace(":", "-")
                if final.exists():
                    shutil.rmtree(final)
                staging.rename(final)
                present = self._cached(digest, reference)
                assert present is not None
            refs = self._refs()
            refs[reference] = digest
            (self.root / "refs.json.tmp").write_text(json.dumps(refs))
            (self.root / "refs.json.tmp").replace(self.root / "refs.json")
            return present


def image_passwd(rootfs: Path) -> Iterator[list[str]]:
    """The entries of the image's /etc/passwd, read inside the image (never through a symlink out)."""
    yield from _colon_file(rootfs, "etc/passwd")


def image_group(rootfs: Path) -> Iterator[list[str]]:
    yield from _colon_file(rootfs, "etc/group")


def _colon_file(rootfs: Path, inner: str) -> Iterator[list[str]]:
    try:
        path = resolve(rootfs, inner)
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode) or info.st_size > 1 << 20:
            return
        text = path.read_text(errors="replace")
    except (OSError, UnsafeLayer):
        return
    for line in text.splitlines():
        if line and not line.startswith("#"):
            yield line.split(":")
