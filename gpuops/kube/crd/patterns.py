"""Kubernetes' own syntax rules as schema markers: what the API server checks on its built-in objects (label keys
and values, DNS names, taints, quantities, Secret keys), so a custom resource that will be copied into one of them
is refused at admission rather than by a later write the controller makes.

Patterns are anchored RE2 (the API server's regex engine) with bounded repetition, and every string or map a CEL
rule walks has a maximum size, which keeps the API server's cost estimate for the rule within its budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

import msgspec

from .markers import Rule, crd, marker

__all__ = [
    "DNS_LABEL",
    "DNS_SUBDOMAIN",
    "HTTP_URL",
    "LABEL_KEY",
    "LABEL_VALUE",
    "QUANTITY",
    "RESOURCE_NAME",
    "SECRET_KEY",
    "dns_label",
    "dns_subdomain",
    "http_url",
    "label_map",
    "resource_name",
    "secret_key",
    "syntax",
]

_SEGMENT: Final = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
DNS_LABEL: Final = rf"^{_SEGMENT}$"
"""RFC 1123 label: a namespace, a Service name (at most 63 characters)."""
DNS_SUBDOMAIN: Final = rf"^{_SEGMENT}(\.{_SEGMENT})*$"
"""RFC 1123 subdomain: most object names, Node names (at most 253 characters)."""
_NAME: Final = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY: Final = rf"^({_SEGMENT}(\.{_SEGMENT})*/)?{_NAME}$"
"""A qualified name: an optional DNS-subdomain prefix and `/`, then at most 63 alphanumerics, `-`, `_`, `.`."""
LABEL_VALUE: Final = rf"^({_NAME})?$"
"""Empty, or at most 63 alphanumerics, `-`, `_`, `.`, beginning and ending with an alphanumeric."""
RESOURCE_NAME: Final = rf"^({_SEGMENT}(\.{_SEGMENT})*/)?{_NAME}$"
"""A resource name (nvidia.com/gpu, cpu): a label key's syntax."""
SECRET_KEY: Final = r"^[-._a-zA-Z0-9]+$"
"""A key of a Secret's data."""
QUANTITY: Final = (
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
"""The syntax of a Kubernetes quantity (the API server's own pattern for quantity fields)."""
HTTP_URL: Final = r"^https?://[^\s/?#@]+(/[^\s]*)?$"
"""An absolute http(s) URL without user information (credentials belong in a Secret, not in a URL that ends up
in status, Events and logs)."""


def _matches(pattern: str, message: str) -> Rule:
    return Rule(f"self.matches(r'{pattern}')", message)


def syntax(pattern: str, message: str, *, max_length: int, min_length: int = 1, rules: Sequence[Rule] = (),
           **more: Any) -> msgspec.Meta:
    """A string of a given syntax, refused with `message` (what it must be, with an example) rather than with the
    bare regular expression the API server would quote for a `pattern`."""
    return crd(min_length=min_length, max_length=max_length, rules=(_matches(pattern, message), *rules), **more)


def dns_subdomain(**more: Any) -> msgspec.Meta:
    return syntax(DNS_SUBDOMAIN, "must be a DNS subdomain name: lowercase letters, digits, '-' and '.', starting and "
                  "ending with a letter or digit (e.g. gpu-node-1)", max_length=253, **more)


def dns_label(**more: Any) -> msgspec.Meta:
    return syntax(DNS_LABEL, "must be a DNS label: at most 63 lowercase letters, digits and '-', starting and ending "
                  "with a letter or digit (e.g. gpuops-system)", max_length=63, **more)


def secret_key(**more: Any) -> msgspec.Meta:
    return syntax(SECRET_KEY, "must be a Secret data key: letters, digits, '-', '_' and '.' (e.g. token)",
                  max_length=253, **more)


def http_url(**more: Any) -> msgspec.Meta:
    return syntax(HTTP_URL, "must be an absolute http:// or https:// URL without user:password@ (put credentials "
                  "in the Secret), e.g. https://bmc.example.com/power", min_length=8, max_length=2048, **more)


def resource_name(**more: Any) -> msgspec.Meta:
    return syntax(RESOURCE_NAME, "must be a resource name: an optional DNS-subdomain prefix and '/', then at most 63 "
                  "letters, digits, '-', '_' or '.' (e.g. nvidia.com/gpu)", max_length=316, **more)


def label_map(what: str, max_properties: int = 64) -> msgspec.Meta:
    """A map of labels: keys and values as the API server checks them on a Node or Pod."""
    return crd(
        max_properties=max_properties,
        items=marker(max_length=63),
        rules=(
            Rule(f"self.all(k, size(k) <= 317 && k.matches(r'{LABEL_KEY}'))",
                 f"every key of {what} must be a label key: an optional DNS-subdomain prefix and '/', then at most "
                 "63 letters, digits, '-', '_' or '.' starting and ending with a letter or digit (e.g. "
                 "example.com/gpu-type)"),
            Rule(f"self.all(k, self[k].matches(r'{LABEL_VALUE}'))",
                 f"every value of {what} must be a label value: empty, or at most 63 letters, digits, '-', '_' or "
                 "'.' starting and ending with a letter or digit (e.g. h100)"),
        ),
    )
