"""The upload protocol's names, shared by the upload proxy, the upload server and `cdi image-upload`:
CDI's paths (`pkg/common/common.go`) and headers, plus the headers of our resumable-upload extension.

Resumable uploads (our extension; virtctl never sends these headers, so it sees CDI's protocol):

* `HEAD` on any upload path answers 200 with `Upload-Offset: N`, the number of bytes of the image
  that are durably on the volume and can be kept (0 when there is nothing to continue, for example
  because the image is not a plain raw/ISO stream). `Upload-State` says what the server is doing
  (`idle`, `uploading`, `processing`, `done`).
* `POST` with `Upload-Offset: N` (N > 0, equal to the offset HEAD reported) sends bytes N.. of the
  image and continues the upload there. A different N gets 409 with the server's `Upload-Offset`.
* `X-CDI-Upload-Target: <namespace>/<pvc>` (optional) names the PVC the client means to upload to;
  the proxy refuses (401) a token for any other PVC instead of silently uploading into it.
"""

from typing import Final

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
CLIENT_NAME: Final = "client.upload-server.cdi.kubevirt.io"
TOKEN_ISSUER: Final = "cdi-apiserver"

CONTENT_TYPE_HEADER: Final = "x-cdi-content-type"  # host-assisted clone streams (not an upload)
OFFSET_HEADER: Final = "Upload-Offset"
STATE_HEADER: Final = "Upload-State"
TARGET_HEADER: Final = "X-CDI-Upload-Target"

# upload-server environment (CDI's names)
ENV_TLS_CERT_FILE: Final = "TLS_CERT_FILE"
ENV_TLS_KEY_FILE: Final = "TLS_KEY_FILE"
ENV_CLIENT_CERT_FILE: Final = "CLIENT_CERT_FILE"
ENV_CLIENT_NAME: Final = "CLIENT_NAME"
ENV_DESTINATION: Final = "DESTINATION"
ENV_CONTENT_TYPE: Final = "CONTENT_TYPE"
ENV_LISTEN_ADDRESS: Final = "LISTEN_ADDRESS"
ENV_LISTEN_PORT: Final = "LISTEN_PORT"


def upload_resource_name(pvc: str) -> str:
    """The name of a PVC's upload-server pod, Service and Secret: `cdi-upload-<pvc>` (63 characters at most)."""
    return f"cdi-upload-{pvc}"[:63].rstrip("-")


# the CLI tells the controller what it is about to send ("raw", "qcow2+gz", ...), so that formats that
# stream get no scratch volume
FORMAT_ANNOTATION: Final = "cdi.kubevirt.io/storage.upload.format"
