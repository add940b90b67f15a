"""CDIConfig's TLS profile, followed as it changes: what cdi-apiserver and the upload proxy serve with
(CDI's `tls-crypto-watch`), and in `cdi up` the embedded API server too.

Each server starts with the profile of CDIConfig `config` as it is when the watch has synced
(Intermediate while there is none, as in CDI); a change reaches its subscribers for the connections made
after it, without a restart. A deleted CDIConfig changes nothing (the operator or controller puts it
back)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from cdi.api import groups, tlsprofile
from cdi.common import pki
from cdi.kube.client import KubeClient
from cdi.kube.informer import Informer

log = logging.getLogger(__name__)
Subscriber = Callable[[pki.TLSPolicy], None]


DEFAULT_POLICY = pki.TLSPolicy.of(tlsprofile.DEFAULT.ciphers, tlsprofile.DEFAULT.min_tls_version)


class TLSProfileWatch:
    def __init__(self, client: KubeClient) -> None:
        self.informer = Informer(client, groups.CDICONFIGS,
                                 field_selector=f"metadata.name={groups.CDI_CONFIG_NAME}")
        self.informer.add_handler(on_add=self._changed, on_update=lambda _old, new: self._changed(new))
        self.spec = tlsprofile.DEFAULT
        self.policy = DEFAULT_POLICY
        self._subscribers: list[Subscriber] = []

    async def start(self, timeout: float | None = None) -> None:
        """Until the watch has synced: the policy is CDIConfig's from then on."""
        self.informer.start()
        await self.informer.wait_synced(timeout)

    async def stop(self) -> None:
        await self.informer.stop()

    def subscribe(self, subscriber: Subscriber) -> None:
        """Call `subscriber` with the policy now and at each change (on the event loop)."""
        self._subscribers.append(subscriber)
        subscriber(self.policy)

    def _changed(self, config: dict[str, Any]) -> None:
        spec = tlsprofile.of_config(config)
        if spec == self.spec:
            return
        self.spec, self.policy = spec, pki.TLSPolicy.of(spec.ciphers, spec.min_tls_version)
        log.info("TLS profile of CDIConfig: %s", self.policy.describe())
        for subscriber in self._subscribers:
            try:
                subscriber(self.policy)
            except Exception:  # one server that cannot take it keeps its policy; the others still change
                log.exception("applying the TLS profile %s failed", self.policy.describe())
