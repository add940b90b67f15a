"""The only package that talks to the Kubernetes API (and the only one importing `kubernetes`).

Everything crosses this boundary as plain dicts addressed by `cdi.api.groups.GVR`; the rest of the
project wraps them in the read-only views of `cdi.api.views`.

- `client`: `KubeClient` (get/list/create/replace/patch/delete/watch/request for any GVR)
- `config`: kubeconfig / in-cluster loading
- `errors`: `ApiError` and its typed subclasses
- `informer`: `Informer` (list+watch+relist cache with callbacks)
- `workqueue`: `WorkQueue` and rate limiters
- `leaderelection`: `LeaderElector` over a Lease
- `events`: `EventRecorder`
- `patches`, `paths`, `retry`: helpers
"""

from cdi.kube.client import KubeClient, ObjectList, Response, WatchEvent, WatchStream
from cdi.kube.config import ClusterConfig, ConfigError, load_config
from cdi.kube.errors import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Cause,
    Conflict,
    Forbidden,
    Gone,
    Invalid,
    MethodNotAllowed,
    NotFound,
    ServerError,
    TooManyRequests,
    TransportError,
    Unauthorized,
    UnsupportedMediaType,
    WatchInactive,
)
from cdi.kube.events import NORMAL, WARNING, EventRecorder
from cdi.kube.informer import Informer, InformerStats
from cdi.kube.leaderelection import LeaderElectionConfig, LeaderElector
from cdi.kube.paths import make_key, object_key, resource_path, split_key
from cdi.kube.retry import Backoff, retry_on_conflict
from cdi.kube.workqueue import (
    ItemExponentialLimiter,
    MaxOfLimiter,
    RateLimiter,
    ShutDown,
    TokenBucketLimiter,
    WorkQueue,
    default_rate_limiter,
)

__all__ = [
    "NORMAL", "WARNING", "AlreadyExists", "ApiError", "Backoff", "BadRequest", "Cause", "ClusterConfig",
    "ConfigError", "Conflict", "EventRecorder", "Forbidden", "Gone", "Informer", "InformerStats", "Invalid",
    "ItemExponentialLimiter", "KubeClient", "LeaderElectionConfig", "LeaderElector", "MaxOfLimiter",
    "MethodNotAllowed", "NotFound", "ObjectList", "RateLimiter", "Response", "ServerError", "ShutDown",
    "TokenBucketLimiter", "TooManyRequests", "TransportError", "Unauthorized", "UnsupportedMediaType",
    "WatchEvent", "WatchInactive", "WatchStream", "WorkQueue", "default_rate_limiter", "load_config",
    "make_key", "object_key", "resource_path", "retry_on_conflict", "split_key",
]
