"""Where the API server is and who we are: kubeconfig or in-cluster service account.

The lookup order is kubectl's: an explicit path (`--kubeconfig`), then `$KUBECONFIG`, then
`~/.kube/config`, then the pod's service account. Loading itself is left to `kubernetes.aio.config`,
so exec plugins, client certificates, token files and token refresh work exactly as in the official
client; this module only decides which source to use and which namespace is the default one."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes.aio import config as kconfig
from kubernetes.aio.client import Configuration

from cdi.api import componentenv
from cdi.kube.errors import ApiError

SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DEFAULT_KUBECONFIG = Path("~/.kube/config")


class ConfigError(ApiError):
    """No usable kubeconfig and not running in a pod (or the kubeconfig is broken)."""


@dataclass
class ClusterConfig:
    """A loaded connection: the official client's `Configuration` plus what it does not keep."""

    configuration: Configuration
    namespace: str
    source: str  # the kubeconfig path, or "in-cluster"


def kubeconfig_candidates(explicit: str | os.PathLike[str] | None = None) -> list[Path]:
    """The kubeconfig files to try, in kubectl's order (explicit, $KUBECONFIG entries, ~/.kube/config)."""
    if explicit:
        return [Path(explicit).expanduser()]
    paths = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return [*paths, DEFAULT_KUBECONFIG.expanduser()]


def _context_namespace(loader: Any) -> str | None:
    try:
        context = loader.current_context or {}
        namespace = (context.get("context") or {}).get("namespace")
    except (AttributeError, TypeError):
        return None
    return str(namespace) if namespace else None


async def load_kubeconfig(path: str | os.PathLike[str], context: str | None = None) -> ClusterConfig:
    """Load one kubeconfig file (the current context unless `context` is given)."""
    configuration = Configuration()
    try:
        loader = await kconfig.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=str(path), context=context, client_configuration=configuration, persist_config=False)
    except (kconfig.ConfigException, OSError, ValueError, KeyError) as exc:
        raise ConfigError(f"cannot load kubeconfig {path}: {exc}") from exc
    return ClusterConfig(configuration, _context_namespace(loader) or "default", str(path))


def load_in_cluster() -> ClusterConfig:
    """The pod's service account: token and CA from the mounted secret, host from the service env."""
    configuration = Configuration()
    try:
        kconfig.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except kconfig.ConfigException as exc:
        raise ConfigError(f"not running in a cluster: {exc}") from exc
    namespace = os.environ.get(componentenv.POD_NAMESPACE, "")
    ns_file = SERVICE_ACCOUNT_DIR / "namespace"
    if not namespace and ns_file.exists():
        namespace = ns_file.read_text().strip()
    return ClusterConfig(configuration, namespace or "default", "in-cluster")


def find_kubeconfig(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The kubeconfig file to use, or None for in-cluster.

    An explicit path that does not exist is an error rather than a silent fall-through: the user
    asked for that file."""
    if explicit and not Path(explicit).expanduser().exists():
        raise ConfigError(f"kubeconfig {explicit} does not exist")
    for path in kubeconfig_candidates(explicit):
        if path.is_file():
            return path
    return None


async def load_config(kubeconfig: str | os.PathLike[str] | None = None, context: str | None = None) -> ClusterConfig:
    """The first source that exists: `kubeconfig`, `$KUBECONFIG`, `~/.kube/config`, then in-cluster."""
    path = find_kubeconfig(kubeconfig)
    return await load_kubeconfig(path, context) if path is not None else load_in_cluster()
