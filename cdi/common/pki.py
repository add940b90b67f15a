"""Certificates for cdi's TLS endpoints (a CA, leaf certificates it signs, self-signed ones), the SSL
contexts that serve them and the ones that connect to them, and the TLS policy of cdi's servers.

Every server cdi runs speaks TLS (API server, metrics, upload proxy and servers), and they all need
the same three things, so they are made here once, with `cryptography`. Every connection cdi makes
is TLS too; its context comes from `client_context` (verifying: a CA bundle, or the system store) or
`insecure_client_context` (endpoints that are self-signed by design), so that the floor (TLS 1.2),
what is trusted and how a client certificate is loaded are decided in one place.

`cryptography` is imported by the functions that make certificates, not with the module: a worker
pod that only connects should not pay its ~100 ms import."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import logging
import os
import ssl
import tempfile
import warnings
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from cryptography import x509
    from cryptography.hazmat.primitives.asymmetric import ec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KeyPair:
    """A PEM certificate and its PEM private key."""

    cert_pem: bytes
    key_pem: bytes

    def write(self, cert_path: Path, key_path: Path) -> None:
        cert_path.write_bytes(self.cert_pem)
        write_private(key_path, self.key_pem)

    @classmethod
    def read(cls, cert_path: Path, key_path: Path) -> KeyPair:
        return cls(cert_path.read_bytes(), key_path.read_bytes())

    def certificate(self) -> x509.Certificate:
        from cryptography import x509

        return x509.load_pem_x509_certificate(self.cert_pem)


def write_private(path: Path, data: bytes) -> None:
    """Write a file only its owner may read (0600) from its first byte: the bytes go to a new file that
    `mkstemp` creates 0600 whatever the umask, which then replaces `path` in one rename. So no other user
    can open it while it is written, a file an older version left 0644 does not keep that mode, and a
    reader never sees it half written."""
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _key() -> ec.EllipticCurvePrivateKey:
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sans(hosts: list[str]) -> x509.SubjectAlternativeName:
    from cryptography import x509

    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(common_name: str, days: float = 3650) -> KeyPair:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization

    key = _key()
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False),
                       critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


def can_sign(ca: KeyPair) -> bool:
    """Whether `issue` can sign with this CA: its key is one of ours (an ECDSA key). A CA another installation
    made (CDI's are RSA) cannot, and is replaced rather than used."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        return isinstance(serialization.load_pem_private_key(ca.key_pem, password=None), ec.EllipticCurvePrivateKey)
    except ValueError:
        return False


def issue(ca: KeyPair | None, common_name: str, hosts: list[str] | None = None, *, server: bool = True,
          client: bool = False, days: float = 365) -> KeyPair:
    """A leaf certificate signed by `ca`, or self-signed when `ca` is None."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID

    key = _key()
    now = _now()
    usages = []
    if server:
        usages.append(ExtendedKeyUsageOID.SERVER_AUTH)
    if client:
        usages.append(ExtendedKeyUsageOID.CLIENT_AUTH)
    if ca is None:
        issuer_name, signing_key = _name(common_name), key
    else:
        ca_cert = ca.certificate()
        issuer_name = ca_cert.subject
        loaded = serialization.load_pem_private_key(ca.key_pem, password=None)
        assert isinstance(loaded, ec.EllipticCurvePrivateKey)
        signing_key = loaded
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(issuer_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    )
    if hosts:
        builder = builder.add_extension(_sans(hosts), critical=False)
    cert = builder.sign(signing_key, hashes.SHA256())
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), _key_pem(key))


# -- SSL contexts ---------------------------------------------------------------------------------------

Identity = KeyPair | tuple[Path, Path]  # a client certificate: PEMs in memory, or (certificate file, key file)


def server_context(pair: KeyPair, directory: Path, client_ca: bytes | None = None,
                   policy: TLSPolicy | None = None) -> ssl.SSLContext:
    """An SSL context serving `pair`, written to `directory` (where a renewal can load it again); with
    `client_ca`, clients must present a certificate it signed; with `policy` (cdi's servers: CDIConfig's
    TLS profile), its versions and suites, else Python's defaults."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the private key
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    pair.write(cert_path, key_path)
    return server_context_from_files(cert_path, key_path, client_ca=None if client_ca is None else client_ca.decode(),
                                     policy=policy)


def server_context_from_files(cert_file: Path, key_file: Path, *, client_ca: str | Path | None = None,
                              client_required: bool = True, policy: TLSPolicy | None = None) -> ssl.SSLContext:
    """An SSL context serving the certificate and key in these files. With `client_ca` (PEM, or a file
    holding it) it asks clients for a certificate that CA signed (and trusts only that CA for them),
    refusing those without one when `client_required` (else the server decides per request)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert_file, key_file)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED if client_required else ssl.CERT_OPTIONAL
        if isinstance(client_ca, Path):
            context.load_verify_locations(cafile=str(client_ca))
        else:
            context.load_verify_locations(cadata=client_ca)
    if policy is not None:
        policy.apply(context)
    return context


def client_context(ca: str | None = None, *, also_system: bool = False,
                   identity: Identity | None = None) -> ssl.SSLContext:
    """A context that verifies the server it connects to (its chain and its name), TLS 1.2 at least:
    against `ca` (PEM, one or more certificates), or the system store when there is no `ca` (both with
    `also_system`). With `identity` it presents that client certificate."""
    context = ssl.create_default_context(cadata=ca)  # no `ca`: the system store
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None and also_system:
        context.load_default_certs()
    if identity is not None:
        _load_identity(context, identity)
    return context


def insecure_client_context(identity: Identity | None = None) -> ssl.SSLContext:
    """A context that verifies nothing, TLS 1.2 at least: for endpoints self-signed by design (a worker
    pod's metrics, kubelet's probes) and where a user said not to verify (`--insecure`, INSECURE_TLS, an
    APIService's `insecureSkipTLSVerify`). It loads no CA store: that costs ~70 ms of CPU, for nothing."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if identity is not None:
        _load_identity(context, identity)
    return context


def _load_identity(context: ssl.SSLContext, identity: Identity) -> None:
    if isinstance(identity, KeyPair):
        # ssl loads certificates only from files: these live in a private directory for this call only
        with tempfile.TemporaryDirectory(prefix="cdi-tls-") as tmp:
            cert_path, key_path = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            identity.write(cert_path, key_path)
            context.load_cert_chain(cert_path, key_path)
    else:
        context.load_cert_chain(*identity)


# -- the TLS policy of cdi's servers -------------------------------------------------------------------

TLS_VERSIONS = {"VersionTLS10": ssl.TLSVersion.TLSv1, "VersionTLS11": ssl.TLSVersion.TLSv1_1,
                "VersionTLS12": ssl.TLSVersion.TLSv1_2, "VersionTLS13": ssl.TLSVersion.TLSv1_3}
# TLS 1.3's suites, named alike by IANA and OpenSSL; not configurable (`TLSPolicy`)
TLS13_SUITES = ("TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256")
# The suites of TLS 1.2 and older that CDI's servers can offer, by their OpenSSL name (how OpenShift's
# profiles name them) and their IANA name (which CDI accepts too); any other name is ignored, as CDI does
# (its Go servers know no DHE suite, for one).
SUITES_IANA = {
    "ECDHE-ECDSA-AES128-GCM-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-RSA-AES128-GCM-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
    "ECDHE-ECDSA-AES256-GCM-SHA384": "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-RSA-AES256-GCM-SHA384": "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
    "ECDHE-ECDSA-CHACHA20-POLY1305": "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-RSA-CHACHA20-POLY1305": "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
    "ECDHE-ECDSA-AES128-SHA256": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-RSA-AES128-SHA256": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "AES128-GCM-SHA256": "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "AES256-GCM-SHA384": "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "AES128-SHA256": "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "ECDHE-ECDSA-AES128-SHA": "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "ECDHE-RSA-AES128-SHA": "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "ECDHE-ECDSA-AES256-SHA": "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "ECDHE-RSA-AES256-SHA": "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "AES128-SHA": "TLS_RSA_WITH_AES_128_CBC_SHA",
    "AES256-SHA": "TLS_RSA_WITH_AES_256_CBC_SHA",
    "DES-CBC3-SHA": "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
}
_OPENSSL_NAME = {**{name: name for name in SUITES_IANA}, **{iana: name for name, iana in SUITES_IANA.items()}}
# No suite of TLS 1.2 or older: the cipher list is then inert (the minimum is TLS 1.3) but still set, so that
# both TLS implementations run at the same security level.
_INERT_CIPHERS = "ECDHE+AESGCM"


@dataclass(frozen=True)
class TLSPolicy:
    """Which protocol versions and cipher suites a server offers: CDI's TLS security profile
    (`cdi.api.tlsprofile`) in OpenSSL's terms, applied the same way to an `ssl.SSLContext` (`apply`) and
    to the C path's own context (`cdi.common.tlsfront`, which takes `minimum` and `ciphers`).

    As in CDI: the profile's suites of TLS 1.2 and older in its order (the server's preference), names
    neither CDI nor OpenShift know ignored; TLS 1.3's suites are OpenSSL's three, whatever the profile lists
    (CDI's Go servers cannot configure them either, and Python's `ssl` has no way to). The security level
    is OpenSSL's 2 (Python's default), or 0 where the profile allows TLS 1.0 or 1.1, which OpenSSL 3 refuses
    above level 0 (the Old profile)."""

    minimum: ssl.TLSVersion
    ciphers: str  # an OpenSSL cipher list for TLS 1.2 and older, with its @SECLEVEL
    ignored: tuple[str, ...] = ()  # names in the profile that no server of CDI's can offer

    @classmethod
    def of(cls, names: Iterable[str], min_version: str) -> TLSPolicy:
        """From a profile's cipher names and minTLSVersion (`VersionTLS12`; an unknown one: TLS 1.2)."""
        minimum = TLS_VERSIONS.get(min_version, ssl.TLSVersion.TLSv1_2)
        suites: list[str] = []
        ignored: list[str] = []
        for name in names:
            name = name.strip()
            if name in TLS13_SUITES or not name:
                continue
            known = _OPENSSL_NAME.get(name)
            if known is None:
                ignored.append(name)
            elif known not in suites:
                suites.append(known)
        if not suites:  # no suite below TLS 1.3 can be negotiated: nothing below it can be either
            minimum = max(minimum, ssl.TLSVersion.TLSv1_3)
        level = 0 if minimum < ssl.TLSVersion.TLSv1_2 else 2
        if ignored:  # as CDI, silently for the built-in profiles' DHE suites (every start would warn)
            log.debug("TLS profile: ignoring cipher names no server of CDI's can offer: %s", ", ".join(ignored))
        return cls(minimum, f"{':'.join(suites) or _INERT_CIPHERS}:@SECLEVEL={level}", tuple(ignored))

    def at_least(self, minimum: ssl.TLSVersion) -> TLSPolicy:
        """This policy with a higher minimum version (a channel of cdi's own that needs TLS 1.3)."""
        return replace(self, minimum=max(self.minimum, minimum))

    def apply(self, context: ssl.SSLContext) -> None:
        """Put the policy on a server context. Also on one that serves already (a live change), from the
        thread that makes its connections (the event loop for aiohttp's): OpenSSL contexts are not to be
        changed while another thread makes a connection from them."""
        with warnings.catch_warnings():  # Python deprecates TLS 1.0 and 1.1; the Old profile asks for them
            warnings.simplefilter("ignore", DeprecationWarning)
            context.minimum_version = self.minimum
        context.set_ciphers(self.ciphers)
        context.options |= ssl.OP_NO_RENEGOTIATION | ssl.OP_NO_COMPRESSION | ssl.OP_CIPHER_SERVER_PREFERENCE

    def describe(self) -> str:
        return f"TLS {self.minimum.name.removeprefix('TLSv').replace('_', '.')} and up, ciphers {self.ciphers}"
