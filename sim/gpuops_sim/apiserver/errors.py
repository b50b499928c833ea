"""Kubernetes `Status` failures as exceptions, so any layer can refuse a request with the upstream shape."""

from __future__ import annotations

from typing import Any


class Cause:
    """One entry of `details.causes`: what was wrong with which field."""

    __slots__ = ("field", "message", "reason")

    def __init__(self, reason: str, message: str, field: str = "") -> None:
        self.reason = reason
        self.message = message
        self.field = field

    def to_dict(self) -> dict[str, str]:
        """metav1.StatusCause: every field is omitempty."""
        out = {"reason": self.reason} if self.reason else {}
        if self.message:
            out["message"] = self.message
        if self.field:
            out["field"] = self.field
        return out

    def __repr__(self) -> str:
        return f"Cause({self.reason!r}, {self.message!r}, {self.field!r})"


class StatusError(Exception):
    """A request failure that the server answers with a `Status` body and `code`."""

    def __init__(
        self,
        code: int,
        reason: str,
        message: str,
        *,
        name: str = "",
        group: str = "",
        kind: str = "",
        causes: list[Cause] | None = None,
        retry_after: int | None = None,
        headers: dict[str, str] | None = None,
        empty_details: bool = False,
    ) -> None:
        """`empty_details`: answer `"details":{}` though there is nothing to detail, as upstream's generic
        NotFound for an unknown path does."""
        super().__init__(message)
        self.empty_details = empty_details
        self.code = code
        self.reason = reason
        self.message = message
        self.name = name
        self.group = group
        self.kind = kind
        self.causes = causes or []
        self.retry_after = retry_after
        self.headers = headers or {}

    def to_status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.name:
            details["name"] = self.name
        if self.group:
            details["group"] = self.group
        if self.kind:
            details["kind"] = self.kind
        if self.causes:
            details["causes"] = [c.to_dict() for c in self.causes]
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after
        # metav1.Status's field order, as Go prints it: TypeMeta, metadata, status, message, reason, details, code.
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
        }
        if self.reason:
            body["reason"] = self.reason
        if details or self.empty_details:
            body["details"] = details
        body["code"] = self.code
        return body


def qualified(resource: str, group: str) -> str:
    """`pods` or `gpuworkloadbudgets.gpuops.io`: how upstream messages name a resource."""
    return f"{resource}.{group}" if group else resource


def not_found(resource: str, group: str, name: str) -> StatusError:
    return StatusError(
        404,
        "NotFound",
        f'{qualified(resource, group)} "{name}" not found',
        name=name,
        group=group,
        kind=resource,
    )


def already_exists(resource: str, group: str, name: str) -> StatusError:
    return StatusError(
        409,
        "AlreadyExists",
        f'{qualified(resource, group)} "{name}" already exists',
        name=name,
        group=group,
        kind=resource,
    )


def conflict(resource: str, group: str, name: str, detail: str | None = None) -> StatusError:
    why = (
        detail
        or "the object has been modified; please apply your changes to the latest version and try again"
    )
    return StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified(resource, group)} "{name}": {why}',
        name=name,
        group=group,
        kind=resource,
    )


def invalid(kind: str, group: str, name: str, causes: list[Cause]) -> StatusError:
    """422 with field causes; the message lists them the way the apiserver does."""
    parts = []
    for c in causes:
        parts.append(f"{c.field}: {c.message}" if c.field else c.message)
    summary = parts[0] if len(parts) == 1 else "[" + ", ".join(parts) + "]"
    return StatusError(
        422,
        "Invalid",
        f'{kind}{"." + group if group else ""} "{name}" is invalid: {summary}',
        name=name,
        group=group,
        kind=kind,
        causes=causes,
    )


def bad_request(message: str, causes: list[Cause] | None = None) -> StatusError:
    return StatusError(400, "BadRequest", message, causes=causes)


def forbidden(message: str, *, resource: str = "", group: str = "", name: str = "") -> StatusError:
    return StatusError(403, "Forbidden", message, name=name, group=group, kind=resource)


def expired(message: str) -> StatusError:
    return StatusError(410, "Expired", message)


def method_not_allowed(
    message: str = "the server does not allow this method on the requested resource",
) -> StatusError:
    return StatusError(405, "MethodNotAllowed", message)


def unsupported_media_type(message: str) -> StatusError:
    return StatusError(415, "UnsupportedMediaType", message)


def internal(message: str) -> StatusError:
    return StatusError(
        500, "InternalError", f"Internal error occurred: {message}", causes=[Cause("", message)]
    )


def too_many_requests(message: str, retry_after: int = 1, causes: list[Cause] | None = None) -> StatusError:
    return StatusError(429, "TooManyRequests", message, retry_after=retry_after, causes=causes)
