"""`cdi image-upload dv|pvc NAME --image-path FILE [--size SIZE] ...`: virtctl image-upload's
sub-commands, flags and steps, plus what its users asked for.

Steps (virtctl's): check the file, create the DataVolume (`source.upload`, `storage` API) or the PVC
(annotated as an upload target) unless it exists, wait for the upload server, find the proxy URL
(`--uploadproxy-url`, else CDIConfig `spec.uploadProxyURLOverride`, else `status.uploadProxyURL`),
get an upload token, probe the async endpoint, send the file, wait for processing to finish.

Beyond virtctl:

* checks before anything is created (`preflight.py`): readable file, format, backing files, the
  virtual size against what the volume will really hold, the access mode;
* the format is written on the new DataVolume/PVC (`cdi.kubevirt.io/storage.upload.format`), so an
  image that streams gets no scratch volume;
* a progress bar with rate and ETA on a terminal, plain lines otherwise (`progress.py`);
* automatic resume after a dropped connection or a restarted upload server, and of what an earlier,
  killed invocation left on the volume (`transfer.py`);
* the proxy's CA found without flags (ConfigMap `cdi/cdi-uploadproxy-ca`, or `cdi up`'s
  `uploadproxy-ca.crt` next to the kubeconfig), so `--insecure` is not needed;
* no proxy URL at all (none given, none in CDIConfig), or `--through-apiserver`: the upload goes through
  the Kubernetes API server named in the kubeconfig, with the kubeconfig's own credentials, to the proxy's
  aggregated API (`upload.extensions.cdi.dev`, `cdi.api.upload`): what a user who can reach the API server
  can always reach, authorized by RBAC (`uploads/proxy` in the namespace) instead of an upload token;
* a completion summary."""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path
from typing import Any

from cdi.api import annotations as ann
from cdi.api import upload as names
from cdi.api.checksum import ChecksumSyntaxError, parse_checksum
from cdi.api.quantity import QuantityError, parse_bytes
from cdi.cli.imageupload.cluster import INSTANCETYPE_LABELS, Cluster, ClusterError, Request, ssl_context
from cdi.cli.imageupload.preflight import (
    ImageFacts,
    PreflightError,
    capacity,
    check_access_mode,
    check_fits,
    inspect,
)
from cdi.cli.imageupload.progress import Progress, human
from cdi.cli.imageupload.transfer import ApiServerCredentials, TokenSource, Transfer, TransferStats, UploadFailed
from cdi.kube import ApiError, KubeClient
from cdi.kube.config import ConfigError, find_kubeconfig
from cdi.kube.direct import DirectAccess

PROCESSING_TIMEOUT = 24 * 3600.0
EXAMPLES = """examples:
  # upload a local disk image to a new DataVolume
  cdi image-upload dv fedora-dv --size=10Gi --image-path=/images/fedora.qcow2
  # to an existing DataVolume
  cdi image-upload dv fedora-dv --no-create --image-path=/images/fedora.qcow2
  # to a new PersistentVolumeClaim, as a Block volume
  cdi image-upload pvc fedora-pvc --size=10Gi --volume-mode=block --image-path=/images/fedora.raw
  # through an explicit upload proxy URL
  cdi image-upload dv fedora-dv --uploadproxy-url=https://cdi-uploadproxy.example.com --image-path=fedora.img
  # verified: the upload server fails the upload (ChecksumMismatch) unless the bytes it received hash to it
  cdi image-upload dv fedora-dv --size=10Gi --image-path=fedora.qcow2 --checksum=sha256:$(sha256sum fedora.qcow2)
  # an archive (tar) into a Filesystem DataVolume
  cdi image-upload dv files-dv --size=1Gi --archive-path=/tmp/files.tar
  # and a DataSource of the same name pointing at the result, labelled for instance types
  cdi image-upload dv fedora --size=10Gi --image-path=fedora.qcow2 --datasource --default-preference=fedora
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "image-upload", help="upload a local disk image into a DataVolume or PVC (virtctl image-upload)",
        description="Upload a VM image to a DataVolume/PersistentVolumeClaim.", epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", nargs="?", metavar="dv|pvc", help="create/use a DataVolume or a bare PVC")
    parser.add_argument("name", nargs="?", help="the DataVolume/PVC name")
    parser.add_argument("--image-path", default="", help="path to the local VM image")
    parser.add_argument("--archive-path", default="", help="path to a local tar archive (Filesystem volume only)")
    parser.add_argument("--size", default="", help="size of the DataVolume/PVC to create (e.g. 10Gi, 500Mi)")
    parser.add_argument("--storage-class", default="", help="storage class of the PVC")
    parser.add_argument("--access-mode", default="", help="access mode of the PVC (ReadOnlyMany is refused)")
    parser.add_argument("--volume-mode", default="", help="block or filesystem (default: the storage profile's)")
    parser.add_argument("--block-volume", action="store_true", help="DEPRECATED: --volume-mode=block")
    parser.add_argument("--no-create", action="store_true", help="don't create a DataVolume/PVC; use an existing one")
    parser.add_argument("--checksum", default="",
                        help="ALGORITHM:HEX (sha256, sha512, sha1, md5) the image file must hash to: written on the "
                             f"DataVolume/PVC created ({ann.UPLOAD_CHECKSUM}) and checked by the upload server "
                             "against the bytes it receives; an existing one must carry it already")
    parser.add_argument("--force-bind", action="store_true",
                        help="bind the PVC now, ignoring WaitForFirstConsumer")
    parser.add_argument("--insecure", action="store_true", help="do not verify the upload proxy's certificate")
    parser.add_argument("--uploadproxy-url", default="", help="URL of the upload proxy (default: from CDIConfig)")
    parser.add_argument("--uploadproxy-ca", type=Path, default=None,
                        help="CA file for the upload proxy's certificate (default: published by the cluster)")
    parser.add_argument("--through-apiserver", action="store_true",
                        help="upload through the Kubernetes API server with the kubeconfig's credentials, even where "
                             "an upload proxy URL is configured (the default when none is)")
    parser.add_argument("--wait-secs", type=int, default=300, help="seconds to wait for the upload pod (default 300)")
    parser.add_argument("--retry", type=int, default=5,
                        help="connections to try when the upload is cut off, resuming each time (default 5)")
    parser.add_argument("--datasource", action="store_true",
                        help="create a DataSource pointing to the DataVolume/PVC (or re-point one of that name)")
    parser.add_argument("--pvc-name", default="", help="DEPRECATED: the name as the second argument instead")
    parser.add_argument("--pvc-size", default="", help="DEPRECATED: --size")
    for flag, what in (("default-instancetype", "default instance type"),
                       ("default-instancetype-kind", "default instance type kind"),
                       ("default-preference", "default preference"),
                       ("default-preference-kind", "default preference kind")):
        parser.add_argument(f"--{flag}", default="", help=f"the {what} to label the volume with")
    parser.add_argument("-n", "--namespace", default="", help="namespace (default: the kubeconfig context's)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig (default $KUBECONFIG, then ~/.kube/config)")
    parser.set_defaults(run=run)


class UsageError(Exception):
    pass


def parse(args: argparse.Namespace) -> tuple[str, str, str, bool, str]:
    """(kind, name, size, archive, volume mode) from the arguments, with virtctl's rules and messages."""
    size = args.size
    if args.pvc_size:
        if size and size != args.pvc_size:
            raise UsageError("--pvc-size and --size can not be specified at the same time")
        size = args.pvc_size
    volume_mode = args.volume_mode.lower()
    if args.block_volume:
        if volume_mode and volume_mode != "block":
            raise UsageError(f"incompatible --volume-mode '{args.volume_mode}' and --block-volume")
        volume_mode = "block"
    if volume_mode not in ("", "block", "filesystem"):
        raise UsageError(f"Invalid volume mode '{args.volume_mode}'. Valid values are 'block' and 'filesystem'.")
    if not args.image_path and not args.archive_path:
        raise UsageError("either image-path or archive-path must be provided")
    if args.image_path and args.archive_path:
        raise UsageError("cannot handle both image-path and archive-path, provide only one")
    archive = bool(args.archive_path)
    if archive and volume_mode == "block":
        raise UsageError("In archive upload the volume mode should always be filesystem")
    if args.pvc_name:
        if args.kind or args.name:
            raise UsageError("cannot use --pvc-name and args")
        return "pvc", args.pvc_name, size, archive, volume_mode
    if not args.kind or not args.name:
        raise UsageError("expecting two args: dv|pvc NAME")
    kind = args.kind.lower()
    if kind not in ("dv", "pvc"):
        raise UsageError(f"invalid resource type {args.kind}")
    if (args.default_instancetype_kind and not args.default_instancetype) or \
            (args.default_preference_kind and not args.default_preference):
        raise UsageError("--default-instancetype/--default-preference must be given with their -kind flags")
    if (args.default_instancetype or args.default_preference) and args.no_create:
        raise UsageError("--default-instancetype and --default-preference cannot be used with --no-create")
    if args.checksum:
        try:
            parse_checksum(args.checksum)
        except ChecksumSyntaxError as exc:
            raise UsageError(f"--checksum: {exc}") from None
    return kind, args.name, size, archive, volume_mode


def _normal_checksum(text: str) -> str:
    """`algorithm:hex` in lower case, as the annotation is written ("" for none)."""
    if not text:
        return ""
    algorithm, digest = parse_checksum(text)
    return f"{algorithm}:{digest}"


def run(args: argparse.Namespace) -> int:
    try:
        return asyncio.run(upload(args))
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (PreflightError, ClusterError, UploadFailed, ConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted; an upload already sent keeps processing on the server", file=sys.stderr)
        return 130


def say(text: str) -> None:
    print(text, flush=True)


async def upload(args: argparse.Namespace) -> int:
    kind, name, size, archive, volume_mode = parse(args)
    path = Path(args.archive_path or args.image_path)
    check_access_mode(args.access_mode)
    image = inspect(path, archive=archive)
    if size:
        try:
            parse_bytes(size)
        except QuantityError as exc:
            raise UsageError(f"validation failed for size={size}: {exc}") from None
    kubeconfig = find_kubeconfig(args.kubeconfig)
    client = await KubeClient.connect(args.kubeconfig)
    try:
        labels = {label: getattr(args, attr) for attr, label in INSTANCETYPE_LABELS.items() if getattr(args, attr)}
        request = Request(kind=kind, name=name, namespace=args.namespace or client.namespace or "default", size=size,
                          storage_class=args.storage_class, access_mode=args.access_mode, volume_mode=volume_mode,
                          archive=archive, force_bind=args.force_bind, no_create=args.no_create,
                          upload_format="" if archive else image.annotation, labels=labels,
                          checksum=_normal_checksum(args.checksum))
        cluster = Cluster(client, kubeconfig)
        return await _upload(args, request, image, cluster)
    except ApiError as exc:
        raise ClusterError(str(exc)) from None
    finally:
        await client.close()


async def _upload(args: argparse.Namespace, request: Request, image: ImageFacts, cluster: Cluster) -> int:
    existing = await cluster.find(request)
    if existing is None:
        if not request.size:
            raise UsageError("when creating a resource, the size must be specified")
        claim_bytes, mode, overhead = await cluster.planned_claim(request)
        check_fits(image, capacity(claim_bytes, mode, overhead), request.size,
                   datavolume_storage_api=request.kind == "dv")
        say(await cluster.create(request))
    elif existing:
        claim_bytes, mode, overhead = await cluster.existing_claim(existing)
        check_fits(image, capacity(claim_bytes, mode, overhead), "", datavolume_storage_api=False)
        await cluster.mark_upload_target(existing, request)
        say(f"Using existing PVC {request.key}")
    else:
        say(f"Using existing DataVolume {request.key}")
    await cluster.wait_ready(request, float(args.wait_secs), say)
    url = args.uploadproxy_url or ("" if args.through_apiserver else await cluster.proxy_url())
    loop = asyncio.get_running_loop()

    def failed() -> str | None:
        return asyncio.run_coroutine_threadsafe(cluster.failure(request), loop).result(60)

    progress = Progress(image.size)
    if url:
        if "://" not in url:
            url = f"https://{url}"
        context = ssl_context(await cluster.proxy_ca(), insecure=args.insecure, extra_ca=args.uploadproxy_ca)
        say(f"Uploading data to {url}")

        def fetch_token() -> str:
            return asyncio.run_coroutine_threadsafe(cluster.token(request), loop).result(60)

        tokens = TokenSource(fetch_token)
        await asyncio.to_thread(tokens.get)
        transfer = Transfer(url, context, tokens, request.key, str(image.path), progress,
                            attempts=max(1, args.retry), failed=failed)
    else:
        direct = DirectAccess.of(cluster.client.config)
        why = "as asked" if args.through_apiserver else "no upload proxy URL is configured"
        say(f"Uploading data through the Kubernetes API server {direct.server} ({why}; "
            f"{names.EXTENSION_API_VERSION} {names.EXTENSION_RESOURCE}/{names.EXTENSION_SUBRESOURCE})")
        credentials = ApiServerCredentials(lambda: direct.authorization_from(loop))
        transfer = Transfer(direct.server + names.extension_base(request.namespace, request.name), direct.context,
                            credentials, request.key, str(image.path), progress, attempts=max(1, args.retry),
                            failed=failed, server_hostname=direct.server_hostname)
    say(f"Uploading {image.path} ({image.describe()})")
    stats = await asyncio.to_thread(transfer.run)
    if args.datasource:
        say(await cluster.point_datasource(request))
    say("Uploading data completed successfully, waiting for processing to complete, you can hit ctrl-c without "
        "interrupting the progress")
    started = time.monotonic()
    phase = await cluster.wait_done(request, PROCESSING_TIMEOUT)
    say(f"Uploading {image.path} completed successfully")
    summary(request, image, stats, phase, time.monotonic() - started)
    return 0


def summary(request: Request, image: ImageFacts, stats: TransferStats, phase: str, processing: float) -> None:
    rate = stats.sent / stats.seconds if stats.seconds else 0.0
    what = "DataVolume" if request.kind == "dv" else "PersistentVolumeClaim"
    lines = [
        "Summary:",
        f"  image      {image.path} ({image.describe()})",
        f"  sent       {human(stats.sent)} ({stats.sent} bytes) in {stats.seconds:.1f}s ({human(rate)}/s), "
        f"{len(stats.attempts)} attempt{'s' if len(stats.attempts) != 1 else ''}, endpoint {stats.path}"
        + (" (TLS end to end with the upload server)" if stats.attempts and stats.attempts[-1].end_to_end else "")
        + (" through the Kubernetes API server" if stats.via_apiserver else ""),
    ]
    if stats.skipped:
        lines.append(f"  skipped    {human(stats.skipped)} ({stats.skipped} bytes) already on the volume from an "
                     "earlier upload, not sent again")
    if len(stats.attempts) > 1:
        last = stats.attempts[-1]
        lines.append(f"  resumed    at {human(last.offset)} ({last.offset} bytes); the last attempt sent "
                     f"{human(last.sent)} ({last.sent} bytes)")
    lines.append(f"  processing {processing:.1f}s after the upload")
    lines.append(f"  result     {what} {request.key} {phase}")
    say("\n".join(lines))
