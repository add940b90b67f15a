"""What the API server does to built-in kinds on create and update, as Kubernetes' registry
strategies do: reset status on create, fill defaults, allocate service IPs, keep immutable fields
immutable, and refuse the invalid objects a real cluster refuses."""

from __future__ import annotations

import base64
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from cdi.api.quantity import Quantity, QuantityError
from cdi.embedded.kubeapi.errors import Cause, StatusError
from cdi.embedded.kubeapi.resources import ResourceType
from cdi.embedded.ranges import SERVICE_NETWORK, AddressPool, Network

Obj = dict[str, Any]

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS1123_MSG = ("a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', "
                "and must start and end with an alphanumeric character (e.g. 'example.com', regex used for "
                "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')")
_LABEL_MSG = ("a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must "
              "start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for "
              "validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')")

# kinds whose names need only be valid path segments (as in Kubernetes, e.g. RBAC roles "system:foo")
_PATH_SEGMENT_NAMES = {"ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "Event"}


def validate_name(rtype: ResourceType, name: str) -> list[Cause]:
    if rtype.kind in _PATH_SEGMENT_NAMES:
        if name in (".", "..") or "/" in name or "%" in name:
            return [Cause("metadata.name", f'Invalid value: "{name}": may not contain \'/\' or \'%\'')]
        return []
    if rtype.kind in ("Namespace", "Service"):
        if len(name) > 63 or not _DNS_LABEL.match(name):
            return [Cause("metadata.name", f'Invalid value: "{name}": {_LABEL_MSG}')]
        return []
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return [Cause("metadata.name", f'Invalid value: "{name}": {_DNS1123_MSG}')]
    return []


class ServiceIPs:
    """Cluster IPs for Services, from this instance's loopback range (`cdi.embedded.ranges`) so that the
    local node can listen on them and no other `cdi up` on the machine hands out the same ones."""

    def __init__(self, network: str | Network = SERVICE_NETWORK) -> None:
        self._pool = AddressPool(network)

    @property
    def network(self) -> Network:
        return self._pool.network

    def reserve(self, ip: str) -> None:
        """An address a stored Service has (at start): never handed out again while it does."""
        self._pool.take(ip)

    def release(self, ip: str) -> None:
        self._pool.release(ip)

    def allocate(self) -> str:
        return self._pool.allocate()

    def claim(self, ip: str) -> Cause | None:
        """Take the address a new Service asks for, or say why not (kube-apiserver's words)."""
        problem = ""
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            return Cause("spec.clusterIPs[0]", f'Invalid value: "{ip}": must be a valid IP address, (e.g. 10.9.8.7 '
                                               'or 2001:db8::ffff)')
        if ip not in self._pool:
            problem = (f"the provided IP ({ip}) is not in the valid range. The range of valid IPs is "
                       f"{self._pool.network}")
        elif self._pool.in_use(ip):
            problem = "provided IP is already allocated"
        if problem:
            return Cause("spec.clusterIPs", f'Invalid value: []string{{"{ip}"}}: failed to allocate IP {ip}: {problem}')
        self._pool.take(ip)
        return None


def _image_pull_policy(image: str) -> str:
    last = image.rsplit("/", 1)[-1]
    if "@" in last:
        return "IfNotPresent"
    return "Always" if ":" not in last or last.endswith(":latest") else "IfNotPresent"


def _default_container(container: Obj) -> None:
    container.setdefault("terminationMessagePath", "/dev/termination-log")
    container.setdefault("terminationMessagePolicy", "File")
    container.setdefault("imagePullPolicy", _image_pull_policy(str(container.get("image", ""))))
    resources = container.setdefault("resources", {})
    limits = resources.get("limits") or {}
    if limits:  # as kube-apiserver's pod defaults: what is limited and not requested is requested up to its limit
        requests = resources.setdefault("requests", {})
        for name, value in limits.items():
            requests.setdefault(name, value)
    for port in container.get("ports") or []:
        port.setdefault("protocol", "TCP")


def _create_pod(obj: Obj, _: Obj | None) -> list[Cause]:
    spec = obj.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    spec.setdefault("securityContext", {})
    spec.setdefault("enableServiceLinks", True)
    spec.setdefault("priority", 0)
    causes = []
    containers = spec.get("containers")
    if not containers:
        causes.append(Cause("spec.containers", "Required value", "FieldValueRequired"))
    seen: set[str] = set()
    for field in ("initContainers", "containers"):
        for i, container in enumerate(spec.get(field) or []):
            _default_container(container)
            name = container.get("name")
            if not name:
                causes.append(Cause(f"spec.{field}[{i}].name", "Required value", "FieldValueRequired"))
            elif name in seen:
                causes.append(Cause(f"spec.{field}[{i}].name", f'Duplicate value: "{name}"', "FieldValueDuplicate"))
            seen.add(str(name))
            if not container.get("image"):
                causes.append(Cause(f"spec.{field}[{i}].image", "Required value", "FieldValueRequired"))
    if spec["restartPolicy"] not in ("Always", "OnFailure", "Never"):
        causes.append(Cause("spec.restartPolicy", f'Unsupported value: "{spec["restartPolicy"]}": supported '
                                                  'values: "Always", "OnFailure", "Never"', "FieldValueNotSupported"))
    obj["status"] = {"phase": "Pending", "qosClass": "BestEffort"}
    return causes


_POD_MUTABLE = ("activeDeadlineSeconds", "tolerations", "terminationGracePeriodSeconds", "schedulingGates")


def _update_pod(obj: Obj, old: Obj | None) -> list[Cause]:
    assert old is not None
    new_spec, old_spec = dict(obj.get("spec") or {}), dict(old.get("spec") or {})
    for key in _POD_MUTABLE:
        new_spec.pop(key, None)
        old_spec.pop(key, None)
    if not old_spec.get("nodeName"):
        new_spec.pop("nodeName", None)
        old_spec.pop("nodeName", None)
    for spec in (new_spec, old_spec):
        spec["containers"] = [{k: v for k, v in c.items() if k != "image"} for c in spec.get("containers") or []]
    if new_spec != old_spec:
        return [Cause("spec", "Forbidden: pod updates may not change fields other than `spec.containers[*].image`,"
                              "`spec.initContainers[*].image`,`spec.activeDeadlineSeconds`,`spec.tolerations` "
                              "(only additions to existing tolerations),`spec.terminationGracePeriodSeconds` "
                              "(allow it to be set to 1 if it was previously negative)", "FieldValueForbidden")]
    return []


def _create_pvc(obj: Obj, _: Obj | None, cross_namespace_data_sources: bool = False) -> list[Cause]:
    spec = obj.setdefault("spec", {})
    spec.setdefault("volumeMode", "Filesystem")
    ref = spec.get("dataSourceRef")
    if not cross_namespace_data_sources and isinstance(ref, dict):
        ref.pop("namespace", None)  # kube-apiserver's DropDisabledFields: the field exists only with the gate
    _normalize_data_sources(spec)
    obj["status"] = {"phase": "Pending"}
    return []


def _normalize_data_sources(spec: Obj) -> None:
    """kube-apiserver's NormalizeDataSources (AnyVolumeDataSource is on by default): the old field
    fills the new one, and a same-namespace dataSourceRef fills the old one, so that readers of either
    see the claim's source."""
    source, ref = spec.get("dataSource"), spec.get("dataSourceRef")
    if isinstance(source, dict) and ref is None:
        spec["dataSourceRef"] = {k: source[k] for k in ("apiGroup", "kind", "name") if source.get(k) is not None}
    elif isinstance(ref, dict) and source is None and not ref.get("namespace"):
        spec["dataSource"] = {k: ref[k] for k in ("apiGroup", "kind", "name") if ref.get(k) is not None}


def _data_source_causes(ref: Obj, field: str) -> list[Cause]:
    """kube-apiserver's validateDataSource / validateDataSourceRef."""
    causes = []
    if not ref.get("name"):
        causes.append(Cause(f"{field}.name", "Required value", "FieldValueRequired"))
    if not ref.get("kind"):
        causes.append(Cause(f"{field}.kind", "Required value", "FieldValueRequired"))
    if not ref.get("apiGroup") and ref.get("kind") != "PersistentVolumeClaim":
        causes.append(Cause(field, f'Invalid value: "{ref.get("kind") or ""}": must be \'PersistentVolumeClaim\' '
                                   "when referencing the default apiGroup", "FieldValueInvalid"))
    return causes


def _data_sources_causes(spec: Obj) -> list[Cause]:
    source, ref = spec.get("dataSource"), spec.get("dataSourceRef")
    causes = []
    if isinstance(source, dict):
        causes += _data_source_causes(source, "spec.dataSource")
    if isinstance(ref, dict):
        causes += _data_source_causes(ref, "spec.dataSourceRef")
    if isinstance(ref, dict) and ref.get("namespace"):
        if source is not None:
            causes.append(Cause("spec", 'Invalid value: "spec.dataSource": may not be specified when '
                                        "dataSourceRef.namespace is specified", "FieldValueInvalid"))
    elif isinstance(source, dict) and isinstance(ref, dict) and \
            any((source.get(k) or None) != (ref.get(k) or None) for k in ("apiGroup", "kind", "name")):
        causes.append(Cause("spec", 'Invalid value: "spec.dataSource": must match dataSourceRef', "FieldValueInvalid"))
    return causes


def _validate_pvc(obj: Obj) -> list[Cause]:
    """After mutating admission, as kube-apiserver validates: a webhook may complete the spec (CDI's
    PVC mutating webhook fills accessModes and replaces `volumeMode: FromStorageProfile`); what a webhook
    dropped is defaulted again, as the API server decodes a patched object."""
    spec = obj.setdefault("spec", {})
    spec.setdefault("volumeMode", "Filesystem")
    causes = []
    if not spec.get("accessModes"):
        causes.append(Cause("spec.accessModes", "Required value: at least 1 access mode is required",
                            "FieldValueRequired"))
    for i, mode in enumerate(spec.get("accessModes") or []):
        if mode not in ("ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"):
            causes.append(Cause(f"spec.accessModes[{i}]", f'Unsupported value: "{mode}": supported values: '
                                '"ReadOnlyMany", "ReadWriteMany", "ReadWriteOnce", "ReadWriteOncePod"',
                                "FieldValueNotSupported"))
    if spec["volumeMode"] not in ("Filesystem", "Block"):
        causes.append(Cause("spec.volumeMode", f'Unsupported value: "{spec["volumeMode"]}": supported values: '
                                               '"Block", "Filesystem"', "FieldValueNotSupported"))
    if not ((spec.get("resources") or {}).get("requests") or {}).get("storage"):
        causes.append(Cause("spec.resources[storage]", "Required value", "FieldValueRequired"))
    causes += _data_sources_causes(spec)
    return causes


def _update_pvc(obj: Obj, old: Obj | None) -> list[Cause]:
    assert old is not None
    new_spec, old_spec = dict(obj.get("spec") or {}), dict(old.get("spec") or {})
    if not old_spec.get("volumeName"):
        new_spec.pop("volumeName", None)
        old_spec.pop("volumeName", None)
    from cdi.api.quantity import QuantityError, parse_bytes
    new_req = ((new_spec.get("resources") or {}).get("requests") or {}).get("storage")
    old_req = ((old_spec.get("resources") or {}).get("requests") or {}).get("storage")
    causes = []
    try:
        if new_req is not None and old_req is not None and parse_bytes(new_req) < parse_bytes(old_req):
            causes.append(Cause("spec.resources.requests.storage",
                                "Forbidden: field can not be less than status.capacity", "FieldValueForbidden"))
    except QuantityError as exc:
        causes.append(Cause("spec.resources.requests.storage", f"Invalid value: {exc}"))
    for spec in (new_spec, old_spec):
        spec.pop("resources", None)
        spec.pop("volumeAttributesClassName", None)
    if new_spec != old_spec:
        causes.append(Cause("spec", "Forbidden: spec is immutable after creation except resources.requests and "
                                    "volumeAttributesClassName for bound claims", "FieldValueForbidden"))
    return causes


def _create_pv(obj: Obj, _: Obj | None) -> list[Cause]:
    spec = obj.setdefault("spec", {})
    spec.setdefault("persistentVolumeReclaimPolicy", "Retain")
    spec.setdefault("volumeMode", "Filesystem")
    obj["status"] = {"phase": "Pending"}
    return []


def _create_namespace(obj: Obj, _: Obj | None) -> list[Cause]:
    obj.setdefault("spec", {}).setdefault("finalizers", ["kubernetes"])
    obj["status"] = {"phase": "Active"}
    labels = obj["metadata"].setdefault("labels", {})
    labels["kubernetes.io/metadata.name"] = obj["metadata"]["name"]
    return []


def _create_secret(obj: Obj, old: Obj | None) -> list[Cause]:
    string_data = obj.pop("stringData", None) or {}
    data = obj.setdefault("data", {}) if string_data else obj.get("data")
    for key, value in string_data.items():
        assert data is not None
        data[key] = base64.b64encode(str(value).encode()).decode()
    obj.setdefault("type", "Opaque")
    if old is not None and old.get("type") != obj.get("type"):
        return [Cause("type", "Invalid value: field is immutable")]
    return []


def _check_configmap(obj: Obj, _: Obj | None) -> list[Cause]:
    for field in ("data", "binaryData"):
        for key, value in (obj.get(field) or {}).items():
            if not isinstance(value, str):
                raise StatusError(400, f'ConfigMap in version "v1" cannot be handled as a ConfigMap: json: cannot '
                                       f"unmarshal {type(value).__name__} into Go struct field ConfigMap.{field} of "
                                       f"type string (key {key!r})", "BadRequest")
    return []


_QUOTA_RESOURCES = frozenset({
    "pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps", "persistentvolumeclaims",
    "services.nodeports", "services.loadbalancers", "cpu", "memory", "ephemeral-storage", "requests.cpu",
    "requests.memory", "requests.storage", "requests.ephemeral-storage", "limits.cpu", "limits.memory",
    "limits.ephemeral-storage"})
_QUOTA_COUNTS = frozenset({"pods", "services", "replicationcontrollers", "resourcequotas", "secrets", "configmaps",
                           "persistentvolumeclaims", "services.nodeports", "services.loadbalancers"})


def _quota_hard(obj: Obj, _: Obj | None) -> list[Cause]:
    """ResourceQuota's validation (resource names, quantities) and the canonical form the API server writes
    quantities back in ("1024Mi" is "1Gi"); a value that is no quantity cannot even be decoded."""
    spec = obj.setdefault("spec", {})
    hard = spec.get("hard") or {}
    causes = []
    canonical = {}
    for name, value in hard.items():
        path = f"spec.hard[{name}]"
        if "/" not in name and name not in _QUOTA_RESOURCES and not name.startswith(("hugepages-",
                                                                                      "requests.hugepages-")):
            causes.append(Cause(path, f'Invalid value: "{name}": must be a standard resource for quota'))
        try:
            quantity = Quantity.parse(value)
        except QuantityError as exc:
            raise StatusError(400, f'ResourceQuota in version "v1" cannot be handled as a ResourceQuota: '
                                   f"{str(exc).rsplit(': ', 1)[0]}", "BadRequest") from None
        if quantity.value < 0:
            causes.append(Cause(path, f'Invalid value: "{quantity}": must be greater than or equal to 0'))
        elif name in _QUOTA_COUNTS and quantity.value != quantity.value.to_integral_value():
            causes.append(Cause(path, f'Invalid value: "{quantity}": must be an integer'))
        canonical[name] = str(quantity)
    if hard:
        spec["hard"] = canonical
    return causes


def _create_quota(obj: Obj, old: Obj | None) -> list[Cause]:
    obj["status"] = {}  # the quota controller fills it
    return _quota_hard(obj, old)


def _create_event(obj: Obj, _: Obj | None) -> list[Cause]:
    if "involvedObject" in obj:
        obj.setdefault("count", 1)
    return []


class Strategies:
    """Per-kind hooks; a kind without hooks is stored as given."""

    def __init__(self, service_ips: ServiceIPs, cross_namespace_data_sources: bool = False) -> None:
        self.service_ips = service_ips
        self.cross_namespace_data_sources = cross_namespace_data_sources  # kube's CrossNamespaceVolumeDataSource
        self._create: dict[tuple[str, str], Callable[[Obj, Obj | None], list[Cause]]] = {
            ("", "Pod"): _create_pod,
            ("", "PersistentVolumeClaim"): lambda obj, old: _create_pvc(obj, old, self.cross_namespace_data_sources),
            ("", "PersistentVolume"): _create_pv, ("", "Namespace"): _create_namespace,
            ("", "Secret"): _create_secret, ("", "Service"): self._create_service, ("", "Event"): _create_event,
            ("", "ConfigMap"): _check_configmap, ("", "ResourceQuota"): _create_quota,
        }
        self._validate_create: dict[tuple[str, str], Callable[[Obj], list[Cause]]] = {
            ("", "PersistentVolumeClaim"): _validate_pvc,
        }
        self._update: dict[tuple[str, str], Callable[[Obj, Obj | None], list[Cause]]] = {
            ("", "Pod"): _update_pod, ("", "PersistentVolumeClaim"): _update_pvc, ("", "Secret"): _create_secret,
            ("", "Service"): self._update_service, ("", "ConfigMap"): _check_configmap,
            ("", "ResourceQuota"): _quota_hard,
        }

    def prepare_create(self, rtype: ResourceType, obj: Obj) -> list[Cause]:
        hook = self._create.get((rtype.group if rtype.storage_group is None else rtype.storage_group, rtype.kind))
        return hook(obj, None) if hook else []

    def validate_create(self, rtype: ResourceType, obj: Obj) -> list[Cause]:
        """What kube-apiserver checks of a new object once mutating webhooks have had their say."""
        hook = self._validate_create.get((rtype.group if rtype.storage_group is None else rtype.storage_group,
                                          rtype.kind))
        return hook(obj) if hook else []

    def prepare_update(self, rtype: ResourceType, obj: Obj, old: Obj) -> list[Cause]:
        hook = self._update.get((rtype.group, rtype.kind))
        return hook(obj, old) if hook else []

    def _create_service(self, obj: Obj, _: Obj | None) -> list[Cause]:
        spec = obj.setdefault("spec", {})
        spec.setdefault("type", "ClusterIP")
        spec.setdefault("sessionAffinity", "None")
        spec.setdefault("ipFamilies", ["IPv4"])
        spec.setdefault("ipFamilyPolicy", "SingleStack")
        spec.setdefault("internalTrafficPolicy", "Cluster")
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        obj.setdefault("status", {"loadBalancer": {}})
        return []

    def _update_service(self, obj: Obj, old: Obj | None) -> list[Cause]:
        assert old is not None
        spec, old_spec = obj.setdefault("spec", {}), old.get("spec") or {}
        if not spec.get("clusterIP"):
            spec["clusterIP"] = old_spec.get("clusterIP")
            spec["clusterIPs"] = old_spec.get("clusterIPs")
        elif spec["clusterIP"] != old_spec.get("clusterIP"):
            return [Cause("spec.clusterIPs[0]", "Invalid value: field is immutable")]
        for port in spec.get("ports") or []:
            port.setdefault("protocol", "TCP")
            port.setdefault("targetPort", port.get("port"))
        return []

    def allocate(self, rtype: ResourceType, obj: Obj) -> list[Cause]:
        """Take the addresses a new object needs (a Service's cluster IP, given or allocated), just before
        it is stored; `released` gives them back when it is not (or when it is deleted)."""
        if not (rtype.group == "" and rtype.kind == "Service"):
            return []
        spec = obj.setdefault("spec", {})
        if spec.get("clusterIP") in (None, ""):
            spec["clusterIP"] = self.service_ips.allocate()
        elif spec["clusterIP"] != "None":
            refused = self.service_ips.claim(str(spec["clusterIP"]))
            if refused is not None:
                return [refused]
        spec["clusterIPs"] = [spec["clusterIP"]]
        return []

    def released(self, rtype: ResourceType, obj: Mapping[str, Any]) -> None:
        if rtype.group == "" and rtype.kind == "Service":
            ip = (obj.get("spec") or {}).get("clusterIP")
            if ip and ip != "None":
                self.service_ips.release(ip)
