"""The operator's certificates (also what `cdi up` keeps): a CA renewed within the second of its
predecessor still gets a name of its own, since the bundle holds both and OpenSSL picks an issuer by
name before it checks the signature; and `issue` says when the first certificate comes due."""

from __future__ import annotations

import datetime
import ssl

from cryptography import x509

from cdi.operator.certs import Certificates, Lifetime
from tests.support.fakekube import FakeKube


async def test_a_ca_renewed_at_once_has_a_name_of_its_own_and_both_stay_usable() -> None:
    certs = Certificates(FakeKube(), "cdi")
    first = await certs.issue({})  # CDI's defaults
    shorter = {"ca": {"duration": "3h", "renewBefore": "1h"}}
    second = await certs.issue(shorter)  # the same second: certConfig changed right after a start
    assert second.proxy_ca != first.proxy_ca
    assert second.proxy_ca.certificate().subject != first.proxy_ca.certificate().subject
    bundle = x509.load_pem_x509_certificates(second.proxy_bundle.encode())
    assert [ca.subject for ca in bundle] == [second.proxy_ca.certificate().subject,
                                             first.proxy_ca.certificate().subject]
    # a client trusting the bundle verifies leaves of either CA (what a name clash broke)
    for leaf, ca in ((first.proxy_leaf, first.proxy_ca), (second.proxy_leaf, second.proxy_ca)):
        issuer = next(c for c in bundle if c.subject == leaf.certificate().issuer)
        assert issuer == ca.certificate()
        leaf.certificate().verify_directly_issued_by(issuer)
    ssl.create_default_context(cadata=second.proxy_bundle)  # it loads as one bundle


async def test_issue_says_when_the_first_certificate_comes_due() -> None:
    certs = Certificates(FakeKube(), "cdi")
    config = {"server": {"duration": "1h", "renewBefore": "30m"}, "client": {"duration": "2h", "renewBefore": "1h"}}
    issued = await certs.issue(config)
    server = Lifetime.of(config, "server")
    expected = issued.api_leaf.certificate().not_valid_after_utc - server.renew_before
    assert abs(issued.next_renewal - expected) < datetime.timedelta(seconds=5)
    again = await certs.issue(config)  # nothing due: nothing reissued
    assert again == issued
