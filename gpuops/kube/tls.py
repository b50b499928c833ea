"""Serving certificates for the manager's HTTPS endpoints: a self-signed one made at start, or tls.crt/tls.key
from a directory (a mounted Secret) that is watched and reloaded in place as the Secret rotates.

The self-signed certificate is a throwaway CA and a leaf it signed (what client-go's self-signed serving
does), so a client that wants to verify can pin `ca_pem`; Prometheus usually scrapes such endpoints with
`insecure_skip_verify` or with the cert-manager CA when a real certificate is mounted.

Reloading keeps one `ssl.SSLContext` and loads the new pair into it: every handshake after the reload
presents the new certificate, established connections keep the old one, and nothing restarts. A pair that
does not parse, or whose key does not belong to its certificate (a Secret caught half-updated), is ignored
and the previous one keeps serving; the next poll tries again. Keys are handed to `ssl` through anonymous
memory files where the platform has them, so nothing but the mounted files is ever on disk.
"""

from __future__ import annotations

import asyncio
import datetime
import hashlib
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from prometheus_client import Counter, Gauge

__all__ = [
    "CertError",
    "CertKey",
    "CertWatcher",
    "issue_leaf",
    "load_chain_into",
    "load_into",
    "make_ca",
    "private_key_pem",
    "self_signed",
    "server_context",
    "subject",
]

log = structlog.get_logger("gpuops.kube.tls")

SELF_SIGNED_VALIDITY: Final = datetime.timedelta(days=365)
_BACKDATE: Final = datetime.timedelta(minutes=5)  # tolerate clients whose clocks are slightly behind
CERT_FILE, KEY_FILE = "tls.crt", "tls.key"

CERT_RELOADS = Counter(
    "gpuops_tls_certificate_reloads",
    "Serving certificates (re)loaded from a directory, by server and result (success, error)",
    ["server", "result"],
)
CERT_EXPIRY = Gauge(
    "gpuops_tls_certificate_expiry_timestamp_seconds",
    "When the serving certificate presented now expires (Unix time)",
    ["server"],
)


class CertError(ValueError):
    """A certificate directory that cannot be served from (missing, unreadable or mismatched files)."""


@dataclass(frozen=True, slots=True)
class CertKey:
    """A serving certificate chain (leaf first) and its private key, PEM; `ca_pem` is the issuer to trust
    when known (self-signed certificates)."""

    cert_pem: bytes
    key_pem: bytes
    ca_pem: bytes = b""

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    def check(self) -> None:
        """Raise `CertError` unless the certificate parses and the key belongs to it."""
        try:
            cert = self.cert
            key = serialization.load_pem_private_key(self.key_pem, password=None)
        except (ValueError, TypeError) as e:
            raise CertError(f"not a PEM certificate and private key: {e}") from None
        fmt = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        if key.public_key().public_bytes(*fmt) != cert.public_key().public_bytes(*fmt):
            raise CertError("the private key does not belong to the certificate")


def subject(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name[:64])])


def _usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca, content_commitment=False,
                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                         encipher_only=False, decipher_only=False)


def private_key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(name: x509.Name, start: datetime.datetime,
            validity: datetime.timedelta) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A self-signed ECDSA P-256 CA that may sign leaf certificates only (path length 0)."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _BACKDATE)
        .not_valid_after(start + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def issue_leaf(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: Sequence[str],
               name: x509.Name, start: datetime.datetime,
               validity: datetime.timedelta) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A server certificate for `names` (DNS names and IP addresses, as strings) signed by the CA; its
    validity is capped at the CA's, so a leaf never outlives what vouches for it."""
    if not names:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    key = ec.generate_private_key(ec.SECP256R1())
    sans: list[x509.GeneralName] = []
    for n in dict.fromkeys(names):
        try:
            sans.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            sans.append(x509.DNSName(n))
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start - _BACKDATE)
        .not_valid_after(min(start + validity, ca_cert.not_valid_after_utc))
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def self_signed(
    names: Sequence[str],
    *,
    common_name: str = "gpuops",
    validity: datetime.timedelta = SELF_SIGNED_VALIDITY,
    now: datetime.datetime | None = None,
) -> CertKey:
    """A fresh CA and a serving certificate for `names` (DNS names and IP addresses) it signed.

    `cert_pem` is the chain leaf + CA; `ca_pem` the CA alone (its key is discarded: nothing else is ever
    signed with it)."""
    if not names:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    start = now if now is not None else datetime.datetime.now(datetime.UTC)
    ca, ca_key = make_ca(subject(f"{common_name}-ca@{int(start.timestamp())}"), start, validity)
    leaf, key = issue_leaf(ca, ca_key, names, subject(f"{common_name}@{int(start.timestamp())}"), start, validity)
    pem = serialization.Encoding.PEM
    ca_pem = ca.public_bytes(pem)
    return CertKey(leaf.public_bytes(pem) + ca_pem, private_key_pem(key), ca_pem)


def load_chain_into(ctx: ssl.SSLContext, cert_pem: bytes, key_pem: bytes) -> None:
    """(Re)load a certificate chain and key into `ctx`; handshakes from now on present it, so rotation needs
    no restart.

    `ssl` reads keys only from paths: on Linux the PEMs go through anonymous memory files (nothing touches a
    filesystem, so a read-only root works), elsewhere through a private temporary directory removed right
    after."""
    if hasattr(os, "memfd_create") and os.path.isdir("/proc/self/fd"):
        fds: list[int] = []
        try:
            for data in (cert_pem, key_pem):
                fds.append(os.memfd_create("gpuops-tls"))
                view = memoryview(data)
                while view:
                    view = view[os.write(fds[-1], view):]
            ctx.load_cert_chain(f"/proc/self/fd/{fds[0]}", f"/proc/self/fd/{fds[1]}")
            return
        except OSError:
            pass  # /proc without access to our own fds: fall back to a temporary directory
        finally:
            for fd in fds:
                os.close(fd)
    with tempfile.TemporaryDirectory(prefix="gpuops-tls-") as d:  # 0700, removed right after
        cert, key = Path(d) / CERT_FILE, Path(d) / KEY_FILE
        cert.write_bytes(cert_pem)
        key.touch(0o600)
        key.write_bytes(key_pem)
        ctx.load_cert_chain(cert, key)


def load_into(ctx: ssl.SSLContext, pair: CertKey) -> None:
    load_chain_into(ctx, pair.cert_pem, pair.key_pem)


def server_context(pair: CertKey) -> ssl.SSLContext:
    """A TLS 1.2+ server context presenting `pair`."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_into(ctx, pair)
    return ctx


class CertWatcher:
    """tls.crt and tls.key in `directory`, served through `context` and reloaded when they change.

    `load()` must succeed once (at start: a missing or broken pair is a configuration error); `run()` then
    polls every `interval` seconds. Polling compares the files' contents, so it sees a Secret volume's
    atomic symlink swap, an in-place rewrite, or a copy with an unchanged mtime alike.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        name: str = "metrics",
        interval: float = 10.0,
        cert_file: str = CERT_FILE,
        key_file: str = KEY_FILE,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.interval = interval
        self._cert_path = self.directory / cert_file
        self._key_path = self.directory / key_file
        self.context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.context.minimum_version = ssl.TLSVersion.TLSv1_2
        self.current: CertKey | None = None
        self._digest = b""
        self._rejected = b""  # the digest of a pair already reported as unusable (warn once per content)

    def _read(self) -> CertKey:
        try:
            return CertKey(self._cert_path.read_bytes(), self._key_path.read_bytes())
        except OSError as e:
            raise CertError(f"cannot read the serving certificate: {e}") from None

    def load(self) -> None:
        """Load the pair now; `CertError` if it is missing or unusable (the previous one, if any, stays)."""
        pair = self._read()
        digest = hashlib.sha256(pair.cert_pem + b"\0" + pair.key_pem).digest()
        try:
            pair.check()
            load_into(self.context, pair)
        except (CertError, ssl.SSLError, OSError) as e:
            CERT_RELOADS.labels(self.name, "error").inc()
            self._rejected = digest
            raise CertError(f"{self._cert_path}, {self._key_path}: {e}") from None
        first = self.current is None
        self.current, self._digest, self._rejected = pair, digest, b""
        CERT_RELOADS.labels(self.name, "success").inc()
        expires = pair.cert.not_valid_after_utc
        CERT_EXPIRY.labels(self.name).set(expires.timestamp())
        log.info("serving certificate loaded" if first else "serving certificate reloaded", server=self.name,
                 directory=str(self.directory), expires=expires.isoformat())

    def poll(self) -> bool:
        """Reload when the files' contents changed; True when a new pair is now served."""
        try:
            pair = self._read()
        except CertError as e:
            if self._rejected != b"missing":
                log.warning("serving certificate unreadable; keeping the current one", server=self.name,
                            error=str(e))
                self._rejected = b"missing"
            return False
        digest = hashlib.sha256(pair.cert_pem + b"\0" + pair.key_pem).digest()
        if digest == self._digest:
            self._rejected = b""
            return False
        if digest == self._rejected:
            return False
        try:
            self.load()
        except CertError as e:
            log.warning("ignoring an unusable serving certificate; keeping the current one", server=self.name,
                        error=str(e))
            return False
        return True

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                self.poll()
            except Exception:  # never let the watcher die: the current certificate keeps serving
                log.exception("serving certificate watch failed", server=self.name)
