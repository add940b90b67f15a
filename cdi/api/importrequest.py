"""One import request, typed, and its conversions to and from each form it takes on the way from a
DataVolume to the importer: the DataVolume's `spec.source`, the claim's `storage.import.*`
annotations (CDI's PVC import API, which DataVolumes write and the import reconciler reads) and the
importer container's environment. Before this, each hop had its own reading of the fields, and a field
(`registry.pullMethod`) was lost between them; `tests/unit/api/test_importrequest.py` round-trips
every field through every form. `from_environ` is the reader the importer itself runs
(`cdi.importer.config`), so the round trip tests the parser in use. The volume's variables (size,
overhead, preallocation, owner) are `cdi.api.targetvolume`'s; how the importer goes about the import
(proxy, retry budget, poll only) is its sibling `ImporterOptions`, which only the environment carries.

What the forms cannot carry: the environment holds no ConfigMap or Secret names that the pod mounts as
volumes (`certConfigMap`, a GCS `secretRef`, `secretExtraHeaders`) and no registry `imageStream`
distinction (CDI writes the stream's name as the endpoint); the importer pod's builder reads those
from its volumes (`cdi.controller.datavolume.importpod.import_request_of`)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from cdi.api import annotations as ann
from cdi.api import env
from cdi.api.envvalues import EnvError, env_value, parse_bool, positive_float

Obj = dict[str, Any]
Body = Mapping[str, Any]

# DataVolume source kinds the importer serves (CDI's import sources)
IMPORT_KINDS = (env.SOURCE_HTTP, env.SOURCE_S3, env.SOURCE_GCS, env.SOURCE_REGISTRY, env.SOURCE_BLANK)
PULL_POD = "pod"
_URL_KINDS = ("http", "s3", "gcs")


def _header_list(text: str) -> tuple[str, ...]:
    """Header lists on a claim are JSON (as CDI writes them); one per line is accepted too."""
    text = text.strip()
    if text.startswith("["):
        return tuple(str(v) for v in json.loads(text))
    return tuple(line for line in text.splitlines() if line.strip())


@dataclass(frozen=True)
class ImportRequest:
    """What to import and how: `source` is the importer's source kind (`http`, `s3`, `gcs`, `registry`,
    `blank`), `endpoint` its URL (a registry's `docker://` reference)."""

    source: str
    endpoint: str = ""
    content_type: str = env.CONTENT_KUBEVIRT
    secret: str = ""
    cert_configmap: str = ""
    extra_headers: tuple[str, ...] = ()
    secret_extra_headers: tuple[str, ...] = ()
    checksum: str = ""
    insecure_skip_verify: bool = False
    registry_arch: str = ""
    pull_method: str = PULL_POD

    @property
    def node_pull(self) -> bool:
        """A registry import whose image the node pulls and runs (CDI's isRegistryNodeImport)."""
        return self.source == env.SOURCE_REGISTRY and self.pull_method == env.PULL_METHOD_NODE

    def with_source(self, source: str) -> ImportRequest:
        return replace(self, source=source)

    # -- the DataVolume -------------------------------------------------------------------------------

    @classmethod
    def from_datavolume(cls, dv: Body) -> ImportRequest:
        """From a DataVolume (or a DataImportCron's template): its one import source and contentType."""
        spec: Body = dv.get("spec") or {}
        return cls.from_source(spec.get("source") or {}, str(spec.get("contentType") or env.CONTENT_KUBEVIRT))

    @classmethod
    def from_source(cls, source: Body, content_type: str = env.CONTENT_KUBEVIRT) -> ImportRequest:
        """From a DataVolume's `spec.source` (its one key names the kind)."""
        kind = next((k for k in IMPORT_KINDS if k in source), "")
        body: Body = source.get(kind) or {}
        endpoint = ""
        if kind in _URL_KINDS:
            endpoint = str(body.get("url", ""))
        elif kind == "registry":
            endpoint = str(body.get("url") or body.get("imageStream") or "")
        return cls(
            source=kind, endpoint=endpoint, content_type=content_type or env.CONTENT_KUBEVIRT,
            secret=str(body.get("secretRef") or ""), cert_configmap=str(body.get("certConfigMap") or ""),
            extra_headers=tuple(str(h) for h in body.get("extraHeaders") or ()),
            secret_extra_headers=tuple(str(h) for h in body.get("secretExtraHeaders") or ()),
            checksum=str(body.get("checksum") or ""), insecure_skip_verify=bool(body.get("insecureSkipVerify")),
            registry_arch=str((body.get("platform") or {}).get("architecture") or "") if kind == "registry" else "",
            pull_method=str(body.get("pullMethod") or PULL_POD) if kind == "registry" else PULL_POD,
        )

    def to_source(self) -> Obj:
        """The DataVolume `spec.source` that asks for this import."""
        body: Obj = {}
        if self.source in _URL_KINDS or self.source == "registry":
            body["url"] = self.endpoint
        if self.secret:
            body["secretRef"] = self.secret
        if self.cert_configmap:
            body["certConfigMap"] = self.cert_configmap
        if self.checksum:
            body["checksum"] = self.checksum
        if self.extra_headers:
            body["extraHeaders"] = list(self.extra_headers)
        if self.secret_extra_headers:
            body["secretExtraHeaders"] = list(self.secret_extra_headers)
        if self.insecure_skip_verify:
            body["insecureSkipVerify"] = True
        if self.source == "registry":
            if self.pull_method != PULL_POD:
                body["pullMethod"] = self.pull_method
            if self.registry_arch:
                body["platform"] = {"architecture": self.registry_arch}
        return {self.source: body}

    # -- the claim's annotations ----------------------------------------------------------------------

    def to_annotations(self) -> dict[str, str]:
        """What the import reconciler needs to know, written on the claim (CDI's PVC import API)."""
        out: dict[str, str] = {ann.IMPORT_SOURCE: self.source, ann.CONTENT_TYPE: self.content_type}
        if self.source in _URL_KINDS or self.source == "registry":
            out[ann.IMPORT_ENDPOINT] = self.endpoint
        if self.source == "registry":
            out[ann.IMPORT_REGISTRY_IMPORT_METHOD] = self.pull_method
            if self.registry_arch:
                out[ann.IMPORT_REGISTRY_ARCHITECTURE] = self.registry_arch
        for key, value in ((ann.IMPORT_SECRET, self.secret), (ann.IMPORT_CERT_CONFIGMAP, self.cert_configmap),
                           (ann.IMPORT_CHECKSUM, self.checksum)):
            if value:
                out[key] = value
        if self.extra_headers:
            out[ann.IMPORT_EXTRA_HEADERS] = json.dumps(list(self.extra_headers))
        if self.secret_extra_headers:
            out[ann.IMPORT_SECRET_EXTRA_HEADERS] = json.dumps(list(self.secret_extra_headers))
        if self.insecure_skip_verify:
            out[ann.IMPORT_INSECURE_SKIP_VERIFY] = "true"
        return out

    @classmethod
    def from_annotations(cls, annotations: Mapping[str, str]) -> ImportRequest:
        """From a claim's annotations (a claim without a source annotation imports over HTTP, as CDI's)."""
        return cls(
            source=annotations.get(ann.IMPORT_SOURCE, env.SOURCE_HTTP),
            endpoint=annotations.get(ann.IMPORT_ENDPOINT, ""),
            content_type=annotations.get(ann.CONTENT_TYPE, "") or env.CONTENT_KUBEVIRT,
            secret=annotations.get(ann.IMPORT_SECRET, ""),
            cert_configmap=annotations.get(ann.IMPORT_CERT_CONFIGMAP, ""),
            extra_headers=_header_list(annotations.get(ann.IMPORT_EXTRA_HEADERS, "")),
            secret_extra_headers=_header_list(annotations.get(ann.IMPORT_SECRET_EXTRA_HEADERS, "")),
            checksum=annotations.get(ann.IMPORT_CHECKSUM, ""),
            insecure_skip_verify=annotations.get(ann.IMPORT_INSECURE_SKIP_VERIFY, "") == "true",
            registry_arch=annotations.get(ann.IMPORT_REGISTRY_ARCHITECTURE, ""),
            pull_method=annotations.get(ann.IMPORT_REGISTRY_IMPORT_METHOD, "") or PULL_POD,
        )

    # -- the importer's environment -------------------------------------------------------------------

    def to_env(self, *, insecure_tls: bool | None = None) -> list[Obj]:
        """The importer container's variables that carry this request (the pod builder adds the claim's:
        size, owner, overhead, proxy). `insecure_tls` overrides `insecure_skip_verify` (the controller
        also trusts CDIConfig's insecure registries)."""
        insecure = self.insecure_skip_verify if insecure_tls is None else insecure_tls
        out: list[Obj] = [{"name": env.SOURCE, "value": self.source}, {"name": env.ENDPOINT, "value": self.endpoint},
                          {"name": env.CONTENT_TYPE, "value": self.content_type},
                          {"name": env.INSECURE_TLS, "value": "true" if insecure else "false"}]
        if self.checksum:
            out.append({"name": env.CHECKSUM, "value": self.checksum})
        if self.registry_arch:
            out.append({"name": env.REGISTRY_ARCHITECTURE, "value": self.registry_arch})
        if self.secret and self.source == env.SOURCE_GCS:
            out.append({"name": env.GOOGLE_CREDENTIALS,
                        "value": f"{env.GOOGLE_CREDENTIALS_DIR}/{env.GOOGLE_CREDENTIALS_KEY}"})
        elif self.secret:
            for var, key in ((env.ACCESS_KEY_ID, "accessKeyId"), (env.SECRET_KEY, "secretKey")):
                out.append({"name": var, "valueFrom": {"secretKeyRef": {
                    "name": self.secret, "key": key, "optional": True}}})
        for index, header in enumerate(self.extra_headers):
            out.append({"name": f"{env.EXTRA_HEADER_PREFIX}{index}", "value": header})
        if self.cert_configmap:
            out.append({"name": env.CERT_DIR, "value": env.CERT_DIR_DEFAULT})
        if self.node_pull:
            out.append({"name": env.PULL_METHOD, "value": env.PULL_METHOD_NODE})
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ImportRequest:
        """What the importer is asked, read from its environment (the pod's `env` as the kubelet resolved
        it): the one reader of `to_env`'s variables, in the importer and in `from_env`. Raises `EnvError`
        for a request the importer cannot serve. In the pod, the names of Secrets and ConfigMaps are gone
        (their contents are mounted or in other variables), so `secret`, `cert_configmap` and
        `secret_extra_headers` are empty."""
        source = environ.get(env.SOURCE, "").strip().lower()
        if source == env.SOURCE_NONE:
            source = env.SOURCE_BLANK
        if source not in IMPORT_KINDS:
            raise EnvError(f"unknown {env.SOURCE} {source!r}: expected http, s3, gcs, registry or blank")
        endpoint = environ.get(env.ENDPOINT, "").strip()
        if source != env.SOURCE_BLANK and not endpoint:
            raise EnvError(f"{env.ENDPOINT} is missing")
        content_type = environ.get(env.CONTENT_TYPE, "").strip() or env.CONTENT_KUBEVIRT
        if content_type not in (env.CONTENT_KUBEVIRT, env.CONTENT_ARCHIVE):
            raise EnvError(f"unknown {env.CONTENT_TYPE} {content_type!r}: expected kubevirt or archive")
        if content_type == env.CONTENT_ARCHIVE and source in (env.SOURCE_REGISTRY, env.SOURCE_BLANK):
            raise EnvError(f"content type archive is not supported for source {source}")
        prefix = env.EXTRA_HEADER_PREFIX
        headers = sorted((int(name[len(prefix):]), value) for name, value in environ.items()
                         if name.startswith(prefix) and name[len(prefix):].isdigit())
        return cls(
            source=source, endpoint=endpoint, content_type=content_type,
            extra_headers=tuple(value for _, value in headers), checksum=environ.get(env.CHECKSUM, ""),
            insecure_skip_verify=parse_bool(environ, env.INSECURE_TLS, strict=False),
            registry_arch=environ.get(env.REGISTRY_ARCHITECTURE, "").strip(),
            pull_method=environ.get(env.PULL_METHOD) or PULL_POD,
        )

    @classmethod
    def from_env(cls, variables: Sequence[Body]) -> ImportRequest:
        """From the importer container's `env` in a pod spec: `from_environ` of its values, and the Secret
        its credentials come from (see the module's note on what else it cannot hold)."""
        values = {str(v.get("name")): str(v["value"]) for v in variables if "value" in v}
        secret = next((str(v["valueFrom"]["secretKeyRef"]["name"]) for v in variables
                       if v.get("name") == env.ACCESS_KEY_ID and v.get("valueFrom")), "")
        return replace(cls.from_environ(values), secret=secret)


def trusted_ca_proxy(import_proxy: Body | None) -> str:
    """The name of the CA bundle ConfigMap in CDI's namespace that CDIConfig's `importProxy.trustedCAProxy`
    names ("" when none is configured)."""
    return str((import_proxy or {}).get("trustedCAProxy") or "")


def _proxy_variable(environ: Mapping[str, str], name: str) -> str:
    """A proxy variable as urllib reads it (the importer's clients do): the lower-case name, even empty,
    else the upper-case one."""
    return environ[name] if name in environ else environ.get(name.upper(), "")


@dataclass(frozen=True)
class ImporterOptions:
    """How the importer goes about its import, beside what it imports (`ImportRequest`) and where to
    (`TargetVolume`): through which proxy (CDIConfig's `importProxy`; `proxy_cert_dir` is where the pod
    mounts the proxy's CA bundle when `trustedCAProxy` names one), for how many seconds a failing source
    is retried (the controller's `--import-retry-budget`) and how long a read may wait (unset: derived
    from the budget), and whether the pod only reports the source's current version instead of importing
    it (a DataImportCron's poller). `None`, "" and False are the importer's defaults."""

    http_proxy: str = ""
    https_proxy: str = ""
    no_proxy: str = ""
    proxy_cert_dir: str = ""
    retry_budget: float | None = None
    read_timeout: float | None = None
    poll: bool = False

    @classmethod
    def from_import_proxy(cls, import_proxy: Body | None, *, retry_budget: float | None = None,
                          poll: bool = False) -> ImporterOptions:
        """From CDIConfig's `status.importProxy` (`HTTPProxy`, `HTTPSProxy`, `noProxy`, `trustedCAProxy`)."""
        proxy = import_proxy or {}
        return cls(http_proxy=str(proxy.get("HTTPProxy") or ""), https_proxy=str(proxy.get("HTTPSProxy") or ""),
                   no_proxy=str(proxy.get("noProxy") or ""),
                   proxy_cert_dir=env.PROXY_CERT_DIR_DEFAULT if trusted_ca_proxy(proxy) else "",
                   retry_budget=retry_budget, poll=poll)

    @property
    def proxies(self) -> dict[str, str]:
        """The proxies set, by urllib's keys (`http`, `https`, `no`), as the importer's HTTP client takes them."""
        return {key: value for key, value in (("http", self.http_proxy), ("https", self.https_proxy),
                                              ("no", self.no_proxy)) if value}

    def to_env(self) -> list[Obj]:
        """The importer container's variables that carry these options (none for the defaults)."""
        out: list[Obj] = []
        if self.retry_budget is not None:
            out.append(env_value(env.RETRY_BUDGET, f"{self.retry_budget:g}"))
        if self.read_timeout is not None:
            out.append(env_value(env.READ_TIMEOUT, f"{self.read_timeout:g}"))
        for name, value in ((env.HTTP_PROXY, self.http_proxy), (env.HTTPS_PROXY, self.https_proxy),
                            (env.NO_PROXY, self.no_proxy)):
            if value:
                out.append(env_value(name, value))
        if self.proxy_cert_dir:
            out.append(env_value(env.PROXY_CERT_DIR, self.proxy_cert_dir))
        if self.poll:
            out.append(env_value(env.POLL, "true"))
        return out

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ImporterOptions:
        """The options, read from the importer's environment: the one reader of `to_env`'s variables (the
        proxy variables in either case, as urllib reads them). Raises `EnvError` for a budget or timeout
        that is no positive number, or a poll flag that is no boolean."""
        return cls(
            http_proxy=_proxy_variable(environ, env.HTTP_PROXY), https_proxy=_proxy_variable(environ, env.HTTPS_PROXY),
            no_proxy=_proxy_variable(environ, env.NO_PROXY), proxy_cert_dir=environ.get(env.PROXY_CERT_DIR, "").strip(),
            retry_budget=positive_float(environ, env.RETRY_BUDGET),
            read_timeout=positive_float(environ, env.READ_TIMEOUT), poll=parse_bool(environ, env.POLL),
        )
