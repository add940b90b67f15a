"""`cdi up`'s CDI certificates, kept as cdi-operator keeps them on a cluster: the same Secrets and bundle
ConfigMaps in CDI's namespace, issued and rotated by the same code (`cdi.operator.certs`) from the `CDI`
resource's `spec.certConfig` (CDI's 48h/24h CAs and 24h/12h leaves unless it says otherwise).

There is no operator and no Deployment to roll under `cdi up`, so this stands in for both: a pass at
start (before the servers start, so that they start with current certificates), another when
`certConfig` changes and when the first certificate reaches its `renewBefore`; after a pass that renewed
anything, the in-process servers are told (`on_renewed`) and serve the new certificates to new
connections. What a server reads from files is written where a Deployment would have it mounted:
cdi-apiserver's CA and serving pair in its state directory, the proxy's serving pair in
`uploadproxy/serving/`, and the proxy's CA bundle next to the kubeconfig (`uploadproxy-ca.crt`, where
`cdi image-upload` looks). Bundles hold the new CA and the previous ones until they expire, so whoever
trusts a bundle keeps trusting certificates issued before a renewal.

The embedded API server's own CA (`ca.crt` in the data directory) is the cluster's, not CDI's, and is
not governed by certConfig."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cdi.api import groups
from cdi.api.views import CDIView
from cdi.common import certconfig, pki
from cdi.kube import ApiError, Informer, KubeClient, NotFound
from cdi.operator.certs import Certificates, Issued

log = logging.getLogger(__name__)
# the names `cdi up`'s servers are reached by on this machine, besides their Services' names
LOOPBACK = ("127.0.0.1", "localhost")
RETRY_SECONDS = 5.0  # after a failed pass (the API unreachable)
MIN_WAIT_SECONDS = 5.0  # a certConfig whose renewBefore is not shorter than its duration renews at every pass
MAX_WAIT_SECONDS = 3600.0  # a pass at least this often, whatever the clock did


class StackCertificates:
    def __init__(self, client: KubeClient, namespace: str, apiserver_dir: Path, uploadproxy_dir: Path,
                 uploadproxy_ca_file: Path) -> None:
        self.client = client
        self.certs = Certificates(client, namespace)
        self.apiserver_dir = apiserver_dir
        self.serving_dir = uploadproxy_dir / "serving"
        self.uploadproxy_ca_file = uploadproxy_ca_file
        self.issued: Issued | None = None
        self._wake = asyncio.Event()
        self._cdis = Informer(client, groups.CDIS)
        self._cdis.add_handler(self._added, self._updated, None)
        self._task: asyncio.Task[None] | None = None

    @property
    def uploadproxy_cert(self) -> tuple[Path, Path]:
        """The proxy's serving certificate and key files (replaced in place by a renewal)."""
        return self.serving_dir / "tls.crt", self.serving_dir / "tls.key"

    def _added(self, _: Any) -> None:
        self._wake.set()

    def _updated(self, old: Any, new: Any) -> None:
        if _cert_config(old) != _cert_config(new):
            self._wake.set()

    async def renew(self) -> bool:
        """One pass: create what is missing, renew what is due; writes the files. True when anything
        changed (what the servers present or what their clients trust)."""
        try:
            cdi = await self.client.get(groups.CDIS, groups.CDI_CR_NAME)
        except NotFound:
            cdi = {}
        cert_config = _cert_config(cdi)
        try:
            for which in certconfig.DEFAULTS:
                certconfig.lifetime(cert_config, which)
        except ValueError as exc:  # not a reason for `cdi up` not to start, nor to keep expiring certificates
            log.warning("the CDI resource's certConfig is not understood (%s): CDI's default lifetimes apply", exc)
            cert_config = {}
        issued = await self.certs.issue(cert_config, LOOPBACK, LOOPBACK)
        previous, self.issued = self.issued, issued
        if previous is not None and _material(previous) == _material(issued):
            return False
        _private(self.apiserver_dir)
        issued.api_ca.write(self.apiserver_dir / "ca.crt", self.apiserver_dir / "ca.key")
        issued.api_leaf.write(self.apiserver_dir / "tls.crt", self.apiserver_dir / "tls.key")
        # the bundle first: a client reading it while the proxy switches already trusts the new CA
        pki.write_private(self.uploadproxy_ca_file, issued.proxy_bundle.encode())
        self.uploadproxy_ca_file.chmod(0o644)  # not a secret: what `cdi image-upload` and users trust
        _private(self.serving_dir.parent)
        _private(self.serving_dir)
        issued.proxy_leaf.write(*self.uploadproxy_cert)
        return True

    def start(self, on_renewed: Callable[[Issued], Awaitable[None]]) -> None:
        """Keep renewing while `cdi up` runs; `on_renewed` after each pass that changed something."""
        self._cdis.start()
        self._task = asyncio.create_task(self._run(on_renewed), name="cdi-up-certificates")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._cdis.stop()

    async def _run(self, on_renewed: Callable[[Issued], Awaitable[None]]) -> None:
        wait, untold = self._until_due(), False
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            self._wake.clear()
            try:
                untold = await self.renew() or untold  # the servers not told yet (telling them failed)
                assert self.issued is not None
                if untold:
                    log.info("CDI certificates renewed per certConfig; next renewal at %s",
                             self.issued.next_renewal.isoformat(timespec="seconds"))
                    await on_renewed(self.issued)
                    untold = False
                wait = self._until_due()
            except (ApiError, OSError) as exc:
                log.warning("could not renew CDI's certificates, retrying: %s", exc)
                wait = RETRY_SECONDS
            except Exception:  # a certificate left to expire would be worse than a pass retried
                log.exception("renewing CDI's certificates failed, retrying")
                wait = RETRY_SECONDS

    def _until_due(self) -> float:
        if self.issued is None:
            return RETRY_SECONDS
        left = (self.issued.next_renewal - datetime.datetime.now(datetime.UTC)).total_seconds()
        return min(max(left, MIN_WAIT_SECONDS), MAX_WAIT_SECONDS)


def _private(directory: Path) -> None:
    """A directory that holds private keys: 0700, also where an older version left it 0755 (mkdir alone
    changes nothing of an existing directory, and makes parents 0755)."""
    directory.mkdir(mode=0o700, exist_ok=True)
    directory.chmod(0o700)


def _cert_config(cdi: Any) -> dict[str, Any]:
    return dict(CDIView(cdi or {}).cert_config)


def _material(issued: Issued) -> tuple[Any, ...]:
    return (issued.api_ca, issued.api_leaf, issued.api_bundle, issued.proxy_ca, issued.proxy_leaf,
            issued.proxy_bundle, issued.upload_ca, issued.upload_bundle, issued.client_ca, issued.client)
