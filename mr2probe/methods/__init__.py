"""Method registry: ``METHODS.get("mr2")``, ``METHODS.names()``; one file per method (or family)."""
from __future__ import annotations

from .. import plugins
from ._base import (METHODS, Auxiliary, Batch, ClassStatsKey, FitContext, FitData, FitSchedule, HeadsView, Method,
                    SharedKey, SharedStats, per_head_ce, resolve_methods)

plugins.import_all(__import__(__name__, fromlist=["_"]))

__all__ = ["METHODS", "Auxiliary", "Batch", "ClassStatsKey", "FitContext", "FitData", "FitSchedule", "HeadsView",
           "Method", "SharedKey", "SharedStats", "per_head_ce", "resolve_methods"]
