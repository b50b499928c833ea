"""Errors of the emulated cloud: one exception carrying the HTTP status and the API error code."""

from __future__ import annotations

import math
from typing import Any

import msgspec
from aiohttp import web

# Status of the named errors a fault may inject when no status is given.
NAMED_STATUS: dict[str, int] = {
    "InsufficientInstanceCapacity": 503,
    "RequestLimitExceeded": 429,
    "InternalError": 500,
    "ServiceUnavailable": 503,
    "InstanceLimitExceeded": 400,
    "UnauthorizedOperation": 403,
    "AuthFailure": 401,
    "BadGateway": 502,
    "GatewayTimeout": 504,
    "Conflict": 409,
}
# Error code of a plain injected status.
STATUS_CODE: dict[int, str] = {
    400: "InvalidRequest",
    401: "AuthFailure",
    403: "UnauthorizedOperation",
    404: "NotFound",
    409: "Conflict",
    429: "RequestLimitExceeded",
    500: "InternalError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}


class CloudError(Exception):
    """An API error; `extra` adds fields to the error object (e.g. the machine's name)."""

    def __init__(self, status: int, code: str, message: str, *, retry_after: float | None = None,
                 **extra: Any) -> None:
        super().__init__(f"{code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after
        self.extra = extra

    def response(self) -> web.Response:
        err: dict[str, Any] = {"code": self.code, "message": self.message, **self.extra}
        headers: dict[str, str] = {}
        if self.retry_after is not None:
            secs = max(0, math.ceil(self.retry_after))
            headers["Retry-After"] = str(secs)
            err["retryAfterSeconds"] = secs
        if self.status == 401:
            headers["WWW-Authenticate"] = 'Bearer realm="sim-cloud"'
        return json_response({"error": err}, status=self.status, headers=headers)


def bad(message: str, code: str = "InvalidParameterValue") -> CloudError:
    return CloudError(400, code, message)


def json_response(body: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """Content-Type exactly `application/json`: strict SDKs ignore error bodies with a charset suffix."""
    return web.Response(body=msgspec.json.encode(body), status=status, headers=headers,
                        content_type="application/json")
