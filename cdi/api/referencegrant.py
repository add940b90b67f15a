"""Cross-namespace volume data sources, as Kubernetes decides them.

A claim's `spec.dataSourceRef.namespace` exists only where the API server's `CrossNamespaceVolumeDataSource`
feature gate is on (otherwise it drops the field, and the claim names a source in its own namespace). Even
then the reference is honoured only when the source's namespace holds a `ReferenceGrant`
(gateway.networking.k8s.io) allowing PersistentVolumeClaims of the claim's namespace to refer to that kind
(and name, if the grant names one), as the CSI external-provisioner checks before it clones or restores, and
as cdi's populators check before they fill a claim from another namespace's source."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from cdi.api.views import ObjectView

FEATURE_GATE = "CrossNamespaceVolumeDataSource"
CLAIM_GROUP, CLAIM_KIND = "", "PersistentVolumeClaim"


def cross_namespace(claim_namespace: str, ref: Mapping[str, Any]) -> str | None:
    """The namespace `ref` reaches into, when it is not the claim's own."""
    namespace = str(ref.get("namespace") or "")
    return namespace if namespace and namespace != claim_namespace else None


def granted(grants: Iterable[Mapping[str, Any]], claim_namespace: str, ref: Mapping[str, Any]) -> bool:
    """Whether a grant of the source namespace (`grants`, the ReferenceGrants there) lets claims of
    `claim_namespace` refer to what `ref` names."""
    group, kind, name = str(ref.get("apiGroup") or ""), str(ref.get("kind") or ""), str(ref.get("name") or "")
    for grant in grants:
        spec = ObjectView(grant).spec
        if not any(str(f.get("group") or "") == CLAIM_GROUP and f.get("kind") == CLAIM_KIND
                   and f.get("namespace") == claim_namespace for f in spec.get("from") or []):
            continue
        if any(str(t.get("group") or "") == group and t.get("kind") == kind and (not t.get("name") or t["name"] == name)
               for t in spec.get("to") or []):
            return True
    return False


def refusal(claim_namespace: str, claim_name: str, ref: Mapping[str, Any]) -> str:
    """What is said while no grant allows the reference (the external-provisioner's words)."""
    return (f"accessing {ref.get('namespace')}/{ref.get('name')} of {ref.get('kind')} dataSource from "
            f"{claim_namespace}/{claim_name} isn't allowed: no ReferenceGrant in namespace {ref.get('namespace')} "
            f"allows it")


def crd() -> dict[str, Any]:
    """Gateway API's ReferenceGrant CRD (v1beta1, the fields a volume data source needs), which `cdi up`
    installs when the gate is on, as an admin installs the Gateway API's CRDs on a cluster."""
    def reference(*required: str, **more: dict[str, Any]) -> dict[str, Any]:
        return {"type": "object", "required": ["group", "kind", *required], "properties": {
            "group": {"type": "string", "maxLength": 253}, "kind": {"type": "string", "minLength": 1, "maxLength": 63},
            **more}}
    from_ = reference("namespace", namespace={"type": "string", "minLength": 1, "maxLength": 63})
    to = reference(name={"type": "string", "minLength": 1, "maxLength": 253})
    schema = {"type": "object", "properties": {
        "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
        "spec": {"type": "object", "required": ["from", "to"], "properties": {
            "from": {"type": "array", "minItems": 1, "maxItems": 16, "items": from_},
            "to": {"type": "array", "minItems": 1, "maxItems": 16, "items": to}}}}}
    return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            # a *.k8s.io group is protected: kube-apiserver wants the API review that approved it named
            "metadata": {"name": "referencegrants.gateway.networking.k8s.io", "annotations": {
                "api-approved.kubernetes.io": "https://github.com/kubernetes-sigs/gateway-api/pull/3328",
                "gateway.networking.k8s.io/bundle-version": "v1.3.0"}},
            "spec": {"group": "gateway.networking.k8s.io", "scope": "Namespaced",
                     "names": {"plural": "referencegrants", "singular": "referencegrant", "kind": "ReferenceGrant",
                               "listKind": "ReferenceGrantList", "shortNames": ["refgrant"]},
                     "versions": [{"name": "v1beta1", "served": True, "storage": True,
                                   "schema": {"openAPIV3Schema": schema}}]}}
