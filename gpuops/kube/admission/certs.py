"""The webhook's own PKI: a CA (10 years) and a serving certificate (1 year) it signs, so the operator needs no
cert-manager. The apiserver trusts the CA through the MutatingWebhookConfiguration's caBundle, which the
operator patches in (`cabundle.CABundlePatcher`).

Keys never have to touch a disk: without a directory everything lives in memory (Python's `ssl` loads keys
only from paths; `load_into` hands it anonymous memory files on Linux, a private temporary directory
elsewhere), so a read-only root filesystem is enough. With a directory (e.g. a mounted Secret-backed or
persistent volume) the CA and the certificate are restored from it, and whatever had to be (re)made is
written back when the directory is writable, so a restart keeps the caBundle the apiserver already trusts.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import structlog
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpuops.kube import tls

__all__ = [
    "CA_VALIDITY",
    "ROTATION_MARGIN",
    "SERVING_VALIDITY",
    "CertKeeper",
    "KeyPair",
    "ServingCerts",
    "create_ca",
    "issue_serving_cert",
    "load_or_create",
    "needs_rotation",
    "renew",
    "server_ssl_context",
    "service_dns_names",
]

CA_VALIDITY: Final = datetime.timedelta(days=3650)
SERVING_VALIDITY: Final = datetime.timedelta(days=365)
ROTATION_MARGIN: Final = datetime.timedelta(days=30)
"""Renew this long before expiry: a month of slack for a stuck rollout or a missed check."""
CA_CERT, CA_KEY, TLS_CERT, TLS_KEY = "ca.crt", "ca.key", "tls.crt", "tls.key"

log = structlog.get_logger("gpuops.kube.admission.certs")

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A certificate and its private key, both PEM."""

    cert_pem: bytes
    key_pem: bytes

    @property
    def cert(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)


@dataclass(frozen=True, slots=True)
class ServingCerts:
    """The CA and the serving certificate it signed; `ca_bundle_pem` is what the webhook configuration needs."""

    ca: KeyPair
    serving: KeyPair

    @property
    def ca_bundle_pem(self) -> bytes:
        return self.ca.cert_pem

    def ssl_context(self) -> ssl.SSLContext:
        return server_ssl_context(self.serving)


def _now(now: datetime.datetime | None) -> datetime.datetime:
    return now if now is not None else datetime.datetime.now(datetime.UTC)


def service_dns_names(service: str, namespace: str) -> list[str]:
    """The names the apiserver dials a Service-backed webhook by (it verifies `<service>.<namespace>.svc`)."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def create_ca(common_name: str = "gpuops-webhook-ca", *, now: datetime.datetime | None = None,
              validity: datetime.timedelta = CA_VALIDITY) -> KeyPair:
    """A self-signed ECDSA P-256 CA that may sign leaf certificates only (path length 0)."""
    cert, key = tls.make_ca(tls.subject(common_name), _now(now), validity)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), tls.private_key_pem(key))


def _split_names(names: Sequence[str]) -> tuple[list[str], list[IPAddress]]:
    dns: list[str] = []
    ips: list[IPAddress] = []
    for n in names:
        try:
            ips.append(ipaddress.ip_address(n))
        except ValueError:
            dns.append(n)
    return dns, ips


def issue_serving_cert(ca: KeyPair, names: Sequence[str], *, now: datetime.datetime | None = None,
                       validity: datetime.timedelta = SERVING_VALIDITY) -> KeyPair:
    """A server certificate for `names` (DNS names and IP addresses, as strings) signed by `ca`, valid no
    longer than `ca`."""
    ca_key = serialization.load_pem_private_key(ca.key_pem, password=None)
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise TypeError(f"unsupported CA key type {type(ca_key).__name__}")
    if not names:
        raise ValueError("a serving certificate needs at least one DNS name or IP address")
    cert, key = tls.issue_leaf(ca.cert, ca_key, names, tls.subject(names[0]), _now(now), validity)
    return KeyPair(cert.public_bytes(serialization.Encoding.PEM), tls.private_key_pem(key))


def _as_cert(cert: x509.Certificate | KeyPair | bytes) -> x509.Certificate:
    if isinstance(cert, KeyPair):
        return cert.cert
    if isinstance(cert, bytes):
        return x509.load_pem_x509_certificate(cert)
    return cert


def needs_rotation(cert: x509.Certificate | KeyPair | bytes, now: datetime.datetime | None = None,
                   margin: datetime.timedelta = ROTATION_MARGIN) -> bool:
    """True once `cert` is within `margin` of expiring (or expired, or not yet valid)."""
    c = _as_cert(cert)
    t = _now(now)
    return t < c.not_valid_before_utc or t + margin >= c.not_valid_after_utc


def _covers(cert: x509.Certificate, names: Sequence[str]) -> bool:
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have = {*san.get_values_for_type(x509.DNSName), *(str(i) for i in san.get_values_for_type(x509.IPAddress))}
    dns, ips = _split_names(names)
    return {*dns, *(str(i) for i in ips)} <= have


def _signed_by(cert: x509.Certificate, ca: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


def _matches(pair: KeyPair) -> bool:
    """Whether the key belongs to the certificate (a half-written directory must not be trusted)."""
    key = serialization.load_pem_private_key(pair.key_pem, password=None)
    fmt = (serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return key.public_key().public_bytes(*fmt) == pair.cert.public_key().public_bytes(*fmt)


def _read(directory: Path, cert_file: str, key_file: str) -> KeyPair | None:
    try:
        pair = KeyPair((directory / cert_file).read_bytes(), (directory / key_file).read_bytes())
        return pair if _matches(pair) else None
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as e:
        log.warning("ignoring unreadable webhook certificate", directory=str(directory), file=cert_file, error=str(e))
        return None


def _write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _persist(directory: Path, files: dict[str, bytes]) -> None:
    try:
        directory.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            _write_atomically(directory / name, data)
    except OSError as e:  # a read-only mount (e.g. a Secret volume): serving from memory still works
        log.warning("cannot persist webhook certificates; they live in memory until the next restart",
                    directory=str(directory), error=str(e))


def load_or_create(
    names: Sequence[str],
    directory: str | os.PathLike[str] | None = None,
    *,
    now: datetime.datetime | None = None,
    margin: datetime.timedelta = ROTATION_MARGIN,
    ca_validity: datetime.timedelta = CA_VALIDITY,
    serving_validity: datetime.timedelta = SERVING_VALIDITY,
) -> ServingCerts:
    """The CA and serving certificate for `names`: restored from `directory` when still good, else made anew.

    The CA is kept unless it is missing, broken or within `margin` of expiry; the serving certificate is
    re-issued when it is missing, expiring, not signed by the CA or does not cover every name asked for.
    """
    where = Path(directory) if directory is not None else None
    ca = _read(where, CA_CERT, CA_KEY) if where is not None else None
    fresh: dict[str, bytes] = {}
    if ca is None or needs_rotation(ca, now, margin):
        ca = create_ca(now=now, validity=ca_validity)
        fresh |= {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem}
    serving = _read(where, TLS_CERT, TLS_KEY) if where is not None and not fresh else None
    if serving is None or needs_rotation(serving, now, margin) or not _covers(serving.cert, names) \
            or not _signed_by(serving.cert, ca.cert):
        serving = issue_serving_cert(ca, names, now=now, validity=serving_validity)
        fresh |= {TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem}
    if where is not None and fresh:
        _persist(where, fresh)
    if fresh:
        log.info("webhook certificates issued", renewed=sorted(fresh), names=list(names),
                 expires=serving.cert.not_valid_after_utc.isoformat())
    return ServingCerts(ca, serving)


def renew(
    current: ServingCerts,
    names: Sequence[str],
    directory: str | os.PathLike[str] | None = None,
    *,
    now: datetime.datetime | None = None,
    margin: datetime.timedelta = ROTATION_MARGIN,
    ca_validity: datetime.timedelta = CA_VALIDITY,
    serving_validity: datetime.timedelta = SERVING_VALIDITY,
) -> ServingCerts | None:
    """The successor of `current` once either certificate is due (None while both are good).

    The CA is kept unless it is itself due, so the caBundle the apiserver trusts stays valid; a new CA
    means the webhook configuration must be re-patched before the new certificate is presented."""
    ca = current.ca
    fresh: dict[str, bytes] = {}
    if needs_rotation(ca, now, margin):
        ca = create_ca(now=now, validity=ca_validity)
        fresh |= {CA_CERT: ca.cert_pem, CA_KEY: ca.key_pem}
    elif not needs_rotation(current.serving, now, margin) and _covers(current.serving.cert, names):
        return None
    serving = issue_serving_cert(ca, names, now=now, validity=serving_validity)
    fresh |= {TLS_CERT: serving.cert_pem, TLS_KEY: serving.key_pem}
    if directory is not None:
        _persist(Path(directory), fresh)
    log.info("webhook certificates renewed", renewed=sorted(fresh),
             expires=serving.cert.not_valid_after_utc.isoformat())
    return ServingCerts(ca, serving)


def load_into(ctx: ssl.SSLContext, serving: KeyPair) -> None:
    """(Re)load `serving` into `ctx`; new handshakes use it at once, so rotation needs no restart."""
    tls.load_chain_into(ctx, serving.cert_pem, serving.key_pem)


def server_ssl_context(serving: KeyPair) -> ssl.SSLContext:
    """A TLS 1.2+ server context presenting `serving` (the apiserver offers TLS 1.2 and 1.3)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    load_into(ctx, serving)
    return ctx


class CertKeeper:
    """The replica's current certificates, renewed in place before they expire.

    `before_new_ca` hooks run (awaited) after a CA rotation and before the server presents a certificate of the
    new CA, so the caBundle already trusts it when the first handshake uses it."""

    def __init__(self, names: Sequence[str], directory: str | None = None, *,
                 margin: datetime.timedelta = ROTATION_MARGIN) -> None:
        self.names = list(names)
        self.directory = directory
        self.margin = margin
        self.current: ServingCerts = load_or_create(self.names, directory, margin=margin)
        self.before_new_ca: list[Callable[[], Awaitable[object]]] = []
        self._ca_pending = False

    def ca_pem(self) -> bytes:
        return self.current.ca_bundle_pem

    @property
    def ca_pending(self) -> bool:
        """A new CA whose `before_new_ca` hooks have not all succeeded yet: keep presenting the old certificate."""
        return self._ca_pending

    async def refresh(self, now: datetime.datetime | None = None) -> bool:
        """Renew what is due (True if anything was), then run the new-CA hooks until they have succeeded."""
        fresh = renew(self.current, self.names, self.directory, now=now, margin=self.margin)
        if fresh is not None:
            self._ca_pending = self._ca_pending or fresh.ca.cert_pem != self.current.ca.cert_pem
            self.current = fresh
        if self._ca_pending:
            for hook in self.before_new_ca:
                await hook()
            self._ca_pending = False
        return fresh is not None
