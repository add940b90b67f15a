"""Environment variable names of the worker-pod contract (DESIGN §3.1), as CDI names them.

The controller writes them into pod specs; the pod programs read them. Nothing else configures a
worker pod, so a pod built by CDI's controller and one built by ours are interchangeable."""

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
