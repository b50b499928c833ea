"""Typed API errors, so callers branch on `except NotFound` instead of comparing status codes and reasons."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from .redact import SECRET_VALUES


class Cause(msgspec.Struct, kw_only=True, omit_defaults=True, gc=False):
    """One `details.causes` entry of a `Status`: which field was wrong and why."""

    reason: str = ""
    message: str = ""
    field: str = ""


class _StatusDetails(msgspec.Struct, kw_only=True, rename="camel", gc=False):
    name: str = ""
    group: str = ""
    kind: str = ""
    uid: str = ""
    causes: list[Cause] = msgspec.field(default_factory=list)
    retry_after_seconds: int | None = None


class _Status(msgspec.Struct, kw_only=True, gc=False):
    kind: str = ""
    status: str = ""
    message: str = ""
    reason: str = ""
    code: int = 0
    details: _StatusDetails | None = None


_status_decoder = msgspec.json.Decoder(_Status)


class ApiError(Exception):
    """A request that did not succeed. `status` is 0 when no HTTP answer arrived (see `TransportError`)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        *,
        causes: list[Cause] | None = None,
        retry_after: float | None = None,
        body: bytes = b"",
        name: str = "",
        kind: str = "",
        group: str = "",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.reason = reason
        self.message = message
        self.causes: list[Cause] = causes or []
        self.retry_after = retry_after
        self.body = body
        self.name = name
        self.kind = kind
        self.group = group

    def __str__(self) -> str:
        head = f"{self.status} {self.reason}" if self.status else self.reason
        return f"{head}: {self.message}" if self.message else head

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status}, {self.reason!r}, {self.message!r})"

    @staticmethod
    def from_response(status: int, body: bytes, headers: Mapping[str, str]) -> ApiError:
        """Build the subclass for an HTTP failure; the body is a `Status` when the apiserver itself answered."""
        parsed: _Status | None = None
        if body[:1] == b"{":
            try:
                parsed = _status_decoder.decode(body)
            except msgspec.DecodeError:
                parsed = None
        if parsed is not None and parsed.kind == "Status":
            reason, message = parsed.reason, parsed.message
            details = parsed.details or _StatusDetails()
        else:
            # A proxy or load balancer answered (HTML, plain text): keep a readable excerpt.
            reason = _DEFAULT_REASONS.get(status, "Unknown")
            message = SECRET_VALUES.clip(body[:65536].decode("utf-8", "replace").strip(), 512) or f"HTTP {status}"
            details = _StatusDetails()
        retry_after = _retry_after(headers)
        if retry_after is None and details.retry_after_seconds is not None:
            retry_after = float(details.retry_after_seconds)
        cls = _error_class(status, reason)
        return cls(
            status,
            reason or _DEFAULT_REASONS.get(status, "Unknown"),
            message,
            causes=list(details.causes),
            retry_after=retry_after,
            body=body,
            name=details.name,
            kind=details.kind,
            group=details.group,
        )


class BadRequest(ApiError):
    """400."""


class Unauthorized(ApiError):
    """401: the credentials were missing, wrong or expired."""


class Forbidden(ApiError):
    """403: authenticated, but RBAC (or an admission plugin) said no."""


class NotFound(ApiError):
    """404."""


class MethodNotAllowed(ApiError):
    """405."""


class AlreadyExists(ApiError):
    """409 with reason AlreadyExists: a create met an object of the same name."""


class Conflict(ApiError):
    """409 otherwise: an optimistic-concurrency (resourceVersion/precondition) failure; re-read and retry."""


class Gone(ApiError):
    """410 (reason Expired or Gone): the resourceVersion was compacted away; relist."""


class UnsupportedMediaType(ApiError):
    """415: e.g. a strategic merge patch on a custom resource."""


class Invalid(ApiError):
    """422: validation failed; `causes` names the fields."""


class TooManyRequests(ApiError):
    """429: API priority and fairness (or a fault) asks to slow down; `retry_after` says for how long."""


class ServerError(ApiError):
    """>= 500."""


class ServerTimeout(ServerError):
    """504 (or a 5xx with reason Timeout/ServerTimeout): the server gave up; the request may have been applied."""


class TransportError(ApiError):
    """No HTTP answer: connection refused or reset, TLS failure, DNS, or a client-side timeout."""

    def __init__(self, message: str, *, reason: str = "TransportError") -> None:
        super().__init__(0, reason, message)


class RequestTimeout(TransportError):
    """The client's own timeout fired (connect, total, or a watch's read inactivity)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, reason="Timeout")


_DEFAULT_REASONS = {
    400: "BadRequest",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFound",
    405: "MethodNotAllowed",
    406: "NotAcceptable",
    409: "Conflict",
    410: "Gone",
    413: "RequestEntityTooLarge",
    415: "UnsupportedMediaType",
    422: "Invalid",
    429: "TooManyRequests",
    500: "InternalError",
    503: "ServiceUnavailable",
    504: "Timeout",
}

_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    405: MethodNotAllowed,
    410: Gone,
    415: UnsupportedMediaType,
    422: Invalid,
    429: TooManyRequests,
    504: ServerTimeout,
}


def _error_class(status: int, reason: str) -> type[ApiError]:
    if status == 409:
        return AlreadyExists if reason == "AlreadyExists" else Conflict
    cls = _BY_STATUS.get(status)
    if cls is not None:
        return cls
    if status >= 500:
        return ServerTimeout if reason in ("Timeout", "ServerTimeout") else ServerError
    return ApiError


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Retry-After in seconds; the HTTP-date form is not used by kube-apiserver and is ignored."""
    value = headers.get("Retry-After")
    if not value:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if seconds >= 0 else None
