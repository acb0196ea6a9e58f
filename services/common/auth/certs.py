"""A local certificate authority for a secure single-machine cluster (`bandmaster up --secure`).

    pki = ensure_local_pki(state_dir / "secure", ["capacity", "scheduler", "router", "client"])
    pki.ca, pki.cert("router"), pki.key("router"), pki.control_token_file, pki.data_token_file

The CA and the two bearer tokens are made once and reused when the directory already holds them
(clients configured against an earlier run keep working); each named certificate is issued afresh.
Certificates name localhost, 127.0.0.1 and ::1 and are valid for both TLS server and client
authentication: a service presents the same one when it serves and when it dials. Keys are EC P-256.
Private keys and tokens are written 0600, in a 0700 directory.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_VALID_DAYS = 3650
CERT_VALID_DAYS = 365
LOCAL_NAMES = ("localhost",)
LOCAL_IPS = ("127.0.0.1", "::1")


@dataclass(frozen=True)
class LocalPki:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def ca_key(self) -> Path:
        return self.directory / "ca.key"

    def cert(self, name: str) -> Path:
        return self.directory / f"{name}.pem"

    def key(self, name: str) -> Path:
        return self.directory / f"{name}.key"

    @property
    def control_token_file(self) -> Path:
        return self.directory / "control.token"

    @property
    def data_token_file(self) -> Path:
        return self.directory / "data.token"

    def tls_args(self, name: str) -> list[str]:
        """The flags that give service `name` its certificate, key and the CA (mutual TLS)."""
        return ["--tls-cert", str(self.cert(name)), "--tls-key", str(self.key(name)), "--tls-ca", str(self.ca)]

    def service_args(self, name: str) -> list[str]:
        return [
            *self.tls_args(name),
            "--control-token-file",
            str(self.control_token_file),
            "--data-token-file",
            str(self.data_token_file),
        ]


def _write_private(path: Path, data: bytes) -> None:
    """Write `data` to `path` readable by the owner only, atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _write_public(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _now() -> datetime.datetime:
    # A minute in the past: a peer whose clock is slightly behind still accepts a fresh certificate.
    return datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=1)


def make_ca(common_name: str = "Bandmaster local CA") -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) of a new self-signed CA."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=CA_VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def issue(
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    common_name: str,
    *,
    dns_names: Iterable[str] = LOCAL_NAMES,
    ip_addresses: Iterable[str] = LOCAL_IPS,
    days: int = CERT_VALID_DAYS,
) -> tuple[bytes, bytes]:
    """(certificate PEM, key PEM) signed by the CA, for TLS server and client authentication."""
    ca_cert = x509.load_pem_x509_certificate(ca_cert_pem)
    ca_key = serialization.load_pem_private_key(ca_key_pem, password=None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    key = ec.generate_private_key(ec.SECP256R1())
    alt_names: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    alt_names += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ip_addresses]
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(alt_names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _key_pem(key)


def new_token() -> str:
    """A random bearer token: 256 bits, URL-safe."""
    return secrets.token_urlsafe(32)


def ensure_local_pki(directory: Path, names: Iterable[str]) -> LocalPki:
    """Create (or reuse) the CA and the tokens in `directory`, and issue a certificate per name."""
    pki = LocalPki(Path(directory))
    pki.directory.mkdir(parents=True, exist_ok=True)
    os.chmod(pki.directory, 0o700)
    if pki.ca.exists() and pki.ca_key.exists():
        ca_pem, ca_key_pem = pki.ca.read_bytes(), pki.ca_key.read_bytes()
    else:
        ca_pem, ca_key_pem = make_ca()
        _write_private(pki.ca_key, ca_key_pem)
        _write_public(pki.ca, ca_pem)
    for token_file in (pki.control_token_file, pki.data_token_file):
        if not token_file.exists() or not token_file.read_text().strip():
            _write_private(token_file, (new_token() + "\n").encode())
    for name in names:
        cert_pem, key_pem = issue(ca_pem, ca_key_pem, f"bandmaster-{name}")
        _write_private(pki.key(name), key_pem)
        _write_public(pki.cert(name), cert_pem)
    return pki
