"""Typed errors for bad input: each names the argument or field at fault and what would be valid."""

from __future__ import annotations


class AccountingError(ValueError):
    """Base of every error this package raises for bad input."""


class QuantityError(AccountingError):
    """A Kubernetes quantity that Kubernetes itself would reject (syntax, unknown suffix, range)."""


class NegativeValueError(AccountingError):
    """A count, size, duration or quantity below zero where only non-negative values make sense."""


class IntervalError(AccountingError):
    """A usage interval that ends before it starts, or a window that is not positive."""


class UnknownGPUModelError(AccountingError):
    """A GPU model with no MIG geometry in our tables."""


class ProfileError(AccountingError):
    """A malformed MIG profile name, or one the GPU model does not offer."""


class PlacementError(AccountingError):
    """A MIG slice that cannot be placed or released as asked (overlap, out of range, not allocated)."""
