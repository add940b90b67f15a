"""ResourceQuota, enforced as kube-apiserver and kube-controller-manager enforce it: the ResourceQuota
admission plugin (`QuotaAdmission`) refuses a create (or a claim's growth) that would take a quota's
`status.used` over its `status.hard`, with kube-apiserver's 403 (`exceeded quota: NAME, requested: ...,
used: ..., limited: ...`), and charges what it admits to `status.used` at once; the resourcequota
controller (`QuotaController`) copies `spec.hard` to `status.hard` and recounts `status.used` from the
namespace's objects whenever they or the quota change, so a deleted claim, a pod that ended or a request
refused after it was charged frees its share. What counts is `quotausage`'s.

Both write the quota's status straight to the store, without awaiting in between reading and writing:
the event loop runs one of them at a time, so an admission never charges a quota another request has
just filled, and a recount never loses a charge (kube-apiserver needs a lock per namespace for that)."""

from __future__ import annotations

import logging
from typing import Any

from cdi.embedded.kubeapi import quotausage
from cdi.embedded.kubeapi.background import BackgroundLoop
from cdi.embedded.kubeapi.errors import StatusError
from cdi.embedded.kubeapi.objects import AdmissionRequest, Objects
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.kubeapi.store import Change, Store

log = logging.getLogger(__name__)

Obj = dict[str, Any]
QUOTAS = "/resourcequotas"


def forbidden(rtype: ResourceType, name: str, why: str) -> StatusError:
    """admission.NewForbidden: `<resource> "<name>" is forbidden: <why>`."""
    resource = f"{rtype.plural}.{rtype.group}" if rtype.group else rtype.plural
    details: dict[str, Any] = {"name": name, "kind": rtype.plural}
    if rtype.group:
        details["group"] = rtype.group
    return StatusError(403, f'{resource} "{name}" is forbidden: {why}', "Forbidden", details=details)


def _shown_name(request: AdmissionRequest) -> str:
    """The name kube-apiserver's admission error shows: a created object's generateName when the server
    made up its name (admission runs there before the name is generated)."""
    meta = (request.obj or {}).get("metadata") or {}
    prefix = str(meta.get("generateName") or "")
    if request.operation == "CREATE" and prefix and request.name.startswith(prefix) and \
            len(request.name) == len(prefix) + 5:
        return prefix
    return request.name


class QuotaAdmission:
    """kube-apiserver's ResourceQuota admission plugin (a validating one; it runs after all others)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    async def mutate(self, request: AdmissionRequest) -> Obj | None:
        return None

    async def validate(self, request: AdmissionRequest) -> None:
        rtype = request.rtype
        if request.subresource or not rtype.namespaced or not request.namespace or request.obj is None:
            return
        # creates count; of updates, only a claim's (it may grow); deletes are recounted by the controller
        if not (request.operation == "CREATE" or (request.operation == "UPDATE" and rtype.key == quotausage.CLAIMS)):
            return
        entries = self.store.items(QUOTAS, request.namespace)
        if not entries:
            return
        try:
            charges = quotausage.admit([entry.obj() for _, _, entry in entries], rtype.key, request.obj,
                                       request.old if request.operation == "UPDATE" else None)
        except quotausage.Refused as exc:
            raise forbidden(rtype, _shown_name(request), str(exc)) from None
        if request.ctx.dry_run:
            return
        for charge in charges:
            name = str((charge.quota.get("metadata") or {}).get("name", ""))
            entry = self.store.get(QUOTAS, request.namespace, name)
            if entry is None:
                continue
            quota = entry.obj()
            quota.setdefault("status", {})["used"] = quotausage.render(charge.used)
            self.store.put(QUOTAS, request.namespace, name, quota)


class QuotaController(BackgroundLoop):
    """kube-controller-manager's resourcequota controller: each quota's status kept to its spec and to what
    the namespace holds."""

    task_name = "resourcequota-controller"

    def __init__(self, objects: Objects) -> None:
        super().__init__()
        self.store = objects.store

    def sync_all(self) -> None:
        for namespace in sorted({ns for ns, _, _ in self.store.items(QUOTAS)}):
            self.sync(namespace)

    def sync(self, namespace: str) -> None:
        """Recount every quota of the namespace; write those whose status changed."""
        for _, name, entry in self.store.items(QUOTAS, namespace):
            quota = entry.obj()
            objects = [(key, item.obj()) for key in sorted(quotausage.relevant_keys(quota))
                       for _, _, item in self.store.items(key, namespace)]
            hard = dict((quota.get("spec") or {}).get("hard") or {})
            status = {"hard": hard, "used": quotausage.render(quotausage.namespace_used(quota, objects))}
            if quota.get("status") == status:
                continue
            quota["status"] = status
            self.store.put(QUOTAS, namespace, name, quota)

    def _touches(self, change: Change) -> bool:
        """Whether a change may alter what a quota of its namespace counts (or is the quota itself)."""
        if not change.namespace:
            return False
        if change.key == QUOTAS:
            return True
        return any(change.key in quotausage.relevant_keys(entry.obj())
                   for _, _, entry in self.store.items(QUOTAS, change.namespace))

    async def _run(self) -> None:
        with self.store.subscribe(None) as sub:
            self.sync_all()  # what changed before the subscription
            while True:
                change = await sub.queue.get()
                dirty: set[str] = set()
                overflowed = change is None
                while True:  # a burst of changes needs one recount per namespace
                    if change is not None and self._touches(change):
                        dirty.add(change.namespace)
                    if sub.queue.empty():
                        break
                    change = sub.queue.get_nowait()
                    overflowed = overflowed or change is None
                try:
                    if overflowed:
                        sub.overflowed = False
                        self.sync_all()
                    for namespace in sorted(dirty):
                        self.sync(namespace)
                except Exception:  # one bad quota must not stop the others' accounting
                    log.exception("recounting resource quotas failed")
