"""CDIConfig `config`: its spec comes from the CDI resource's `spec.config` when there is one (the
operator's job in CDI), and its status is the effective configuration every other reconciler reads:
filesystem overhead per storage class, scratch class, pod resources, proxy, preallocation, the
upload proxy URL (the override, else an Ingress's or Route's in front of the proxy: `uploadproxyurl`, else
the URL of the proxy `cdi up` runs)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cdi.api import groups
from cdi.api.sizing import DEFAULT_FILESYSTEM_OVERHEAD
from cdi.api.views import ObjectView
from cdi.common.verbosity import log_level
from cdi.controller.runtime import Reconciler, write_status
from cdi.controller.uploadproxyurl import upload_proxy_url, url_from_ingress, url_from_route
from cdi.controller.watches import KeysOf, Watch
from cdi.kube import AlreadyExists

Obj = dict[str, Any]
_PERCENT = re.compile(r"^(0(?:\.\d{1,3})?|1)$")
DEFAULT_POD_RESOURCES: Mapping[str, Any] = {
    "limits": {"cpu": "750m", "memory": "600M"}, "requests": {"cpu": "100m", "memory": "60M"}}
CONFIG_KEY = groups.CDI_CONFIG_NAME
# the loggers of CDI's components (under `cdi up` they share this process; the embedded cluster's are not CDI's)
COMPONENT_LOGGERS = ("cdi.controller", "cdi.kube", "cdi.apiserver", "cdi.uploadproxy")


def apply_log_verbosity(spec: Mapping[str, Any]) -> None:
    """CDI restarts its components with `-v=N` when `logVerbosity` changes; here the level changes live."""
    level = log_level(spec.get("logVerbosity"))
    for name in COMPONENT_LOGGERS:
        logging.getLogger(name).setLevel(level)


def effective_status(spec: Mapping[str, Any], storage_classes: Sequence[Mapping[str, Any]],
                     upload_proxy_url: str) -> Obj:
    overhead = spec.get("filesystemOverhead") or {}
    global_overhead = str(overhead.get("global") or "")
    if not _PERCENT.match(global_overhead):
        global_overhead = DEFAULT_FILESYSTEM_OVERHEAD
    per_class: dict[str, str] = {}
    wanted = overhead.get("storageClass") or {}
    for sc in storage_classes:
        name = ObjectView(sc).name
        value = str(wanted.get(name, ""))
        per_class[name] = value if _PERCENT.match(value) else global_overhead
    names = set(per_class)
    status: Obj = {
        "filesystemOverhead": {"global": global_overhead, "storageClass": per_class},
        "defaultPodResourceRequirements": dict(spec.get("podResourceRequirements") or DEFAULT_POD_RESOURCES),
        "preallocation": bool(spec.get("preallocation")),
        "scratchSpaceStorageClass": spec.get("scratchSpaceStorageClass")
        if spec.get("scratchSpaceStorageClass") in names else "",
    }
    if spec.get("importProxy"):
        status["importProxy"] = dict(spec["importProxy"])
    if spec.get("imagePullSecrets"):
        status["imagePullSecrets"] = list(spec["imagePullSecrets"])
    url = spec.get("uploadProxyURLOverride") or upload_proxy_url
    if url:
        status["uploadProxyURL"] = url
    return status


class ConfigReconciler(Reconciler):
    name = "cdiconfig"

    def watches(self) -> list[Watch]:
        """The one CDIConfig, computed from the CDI resource, itself, and the StorageClasses (its status
        names only classes that exist: the scratch class, per-class filesystem overhead); and the Ingresses
        and Routes of CDI's namespace that front the upload proxy, as they were or are after a change (an
        update that stops naming the proxy takes its URL away; CDI's predicate reads only the updated object
        and keeps the stale URL)."""
        config_of = (groups.STORAGECLASSES, groups.CDICONFIGS, groups.CDIS)
        return [*(Watch(gvr, lambda _: [CONFIG_KEY]) for gvr in config_of),
                Watch(groups.INGRESSES, self._if_fronting(url_from_ingress), before_too=True),
                Watch(groups.ROUTES, self._if_fronting(url_from_route), before_too=True)]

    def _if_fronting(self, url_of: Callable[[Obj], str]) -> KeysOf:
        namespace = self.ctx.settings.namespace
        return lambda obj: [CONFIG_KEY] if ObjectView(obj).namespace == namespace and url_of(obj) else []

    def _upload_proxy_url(self) -> str:
        """An Ingress's host, else a Route's (CDI's order), else the proxy `cdi up` runs here."""
        namespace = self.ctx.settings.namespace
        return (upload_proxy_url(self.ctx.cached_list(groups.INGRESSES, namespace),
                                 self.ctx.cached_list(groups.ROUTES, namespace))
                or self.ctx.settings.upload_proxy_url)

    def initial_keys(self) -> list[str]:
        return [CONFIG_KEY]  # made at start even when nothing changes

    async def reconcile(self, key: str) -> float | None:
        cdi = next(iter(self.ctx.cached_list(groups.CDIS)), None)
        config = self.ctx.cached(groups.CDICONFIGS, CONFIG_KEY)
        desired_spec = dict((cdi.get("spec") or {}).get("config") or {}) if cdi else None
        if config is None:
            body = {"apiVersion": groups.CDI_API_VERSION, "kind": "CDIConfig", "metadata": {"name": CONFIG_KEY},
                    "spec": desired_spec or {}}
            try:
                config = await self.ctx.client.create(groups.CDICONFIGS, body)
            except AlreadyExists:
                return 0.2
        elif desired_spec is not None and (config.get("spec") or {}) != desired_spec:
            config = await self.ctx.client.patch(groups.CDICONFIGS, CONFIG_KEY, [
                {"op": "replace", "path": "/spec", "value": desired_spec}], patch_type="json")
        apply_log_verbosity(config.get("spec") or {})
        status = effective_status(config.get("spec") or {}, self.ctx.cached_list(groups.STORAGECLASSES),
                                  self._upload_proxy_url())
        if status != config.get("status"):
            await write_status(self.ctx.client, groups.CDICONFIGS, config, status)
        if cdi is None:
            return None
        cdi_status = cdi.get("status") or {}
        if self.ctx.settings.report_cdi_status and cdi_status.get("phase") != "Deployed":
            cdi_status = {
                "phase": "Deployed", "conditions": [
                    {"type": "Available", "status": "True", "reason": "Available", "message": ""},
                    {"type": "Progressing", "status": "False", "reason": "", "message": ""},
                    {"type": "Degraded", "status": "False", "reason": "", "message": ""}],
                "operatorVersion": "cdi-py", "targetVersion": "cdi-py", "observedVersion": "cdi-py"}
            await write_status(self.ctx.client, groups.CDIS, cdi, cdi_status)
        self.ctx.metrics.cdi_resource_seen(list(cdi_status.get("conditions") or []))
        return None
