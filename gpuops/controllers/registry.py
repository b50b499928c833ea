"""The controllers `gpuops run` offers, in the order they start. Adding a controller means adding its
definition (its package's `settings.CONTROLLER`) here, and nothing else shared; see CONTRIBUTING.md."""

from __future__ import annotations

from gpuops.kube.registry import ControllerDefinition

from .autoprovision.settings import CONTROLLER as AUTOPROVISION
from .budget.settings import CONTROLLER as BUDGET
from .migslicer.settings import CONTROLLER as MIGSLICER
from .spotpool.settings import CONTROLLER as SPOTPOOL

__all__ = ["CONTROLLERS"]

CONTROLLERS: tuple[ControllerDefinition, ...] = (BUDGET, AUTOPROVISION, SPOTPOOL, MIGSLICER)
