"""Certificates for cdi's TLS endpoints: a CA, leaf certificates it signs, and self-signed ones.

Every server cdi runs speaks TLS (API server, metrics, upload proxy and servers), and they all need
the same three things, so they are made here once, with `cryptography`."""

from __future__ import annotations

import contextlib
import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


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
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _sans(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def make_ca(common_name: str, days: float = 3650) -> KeyPair:
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


def issue(ca: KeyPair | None, common_name: str, hosts: list[str] | None = None, *, server: bool = True,
          client: bool = False, days: float = 365) -> KeyPair:
    """A leaf certificate signed by `ca`, or self-signed when `ca` is None."""
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


def server_context(pair: KeyPair, directory: Path, client_ca: bytes | None = None) -> ssl.SSLContext:
    """An SSL context serving `pair`; with `client_ca`, clients must present a certificate it signed."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)  # it holds the private key
    cert_path, key_path = directory / "tls.crt", directory / "tls.key"
    pair.write(cert_path, key_path)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert_path, key_path)
    if client_ca is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=client_ca.decode())
    return context
