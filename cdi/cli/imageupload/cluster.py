"""What `cdi image-upload` asks of the cluster: the volume to upload into (found or created, as
virtctl does it), its readiness, the upload proxy's URL and CA, tokens, and the final phase."""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups
from cdi.api.checksum import ChecksumSyntaxError, parse_checksum
from cdi.api.quantity import parse_bytes
from cdi.api.rendering import ClusterStorage, RenderError, render_claim_spec
from cdi.api.sizing import DEFAULT_FILESYSTEM_OVERHEAD
from cdi.api.views import ClaimView, DataVolumeView, ObjectView, condition
from cdi.common import pki
from cdi.kube import ApiError, KubeClient, NotFound
from cdi.uploadproxy.serving import CA_CONFIGMAP, CA_FILE_NEXT_TO_KUBECONFIG, CA_KEY

Obj = dict[str, Any]
TOKEN_REQUEST_NAME = "token-for-cdi-image-upload"
# image-upload's option (its argparse dest) -> the label it sets
INSTANCETYPE_LABELS = {"default_instancetype": ann.LABEL_DEFAULT_INSTANCETYPE,
                       "default_instancetype_kind": ann.LABEL_DEFAULT_INSTANCETYPE_KIND,
                       "default_preference": ann.LABEL_DEFAULT_PREFERENCE,
                       "default_preference_kind": ann.LABEL_DEFAULT_PREFERENCE_KIND}


class ClusterError(Exception):
    """The cluster is not in a state the upload can proceed from (the message says what to do)."""


@dataclass
class Request:
    """The volume the user asked for (flags of virtctl image-upload)."""

    kind: str  # "dv" or "pvc"
    name: str
    namespace: str
    size: str = ""
    storage_class: str = ""
    access_mode: str = ""
    volume_mode: str = ""  # "", "block", "filesystem"
    archive: bool = False
    force_bind: bool = False
    no_create: bool = False
    upload_format: str = ""  # for the `storage.upload.format` annotation (`ann.UPLOAD_FORMAT`)
    checksum: str = ""  # `algorithm:hex` for the `extensions.cdi.dev/upload.checksum` annotation (ours)
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _volume_mode(request: Request) -> str | None:
    return {"block": "Block", "filesystem": "Filesystem"}.get(request.volume_mode.lower())


def datavolume_body(request: Request) -> Obj:
    storage: Obj = {"resources": {"requests": {"storage": request.size}}}
    if request.storage_class:
        storage["storageClassName"] = request.storage_class
    if request.access_mode:
        storage["accessModes"] = [request.access_mode]
    mode = "Filesystem" if request.archive else _volume_mode(request)
    if mode:
        storage["volumeMode"] = mode
    annotations = {ann.UPLOAD_FORMAT: request.upload_format} if request.upload_format else {}
    if request.checksum:
        annotations[ann.UPLOAD_CHECKSUM] = request.checksum
    if request.force_bind:
        annotations[ann.BIND_IMMEDIATE] = ""
    spec: Obj = {"source": {"upload": {}}, "storage": storage}
    if request.archive:
        spec["contentType"] = "archive"
    metadata: Obj = {"name": request.name, "namespace": request.namespace, "annotations": annotations}
    if request.labels:
        metadata["labels"] = dict(request.labels)
    return {"apiVersion": groups.CDI_API_VERSION, "kind": "DataVolume", "metadata": metadata, "spec": spec}


def pvc_body(request: Request) -> Obj:
    spec: Obj = {"accessModes": [request.access_mode or "ReadWriteOnce"],
                 "resources": {"requests": {"storage": request.size}}}
    if request.storage_class:
        spec["storageClassName"] = request.storage_class
    mode = "Filesystem" if request.archive else _volume_mode(request)
    if mode:
        spec["volumeMode"] = mode
    annotations = {ann.UPLOAD_TARGET: "", ann.CONTENT_TYPE: "archive" if request.archive else "kubevirt"}
    if request.upload_format:
        annotations[ann.UPLOAD_FORMAT] = request.upload_format
    if request.checksum:
        annotations[ann.UPLOAD_CHECKSUM] = request.checksum
    if request.force_bind:
        annotations[ann.BIND_IMMEDIATE] = ""
    metadata: Obj = {"name": request.name, "namespace": request.namespace, "annotations": annotations}
    if request.labels:
        metadata["labels"] = dict(request.labels)
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": spec}


def datasource_body(request: Request) -> Obj:
    metadata: Obj = {"name": request.name, "namespace": request.namespace}
    if request.labels:
        metadata["labels"] = dict(request.labels)
    return {"apiVersion": groups.CDI_API_VERSION, "kind": "DataSource", "metadata": metadata,
            "spec": {"source": {"pvc": {"name": request.name, "namespace": request.namespace}}}}


def _check_checksum(request: Request, expected: str) -> None:
    """`--checksum` on a volume that exists must be what it says: the upload server checks only what the
    DataVolume or claim the user wrote says (its pod was made from it), never what a client sends, so a
    checksum given on the command line alone would be checked by nobody."""
    if not request.checksum:
        return
    try:
        same = bool(expected) and parse_checksum(expected) == parse_checksum(request.checksum)
    except ChecksumSyntaxError:
        same = False
    if not same:
        raise ClusterError(
            f"{request.key} expects {f'checksum {expected}' if expected else 'no checksum'}, not {request.checksum}: "
            f"the upload server checks what the DataVolume or PVC says; create it with the annotation "
            f"{ann.UPLOAD_CHECKSUM}={request.checksum}")


class Cluster:
    def __init__(self, client: KubeClient, kubeconfig: Path | None) -> None:
        self.client = client
        self.kubeconfig = kubeconfig

    # -- sizing ---------------------------------------------------------------------------------------
    async def storage(self) -> ClusterStorage:
        """Storage classes, profiles and CDIConfig status, as far as the user may read them."""
        classes = await self._list(groups.STORAGECLASSES)
        profiles = {ObjectView(p).name: p for p in await self._list(groups.STORAGEPROFILES)}
        status: Mapping[str, Any] = {}
        try:
            status = ObjectView(await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)).status
        except ApiError:
            pass
        return ClusterStorage(classes, profiles, status)

    async def _list(self, gvr: groups.GVR) -> list[Obj]:
        try:
            return list((await self.client.list(gvr)).items)
        except ApiError:
            return []

    async def planned_claim(self, request: Request) -> tuple[int, str, str]:
        """(PVC size in bytes, volume mode, filesystem overhead) of the volume that will be created."""
        storage = await self.storage()
        if request.kind == "dv":
            try:
                spec = render_claim_spec(datavolume_body(request), storage)
            except RenderError as exc:
                raise ClusterError(f"the DataVolume would not be valid: {exc}") from None
        else:
            spec = dict(pvc_body(request)["spec"])
            if not spec.get("storageClassName"):
                default = storage.default_class("kubevirt")
                if default is not None:
                    spec["storageClassName"] = ObjectView(default).name
        return self._claim_numbers(ClaimView({"spec": spec}), storage)

    def _claim_numbers(self, claim: ClaimView, storage: ClusterStorage) -> tuple[int, str, str]:
        """Its size (the capacity once bound, else the request), volume mode and filesystem overhead."""
        size = parse_bytes(claim.capacity or claim.requested_storage or 0)
        mode = claim.volume_mode
        overhead = storage.filesystem_overhead(claim.storage_class) if mode == "Filesystem" else "0"
        return size, mode, str(overhead or DEFAULT_FILESYSTEM_OVERHEAD)

    async def existing_claim(self, pvc: Mapping[str, Any]) -> tuple[int, str, str]:
        return self._claim_numbers(ClaimView(pvc), await self.storage())

    # -- the volume -----------------------------------------------------------------------------------
    async def find(self, request: Request) -> Obj | None:
        """The existing PVC to upload into (virtctl's getAndValidateUploadPVC), or None."""
        try:
            pvc = await self.client.get(groups.PVCS, request.name, request.namespace)
        except NotFound:
            if request.kind == "dv" and not request.no_create:
                try:
                    dv = await self.client.get(groups.DATAVOLUMES, request.name, request.namespace)
                except NotFound:
                    pass
                else:
                    _check_checksum(request, DataVolumeView(dv).annotations.get(ann.UPLOAD_CHECKSUM, ""))
                    return {}  # the DataVolume exists and its PVC is on the way
            if request.no_create:
                raise ClusterError(f"PVC {request.key} not found (and --no-create was given)") from None
            return None
        if request.kind == "dv":
            try:
                await self.client.get(groups.DATAVOLUMES, request.name, request.namespace)
            except NotFound:
                raise ClusterError(f"No DataVolume is associated with the existing PVC {request.key}") from None
        annotations = ClaimView(pvc).annotations
        if annotations.get(ann.POD_PHASE) == "Succeeded":
            raise ClusterError(f"PVC {request.name} already successfully imported/cloned/updated")
        populated = ClaimView(pvc).populator_ref.get("kind") == "VolumeUploadSource"  # its prime takes it
        if not request.no_create and ann.UPLOAD_TARGET not in annotations and not populated:
            raise ClusterError(f"PVC {request.name} not available for upload")
        if ann.UPLOAD_TARGET in annotations or populated:  # else `mark_upload_target` writes the checksum
            _check_checksum(request, annotations.get(ann.UPLOAD_CHECKSUM, ""))
        return pvc

    async def create(self, request: Request) -> str:
        if request.kind == "dv":
            await self.client.create(groups.DATAVOLUMES, datavolume_body(request), request.namespace)
            return f"DataVolume {request.key} created"
        await self.client.create(groups.PVCS, pvc_body(request), request.namespace)
        return f"PersistentVolumeClaim {request.key} created"

    async def mark_upload_target(self, pvc: Obj, request: Request) -> None:
        """An existing PVC becomes an upload target (virtctl's ensurePVCSupportsUpload)."""
        if ann.UPLOAD_TARGET in ClaimView(pvc).annotations or \
                ClaimView(pvc).populator_ref.get("kind") == "VolumeUploadSource":
            return
        wanted = {ann.UPLOAD_TARGET: ""}
        if request.upload_format:
            wanted[ann.UPLOAD_FORMAT] = request.upload_format
        if request.checksum:  # written with the mark, so the upload server's pod is made with it
            wanted[ann.UPLOAD_CHECKSUM] = request.checksum
        await self.client.patch(groups.PVCS, request.name, {"metadata": {"annotations": wanted}}, request.namespace)

    async def wait_ready(self, request: Request, timeout: float, say: Any) -> None:
        """Until the upload server is ready (DataVolume UploadReady, or the PVC's pod.ready annotation)."""
        deadline = time.monotonic() + timeout
        said = False
        while True:
            ready, problem = await self._readiness(request)
            if problem:
                raise ClusterError(problem)
            if ready:
                if said:
                    say("Pod now ready")
                return
            if not said:
                say(f"Waiting for PVC {request.name} upload pod to be ready...")
                said = True
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out after {timeout:.0f}s waiting for the upload server of "
                                   f"{request.key} to be ready (--wait-secs)")
            await asyncio.sleep(0.5)

    async def _readiness(self, request: Request) -> tuple[bool, str]:
        if request.kind == "dv":
            try:
                dv = await self.client.get(groups.DATAVOLUMES, request.name, request.namespace)
            except NotFound:
                return False, ""
            phase = DataVolumeView(dv).phase
            if phase in ("WaitForFirstConsumer", "PendingPopulation"):
                return False, (f"cannot upload to DataVolume in {phase} state, make sure the PVC is Bound "
                               "(or use --force-bind)")
            if phase == "Failed":
                return False, f"DataVolume {request.key} failed: {_conditions(dv)}"
            if phase == "Succeeded":
                return False, f"DataVolume {request.key} already succeeded"
            return phase == "UploadReady", ""
        try:
            pvc = await self.client.get(groups.PVCS, request.name, request.namespace)
        except NotFound:
            return False, ""
        claim = ClaimView(pvc)
        annotations = claim.annotations
        if annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            return False, (f"the upload into PVC {request.key} failed: {annotations.get(ann.CONDITION_RUNNING_REASON)}"
                           f": {annotations.get(ann.CONDITION_RUNNING_MESSAGE)}")
        if claim.phase == "Pending" and ann.BIND_IMMEDIATE not in annotations:
            storage = await self.storage()
            sc = storage.storage_class(claim.storage_class)
            if (sc or {}).get("volumeBindingMode") == "WaitForFirstConsumer":
                return False, (f"cannot upload to PVC {request.key}: its storage class binds on first consumer; "
                               "make sure the PVC is Bound (or use --force-bind)")
        return annotations.get(ann.POD_READY) == "true", ""

    # -- proxy, token, result -------------------------------------------------------------------------
    async def proxy_url(self) -> str:
        """CDIConfig `spec.uploadProxyURLOverride`, else `status.uploadProxyURL` (as virtctl); "" when neither
        is set or CDIConfig cannot be read (the upload then goes through the API server, where virtctl says
        "uploadproxy URL not found")."""
        try:
            config = await self.client.get(groups.CDICONFIGS, groups.CDI_CONFIG_NAME)
        except ApiError:
            return ""
        view = ObjectView(config)
        url = str(view.spec.get("uploadProxyURLOverride") or view.status.get("uploadProxyURL") or "")
        if not url:
            return ""
        return url if "://" in url else f"https://{url}"

    async def proxy_ca(self) -> list[str]:
        """PEM CAs that may have signed the proxy's certificate: ConfigMap `cdi/cdi-uploadproxy-ca`, and the file
        `cdi up` writes next to its kubeconfig. Either may be missing (then the system trust store decides)."""
        found: list[str] = []
        try:
            configmap = await self.client.get(groups.CONFIGMAPS, CA_CONFIGMAP, groups.CDI_NAMESPACE)
            text = (configmap.get("data") or {}).get(CA_KEY)
            if text:
                found.append(text)
        except ApiError:
            pass
        if self.kubeconfig is not None:
            beside = self.kubeconfig.parent / CA_FILE_NEXT_TO_KUBECONFIG
            if beside.is_file():
                found.append(beside.read_text())
        return found

    async def token(self, request: Request) -> str:
        body = {"apiVersion": groups.UPLOAD_API_VERSION, "kind": "UploadTokenRequest",
                "metadata": {"name": TOKEN_REQUEST_NAME, "namespace": request.namespace},
                "spec": {"pvcName": request.name}}
        try:
            response = await self.client.create(groups.UPLOADTOKENREQUESTS, body, request.namespace)
        except ApiError as exc:
            raise ClusterError(f"cannot get an upload token for {request.key}: {exc}") from None
        token = ObjectView(response).status.get("token")
        if not token:
            raise ClusterError("the UploadTokenRequest came back without a token")
        return str(token)

    async def point_datasource(self, request: Request) -> str:
        """A DataSource named like the volume and pointing at it (virtctl's `--datasource`), with the
        instance-type labels: created, or an existing one re-pointed (keeping its other labels; a
        snapshot or DataSource it pointed at is dropped, where virtctl's patch would fail)."""
        try:
            await self.client.get(groups.DATASOURCES, request.name, request.namespace)
        except NotFound:
            await self.client.create(groups.DATASOURCES, datasource_body(request), request.namespace)
            return f"Created a new DataSource {request.key}"
        pvc = {"name": request.name, "namespace": request.namespace}
        patch: Obj = {"spec": {"source": {"pvc": pvc, "snapshot": None, "dataSource": None}}}
        if request.labels:
            patch["metadata"] = {"labels": dict(request.labels)}
        await self.client.patch(groups.DATASOURCES, request.name, patch, request.namespace)
        return f"Updated an existing DataSource {request.key}"

    async def failure(self, request: Request) -> str | None:
        """Why the upload cannot succeed any more, if so: the DataVolume (for `dv`) or the PVC (for `pvc`) was
        deleted or is being deleted (its upload server goes with it, and nothing will ever answer where to
        resume), or the PVC's fatal-error annotation says the upload failed. Asked whenever a broken upload
        is about to be retried, so that the user hears it at once instead of after the retries' 3 minutes
        ending in the proxy's 503."""
        if request.kind == "dv":
            try:
                dv = await self.client.get(groups.DATAVOLUMES, request.name, request.namespace)
            except NotFound:
                return f"DataVolume {request.key} was deleted during the upload"
            except ApiError:
                return None
            if DataVolumeView(dv).deleting:
                return f"DataVolume {request.key} was deleted during the upload (it is being removed)"
        try:
            pvc = await self.client.get(groups.PVCS, request.name, request.namespace)
        except NotFound:
            # a DataVolume's claim may be on its way again (its controller recreates it); a bare claim is gone
            return f"PersistentVolumeClaim {request.key} was deleted during the upload" if request.kind == "pvc" \
                else None
        except ApiError:
            return None
        if request.kind == "pvc" and ClaimView(pvc).deleting:
            return f"PersistentVolumeClaim {request.key} was deleted during the upload (it is being removed)"
        annotations = ClaimView(pvc).annotations
        if annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
            return (f"the upload into {request.key} failed: {annotations.get(ann.CONDITION_RUNNING_REASON)}: "
                    f"{annotations.get(ann.CONDITION_RUNNING_MESSAGE)}")
        return None

    async def wait_done(self, request: Request, timeout: float) -> str:
        """The final phase (`Succeeded`), or ClusterError with the failure's reason. Looked at every 0.1s
        for the first seconds (after an async upload of a raw image only the final flush is left, which
        takes well under a second), then every 0.5s."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            try:
                pvc = await self.client.get(groups.PVCS, request.name, request.namespace)
            except NotFound:
                pvc = {}
            annotations = ClaimView(pvc).annotations
            if request.kind == "dv":
                try:
                    dv = await self.client.get(groups.DATAVOLUMES, request.name, request.namespace)
                except NotFound:
                    raise ClusterError(f"DataVolume {request.key} was deleted") from None
                phase = DataVolumeView(dv).phase
                if phase == "Succeeded":
                    return phase
                if phase == "Failed":
                    raise ClusterError(f"DataVolume {request.key} failed: {_conditions(dv)}")
            elif annotations.get(ann.POD_PHASE) == "Succeeded":
                return "Succeeded"
            if annotations.get(ann.IMPORT_FATAL_ERROR) == "true":
                raise ClusterError(f"the upload into {request.key} failed: "
                                   f"{annotations.get(ann.CONDITION_RUNNING_REASON)}: "
                                   f"{annotations.get(ann.CONDITION_RUNNING_MESSAGE)}")
            if time.monotonic() > deadline:
                raise ClusterError(f"timed out waiting for the processing of {request.key}; the upload server "
                                   "keeps working, check the DataVolume or PVC")
            await asyncio.sleep(0.1 if time.monotonic() - started < FAST_POLL_SECONDS else 0.5)


FAST_POLL_SECONDS = 5.0


def _conditions(dv: Mapping[str, Any]) -> str:
    running = condition(dv, "Running") or {}
    return f"{running.get('reason', '')}: {running.get('message', '')}".strip(": ") or "no reason given"


def ssl_context(cas: list[str], *, insecure: bool, extra_ca: Path | None) -> ssl.SSLContext:
    """Trust the system store plus every CA found (or nothing at all, with --insecure)."""
    if insecure:
        return pki.insecure_client_context()
    context = pki.client_context()
    for pem in cas:
        context.load_verify_locations(cadata=pem)
    if extra_ca is not None:
        context.load_verify_locations(cafile=str(extra_ca))
    return context

