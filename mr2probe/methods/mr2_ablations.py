"""MR2 ablations as registry entries of their own (spec mr2.md, "Ablations that must be one flag away").

Each is MR2 with one default changed; everything else (statistics norm p, c̄ grid, λ and its adapter grid, τ,
``rep_scale`` mr2probe|reference, ``stats_on`` classifier|input, ``stats``) is MR2's and can be overridden with
``--set NAME.KEY=VALUE`` like any method (e.g. ``--set mr2_uniform.rep_scale=reference``).
"""
from __future__ import annotations

from typing import Any

from ._base import METHODS
from .mr2 import MR2


@METHODS.register("mr2_uniform", help="MR2 ablation: uniform logit margins γ_k = c̄ (uniform=True)")
class MR2Uniform(MR2):
    """MR2 with every γ_k = c̄: ℓ = CE(f(x)/c̄, y) + λ·ℓ_s̄ (no class-dependent margin)."""

    defaults: dict[str, Any] = {**MR2.defaults, "uniform": True}


@METHODS.register("mr2_no_rep", help="MR2 ablation: no representation margin term (λ = 0)")
class MR2NoRep(MR2):
    """MR2 with λ = 0: ℓ = CE(f(x)/γ_y, y) only (no λ grid, even with an adapter; ``rep_scale`` has no effect)."""

    defaults: dict[str, Any] = {**MR2.defaults, "lam": 0.0}
    adapter_grid: dict[str, list] = {}


@METHODS.register("mr2_sqrt", help="MR2 ablation: margins with exponent 1/2 instead of 1/3")
class MR2Sqrt(MR2):
    """MR2 with γ_k = c̄ · K · v_k^{1/2} / Σ_j v_j^{1/2}."""

    defaults: dict[str, Any] = {**MR2.defaults, "exponent": 0.5}


@METHODS.register("mr2_linear", help="MR2 ablation: margins with exponent 1 instead of 1/3")
class MR2Linear(MR2):
    """MR2 with γ_k = c̄ · K · v_k / Σ_j v_j."""

    defaults: dict[str, Any] = {**MR2.defaults, "exponent": 1.0}
