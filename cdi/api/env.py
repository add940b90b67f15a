"""Environment variable names of the worker-pod contract (DESIGN §3.1), as CDI names them, and the
in-pod paths and values they carry.

The controller writes them into pod specs; the pod programs read them. Nothing else configures a
worker pod, so a pod built by CDI's controller and one built by ours are interchangeable. Every worker
env name is a constant here and nowhere else (`tests/test_code_quality.py` forbids the literals in the
rest of `cdi/`); the typed requests (`importrequest`, `uploadrequest`, `clonesourcerequest`,
`targetvolume`) write and read them."""

from typing import Final

SOURCE: Final = "IMPORTER_SOURCE"
ENDPOINT: Final = "IMPORTER_ENDPOINT"
CONTENT_TYPE: Final = "IMPORTER_CONTENTTYPE"
IMAGE_SIZE: Final = "IMPORTER_IMAGE_SIZE"
ACCESS_KEY_ID: Final = "IMPORTER_ACCESS_KEY_ID"
SECRET_KEY: Final = "IMPORTER_SECRET_KEY"
CERT_DIR: Final = "IMPORTER_CERT_DIR"
PROXY_CERT_DIR: Final = "IMPORTER_PROXY_CERT_DIR"
INSECURE_TLS: Final = "INSECURE_TLS"
CHECKSUM: Final = "IMPORTER_CHECKSUM"
EXTRA_HEADER_PREFIX: Final = "IMPORTER_EXTRA_HEADER_"
SECRET_EXTRA_HEADERS_DIR_PREFIX: Final = "IMPORTER_SECRET_EXTRA_HEADERS_"
# ours: where the importer looks for mounted header secrets (default /extraheaders; for running outside a pod)
SECRET_EXTRA_HEADERS_DIR: Final = "IMPORTER_SECRET_EXTRA_HEADERS_DIR"
REGISTRY_ARCHITECTURE: Final = "IMPORTER_REGISTRY_IMAGE_ARCHITECTURE"
PULL_METHOD: Final = "IMPORTER_PULL_METHOD"
GOOGLE_CREDENTIALS: Final = "GOOGLE_APPLICATION_CREDENTIALS"  # gcs: the mounted key file, as CDI sets it
FILESYSTEM_OVERHEAD: Final = "FILESYSTEM_OVERHEAD"
PREALLOCATION: Final = "PREALLOCATION"
OWNER_UID: Final = "OWNER_UID"
CACHE_MODE: Final = "CACHE_MODE"
UPLOAD_IMAGE_SIZE: Final = "UPLOAD_IMAGE_SIZE"
HTTP_PROXY: Final = "http_proxy"
HTTPS_PROXY: Final = "https_proxy"
NO_PROXY: Final = "no_proxy"
POD_IP: Final = "POD_IP"
TLS_CIPHERS: Final = "TLS_CIPHERS"
TLS_MIN_VERSION: Final = "TLS_MIN_VERSION"

# importer tuning (our additions; CDI has no equivalent): seconds a source may keep failing (retried
# inside the run) before the import fails for good, set from the controller's --import-retry-budget;
# and seconds without data before a read times out (default: a third of the budget, at most 60)
RETRY_BUDGET: Final = "IMPORTER_RETRY_BUDGET"
READ_TIMEOUT: Final = "IMPORTER_READ_TIMEOUT"

# the upload server's (CDI's names): its certificate, the CA and name of the client it accepts, the image
# destination (`/data/disk.img`, or the block device), the content type; where to listen
TLS_CERT_FILE: Final = "TLS_CERT_FILE"
TLS_KEY_FILE: Final = "TLS_KEY_FILE"
CLIENT_CERT_FILE: Final = "CLIENT_CERT_FILE"
CLIENT_NAME: Final = "CLIENT_NAME"
DESTINATION: Final = "DESTINATION"
UPLOAD_CONTENT_TYPE: Final = "CONTENT_TYPE"
LISTEN_ADDRESS: Final = "LISTEN_ADDRESS"
LISTEN_PORT: Final = "LISTEN_PORT"
# the upload server's, ours: where a Block volume's server keeps its resume record when no scratch is
# mounted; seconds without body data before an upload counts as cut off; bytes of a raw upload written
# between two checkpoints of its resume record (0: none, what `bench/bench_upload.py --checkpoints` compares)
UPLOAD_STATE_DIR: Final = "UPLOAD_STATE_DIR"
UPLOAD_IDLE_TIMEOUT: Final = "UPLOAD_IDLE_TIMEOUT"
UPLOAD_CHECKPOINT_BYTES: Final = "UPLOAD_CHECKPOINT_BYTES"
# the upload server's, ours: `algorithm:hex` the received bytes must hash to, from the claim's
# `extensions.cdi.dev/upload.checksum` (never from a request: only what the user wrote on the volume counts)
UPLOAD_CHECKSUM: Final = "UPLOAD_CHECKSUM"

# the clone source's (CDI's names): where to send, its client certificate and key and the server's CA (PEM
# text), the source's volume mode (`block` or `filesystem`) and where it is mounted; ours: the name the
# upload server's certificate carries (UPLOAD_URL names the Service's cluster IP)
UPLOAD_URL: Final = "UPLOAD_URL"
CLIENT_CERT: Final = "CLIENT_CERT"
CLIENT_KEY: Final = "CLIENT_KEY"
SERVER_CA_CERT: Final = "SERVER_CA_CERT"
VOLUME_MODE: Final = "VOLUME_MODE"
MOUNT_POINT: Final = "MOUNT_POINT"
UPLOAD_SERVER_NAME: Final = "UPLOAD_SERVER_NAME"
VOLUME_MODE_BLOCK: Final = "block"
VOLUME_MODE_FILESYSTEM: Final = "filesystem"

# path overrides for running a pod program outside a pod (tests, benchmarks)
DATA_DIR: Final = "IMPORTER_DATA_DIR"
BLOCK_PATH: Final = "IMPORTER_BLOCK_PATH"
SCRATCH_DIR: Final = "IMPORTER_SCRATCH_DIR"
TERMINATION_LOG: Final = "TERMINATION_LOG"

# in-pod paths
DATA_DIR_DEFAULT: Final = "/data"
DISK_IMAGE_NAME: Final = "disk.img"
BLOCK_PATH_DEFAULT: Final = "/dev/cdi-block-volume"
SCRATCH_DIR_DEFAULT: Final = "/scratch"
CERT_DIR_DEFAULT: Final = "/certs"
PROXY_CERT_DIR_DEFAULT: Final = "/proxycerts"
GOOGLE_CREDENTIALS_DIR: Final = "/google"  # gcs: where the secretRef secret is mounted
GOOGLE_CREDENTIALS_KEY: Final = "credentials.json"  # gcs: the secret's key holding the credentials file
TERMINATION_LOG_DEFAULT: Final = "/dev/termination-log"
SECRET_EXTRA_HEADERS_DIR_DEFAULT: Final = "/extraheaders"
TLS_DIR_DEFAULT: Final = "/etc/tls"  # the upload server's certificate Secret (tls.crt, tls.key, ca.crt)
UPLOAD_STATE_DIR_DEFAULT: Final = "/upload-state"
# CDI's /var/run/cdi/clone/source, where /var/run is the usual symlink (the embedded node's sandbox
# cannot make a mount point through that symlink)
CLONE_SOURCE_MOUNT_DEFAULT: Final = "/run/cdi/clone/source"
METRICS_PORT: Final = 8443

# ours: "true" makes the importer report the source's current version (`sourceDigest` in its termination
# message) instead of importing it: how a DataImportCron polls from a pod with the import's network identity
POLL: Final = "IMPORTER_POLL"
SOURCE_HTTP: Final = "http"
SOURCE_S3: Final = "s3"
SOURCE_GCS: Final = "gcs"
SOURCE_REGISTRY: Final = "registry"
SOURCE_BLANK: Final = "blank"
SOURCE_NONE: Final = "none"
CONTENT_KUBEVIRT: Final = "kubevirt"
CONTENT_ARCHIVE: Final = "archive"

# registry `pullMethod: node` (CDI's names): the importer waits for the ready file, which names the
# disk the user's image serves, and creates the done file when it has finished, so that server stops
READY_FILE: Final = "IMPORTER_READY_FILE"
DONE_FILE: Final = "IMPORTER_DONE_FILE"
PULL_METHOD_NODE: Final = "node"
