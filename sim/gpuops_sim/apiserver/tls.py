"""A throwaway CA and serving certificate so the emulator can speak HTTPS like a real apiserver.

kubectl (client-go) only sends bearer tokens over TLS, so RBAC tests through kubectl need this.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
import tempfile
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_pem: bytes
    key_pem: bytes

    def server_context(self) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl wants files; keep them only as long as loading takes.
        with tempfile.TemporaryDirectory() as d:
            cert, key = Path(d) / "tls.crt", Path(d) / "tls.key"
            cert.write_bytes(self.cert_pem + self.ca_pem)
            key.write_bytes(self.key_pem)
            key.chmod(0o600)
            ctx.load_cert_chain(cert, key)
        return ctx


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_serving_cert(hosts: list[str], days: int = 7) -> ServingCert:
    """A fresh EC P-256 CA and a leaf for `hosts` (IP addresses and DNS names)."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("gpuops-sim-ca"))
        .issuer_name(_name("gpuops-sim-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for h in hosts:
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            sans.append(x509.DNSName(h))
    leaf = (
        x509.CertificateBuilder()
        .subject_name(_name("gpuops-sim-apiserver"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    return ServingCert(
        ca_pem=ca.public_bytes(pem),
        cert_pem=leaf.public_bytes(pem),
        key_pem=key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
