"""CDIConfig's `importProxy.trustedCAProxy`: the CA bundle of an HTTPS-intercepting proxy, a ConfigMap in
CDI's namespace. A pod can mount only ConfigMaps of its own namespace, so, as CDI does, the import
reconciler copies it into the claim's namespace as `import-proxy-cm-<pvc>` (shortened as CDI shortens
names), which the importer pod mounts at /proxycerts (IMPORTER_PROXY_CERT_DIR); the importer trusts
every certificate there, for the proxy and for what it presents in the origin's place.

CDI creates the copy after the pod, owned by the pod. Here it is made before the pod, so the pod
never waits in ContainerCreating for it, and owned by the claim, because a retried import runs a new
pod: a copy owned by the failed pod would be garbage collected under the next one. The reconciler
deletes it when the import ends; the claim's deletion takes it too."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cdi.api import annotations as ann
from cdi.api import groups, naming
from cdi.api.importrequest import trusted_ca_proxy
from cdi.api.owners import owner_reference
from cdi.api.views import ClaimView, ObjectView
from cdi.controller.claims import config_status
from cdi.controller.runtime import Context
from cdi.kube import AlreadyExists, NotFound

Body = Mapping[str, Any]
Obj = dict[str, Any]

MISSING_REASON = "ErrResourceDoesntExist"  # CDI's reason when the proxy CA ConfigMap is not there


def proxy_ca_configmap_name(pvc_name: str) -> str:
    """`import-proxy-cm-<pvc>`: the copy in the claim's namespace (CDI's `GetImportProxyConfigMapName`)."""
    return naming.resource_name("import-proxy-cm", pvc_name)


class ProxyCaMissing(Exception):
    """The ConfigMap CDIConfig names is not in CDI's namespace: the importer could not trust the proxy."""

    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f'ConfigMap "{name}" named by CDIConfig importProxy.trustedCAProxy does not exist '
                         f'in namespace "{namespace}"')


async def ensure_proxy_ca(ctx: Context, pvc: Body) -> None:
    """Copy (or refresh) the proxy CA ConfigMap into the claim's namespace, if CDIConfig names one;
    raises ProxyCaMissing when it names one that is not there."""
    source_name = trusted_ca_proxy(config_status(ctx).get("importProxy"))
    if not source_name:
        return
    cdi_namespace = ctx.settings.namespace
    try:
        source = await ctx.client.get(groups.CONFIGMAPS, source_name, cdi_namespace)
    except NotFound:
        raise ProxyCaMissing(cdi_namespace, source_name) from None
    namespace = ClaimView(pvc).namespace
    name = proxy_ca_configmap_name(ClaimView(pvc).name)
    data = dict(source.get("data") or {})
    binary = dict(source.get("binaryData") or {})
    copy: Obj = {"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": name, "namespace": namespace,
                              "labels": {ann.LABEL_APP: ann.LABEL_APP_VALUE},
                              "ownerReferences": [owner_reference(groups.PVCS, pvc)]},
                 "data": data}
    if binary:
        copy["binaryData"] = binary
    try:
        await ctx.client.create(groups.CONFIGMAPS, copy, namespace)
        return
    except AlreadyExists:
        pass
    current = await ctx.client.get(groups.CONFIGMAPS, name, namespace)
    if (current.get("data") or {}) != data or (current.get("binaryData") or {}) != binary:
        # the bundle was rotated since this claim's last attempt: the next pod mounts the new one
        await ctx.client.replace(groups.CONFIGMAPS, {**copy, "metadata": {
            **copy["metadata"], "resourceVersion": ObjectView(current).resource_version}}, namespace)


async def delete_proxy_ca(ctx: Context, pvc: Body) -> None:
    """Remove the claim's copy (no error when there is none)."""
    try:
        await ctx.client.delete(groups.CONFIGMAPS, proxy_ca_configmap_name(ClaimView(pvc).name),
                                ClaimView(pvc).namespace)
    except NotFound:
        pass
