"""The upload protocol's names, shared by the upload proxy, the upload server and `cdi image-upload`:
CDI's paths (`pkg/common/common.go`) and headers, plus the headers of our resumable-upload extension.

Resumable uploads (our extension; virtctl never sends these headers, so it sees CDI's protocol):

* `HEAD` on any upload path answers 200 with `Upload-Offset: N`, the number of bytes of the image
  that are durably on the volume and can be kept (0 when there is nothing to continue, for example
  because the image is not a plain raw/ISO stream). `Upload-State` says what the server is doing
  (`idle`, `uploading`, `processing`, `done`).
* With an offset above 0, `Upload-Kept-Sha256: START+LENGTH=HEX, ...` gives the sha256 of a few
  regions of those N bytes as read back from the volume; a client resumes only when its own file has
  the same bytes there (otherwise it starts over, without `Upload-Offset`). The offset is kept on disk
  (`cdi.uploadserver.kept`), so an upload server that restarted still answers it.
* `POST` with `Upload-Offset: N` (N > 0, equal to the offset HEAD reported) sends bytes N.. of the
  image and continues the upload there. A different N gets 409 with the server's `Upload-Offset`.
* `X-CDI-Upload-Target: <namespace>/<pvc>` (optional) names the PVC the client means to upload to;
  the proxy refuses (401) a token for any other PVC instead of silently uploading into it.

End-to-end TLS (our extension; only `cdi image-upload` asks for it): the proxy authorises an upload and
then steps off the byte path, so the image is encrypted once, by the client, for the upload server.

* The proxy advertises it on its answer to the `HEAD` probe of a raw upload path:
  `Upgrade: cdi-upload-tls/1` (RFC 9110 §7.8: a server may list protocols it can upgrade to).
* The client sends `POST <raw upload path>` with its token, `Content-Length: 0`,
  `Connection: Upgrade` and `Upgrade: cdi-upload-tls/1`. The proxy checks it as any upload request
  (token, PVC, readiness; refusals are answered as usual), then sends the same request to the upload
  server over its mutual-TLS connection, adding `Cdi-Upload-Nonce: <random>`.
* The upload server (which trusts that connection by the proxy's client certificate) answers
  `101 Switching Protocols`; both close their TLS session (close_notify) and keep the TCP connection.
  The proxy answers the client `101` with the nonce, `Cdi-Upload-Server-Name` (the name in the upload
  server's certificate) and `Cdi-Upload-Server-Ca` (the upload-server CA bundle, base64 PEM), closes
  that TLS session too, and from then on only splices bytes between the two TCP connections.
* The client starts a new TLS session through the proxy with the upload server, verifying its
  certificate against that CA and name, and sends the upload (`POST` with `Content-Length`,
  `Upload-Offset` and the nonce). The upload server serves it only with the nonce it was given on the
  proxy's authenticated connection, at the path the proxy named; the answer comes back the same way.

So the token is checked by the proxy exactly as before, only the proxy can open an upload on an upload
server, and the image is never decrypted on the way (the proxy does not see it at all).

Uploads through the Kubernetes API server (our extension, `upload.extensions.cdi.dev`): the upload proxy
also serves an aggregated API, so that a user who can reach the API server can upload with nothing but a
kubeconfig, authenticated by their own credentials and authorized by RBAC (`create` and `get` on
`uploads/proxy` in the namespace: `POST` is `create`, `HEAD` is `get` to kube-apiserver).

* `POST|HEAD /apis/upload.extensions.cdi.dev/v1beta1/namespaces/<ns>/uploads/<pvc>/proxy/<upload path>`,
  where `<upload path>` is one of the proxy's own (`v1beta1/upload-async`, ...): the same requests with a
  different base URL, the same answers (readiness, 503/409, the resume headers). A subresource named
  `proxy` is long-running to kube-apiserver (no 60 s request timeout) and streamed.
* The API server authenticates and authorizes the user, drops the user's `Authorization`, and forwards to
  the proxy's aggregation listener (`AGGREGATION_PORT`, the `cdi-uploadproxy` Service) with its front-proxy
  client certificate, naming the user in `X-Remote-User`; that listener answers nobody else. The PVC is the
  path's; no upload token is involved, and end-to-end TLS with the upload server is not offered (the API
  server drops hop-by-hop `Upgrade` answers).
* Discovery lists only the subresource `uploads/proxy` (as KubeVirt's `subresources.kubevirt.io` lists only
  its subresources), so `kubectl get uploads` finds no such resource.
"""

from typing import Final

from cdi.api import naming

SYNC_PATHS: Final = ("/v1beta1/upload", "/v1alpha1/upload")
ASYNC_PATHS: Final = ("/v1beta1/upload-async", "/v1alpha1/upload-async")
FORM_SYNC_PATHS: Final = ("/v1beta1/upload-form", "/v1alpha1/upload-form")
FORM_ASYNC_PATHS: Final = ("/v1beta1/upload-form-async", "/v1alpha1/upload-form-async")
ARCHIVE_PATHS: Final = ("/v1beta1/upload-archive", "/v1alpha1/upload-archive")
ARCHIVE_PATH: Final = "/v1beta1/upload-archive"
ARCHIVE_ALPHA_PATH: Final = "/v1alpha1/upload-archive"
PROXY_PATHS: Final = SYNC_PATHS + ASYNC_PATHS + FORM_SYNC_PATHS + FORM_ASYNC_PATHS
HEALTHZ_PATH: Final = "/healthz"
FORM_FIELD: Final = "file"

UPLOAD_PORT: Final = 8443
# the upload proxy's Service in CDI's namespace: what an Ingress or a Route in front of the proxy names
PROXY_SERVICE: Final = "cdi-uploadproxy"
CLIENT_NAME: Final = "client.upload-server.cdi.kubevirt.io"
TOKEN_ISSUER: Final = "cdi-apiserver"

CONTENT_TYPE_HEADER: Final = "x-cdi-content-type"  # host-assisted clone streams (not an upload)
OFFSET_HEADER: Final = "Upload-Offset"
STATE_HEADER: Final = "Upload-State"
KEPT_HEADER: Final = "Upload-Kept-Sha256"
TARGET_HEADER: Final = "X-CDI-Upload-Target"
TLS_UPGRADE: Final = "cdi-upload-tls/1"
NONCE_HEADER: Final = "Cdi-Upload-Nonce"
SERVER_NAME_HEADER: Final = "Cdi-Upload-Server-Name"
SERVER_CA_HEADER: Final = "Cdi-Upload-Server-Ca"
RAW_PROXY_PATHS: Final = SYNC_PATHS + ASYNC_PATHS  # the proxy paths that can be upgraded to end-to-end TLS

# uploads through the Kubernetes API server's aggregation layer (our extension, see above)
EXTENSION_GROUP: Final = "upload.extensions.cdi.dev"
EXTENSION_VERSION: Final = "v1beta1"
EXTENSION_API_VERSION: Final = f"{EXTENSION_GROUP}/{EXTENSION_VERSION}"
EXTENSION_RESOURCE: Final = "uploads"
EXTENSION_SUBRESOURCE: Final = "proxy"
EXTENSION_KIND: Final = "UploadProxyOptions"
EXTENSION_APISERVICE: Final = f"{EXTENSION_VERSION}.{EXTENSION_GROUP}"
EXTENSION_BASE: Final = f"/apis/{EXTENSION_GROUP}/{EXTENSION_VERSION}"
AGGREGATION_PORT: Final = 8444  # the upload proxy's listener for the aggregation layer (and its Service port)
AGGREGATION_PORT_NAME: Final = "aggregation"

def parse_kept(value: str) -> list[tuple[int, int, str]] | None:
    """(start, length, sha256 hex) of each region an `Upload-Kept-Sha256` value lists; None when malformed."""
    out = []
    for item in value.split(","):
        span, _, digest = item.strip().partition("=")
        start, _, length = span.partition("+")
        digest = digest.lower()
        if not (start.isdigit() and length.isdigit() and len(digest) == 64 and
                all(c in "0123456789abcdef" for c in digest)):
            return None
        out.append((int(start), int(length), digest))
    return out


def upload_resource_name(pvc: str) -> str:
    """The name of a PVC's upload-server pod and Secret: `cdi-upload-<pvc>`, shortened as CDI does."""
    return naming.resource_name("cdi-upload", pvc)


def upload_service_name(pvc: str) -> str:
    """The name of a PVC's upload Service (a DNS label: 63 characters at most, shortened as CDI does)."""
    return naming.service_name(upload_resource_name(pvc))


def extension_base(namespace: str, pvc: str) -> str:
    """The path under which the proxy's own upload paths reach `pvc` through the API server."""
    return f"{EXTENSION_BASE}/namespaces/{namespace}/{EXTENSION_RESOURCE}/{pvc}/{EXTENSION_SUBRESOURCE}"


def _dns_name(text: str) -> bool:
    """A namespace or claim name as Kubernetes allows it (RFC 1123 subdomain): nothing a path could hide in."""
    return 0 < len(text) <= naming.DNS1123_SUBDOMAIN_MAX and all(
        part and part[0].isalnum() and part[-1].isalnum() and all(c.isalnum() or c == "-" for c in part)
        and part.isascii() and part == part.lower() for part in text.split("."))


def parse_extension_path(path: str) -> tuple[str, str, str] | None:
    """(namespace, pvc, upload path) of a request through the API server, or None when `path` is not one:
    `<EXTENSION_BASE>/namespaces/<ns>/uploads/<pvc>/proxy/<one of PROXY_PATHS>`."""
    if not path.startswith(EXTENSION_BASE + "/"):
        return None
    parts = path[len(EXTENSION_BASE) + 1:].split("/")
    if len(parts) < 6 or parts[0] != "namespaces" or parts[2] != EXTENSION_RESOURCE or \
            parts[4] != EXTENSION_SUBRESOURCE:
        return None
    namespace, pvc, rest = parts[1], parts[3], "/" + "/".join(parts[5:])
    if not (_dns_name(namespace) and _dns_name(pvc)) or rest not in PROXY_PATHS:
        return None
    return namespace, pvc, rest
