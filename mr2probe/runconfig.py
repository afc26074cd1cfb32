"""The train stage's settings: :class:`ExperimentConfig` (what ``mr2probe train`` takes besides the probe and
trainer settings) and :func:`config_from_settings`, which builds it from :data:`~mr2probe.settings.TRAIN` values for
``mr2probe train``, a suite's cell and the estimators alike; the replicates (seed, episode) a config trains."""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from .errors import UserError
from .heads import ProbeConfig
from .methods import METHODS
from .probes import REFERENCE_PROBES, SELECT
from .profiles import Profile, parse_profile
from .settings import TRAIN, check_all, resolved
from .source import parse_size
from .trainer import TrainConfig, method_hparams

SELECT_METRICS = SELECT  # val score of the grid: overall or mean per-class accuracy (as the exact probes)


@dataclass
class ExperimentConfig:
    """Everything ``mr2probe train`` takes besides the probe/trainer settings; the defaults are the settings'
    (:data:`~mr2probe.settings.TRAIN`)."""

    features: Path
    out: Path
    methods: list[str] = field(default_factory=lambda: ["ce", "mr2"])
    seeds: list[int] = field(default_factory=lambda: [0, 1, 2])
    select: str = TRAIN["select"].default
    val_fraction: float = TRAIN["val_fraction"].default
    val_seed: int = 0
    reference: str = TRAIN["reference"].default
    null: bool = TRAIN["null"].default  # also train the reference on disjoint seeds (the null control, `null_seeds`)
    profile: Profile = field(default_factory=Profile)  # training-set profile (train only; val and test untouched)
    train: TrainConfig = field(default_factory=TrainConfig)
    max_memory: int | str = TRAIN["max_memory"].default  # feature memory cap: bytes, "512MB", … or "auto" (source.py)
    refit: bool = TRAIN["refit"].default  # selected heads trained again on train ∪ val (selection.refit_heads)

    @property
    def reference_method(self) -> str:
        """The method that defines the groups: ``reference`` when it is among the methods, else the first method."""
        return self.reference if self.reference in self.methods else self.methods[0]

    def check(self) -> None:
        """Every setting valid and consistent, else one :class:`UserError` (before anything is written)."""
        self.train.check()
        if not self.methods:
            raise UserError("--methods is empty; give comma-separated names (see `mr2probe methods`) or 'all'")
        for m in self.methods:
            self._check_method(m)
        stray = sorted(set(self.train.method_params) - set(self.methods))
        if stray:  # a typo'd or forgotten method would otherwise make the --set silently do nothing
            raise UserError(f"--set names {', '.join(stray)}, which is not in --methods ({', '.join(self.methods)})")
        if not self.seeds:
            raise UserError("--seeds must be ≥ 1")
        reference = self.reference_method
        if self.train.budget_rule == "reach-logreg" and reference in REFERENCE_PROBES:
            raise UserError(f"--budget-rule reach-logreg calibrates the reference's steps; the reference {reference} "
                            "is not trained in steps (pass --reference ce)")
        if self.refit and self.profile.kind != "full":
            raise UserError(f"--refit adds the val rows to the training rows, which the training profile "
                            f"{self.profile.describe()} fixes; drop --refit or use the full profile")
        check_all(TRAIN, {f.name: getattr(self, f.name) for f in fields(self)})  # select, val_fraction
        parse_size(self.max_memory)

    def _check_method(self, m: str) -> None:
        """Method ``m`` can run with these settings (an exact probe takes no --set; an adapter method needs one)."""
        if m in REFERENCE_PROBES:
            if m in self.train.method_params:
                raise UserError(f"--set {m}.…: the exact probes take no --set (their grid is chosen on val)")
            return
        if METHODS.get(m).needs_adapter and self.train.probe.adapter == "none":
            raise UserError(f"method {m!r} needs a trainable adapter: pass --adapter linear or mlp")
        method_hparams(m, self.train)  # unknown or invalid --set values: refused before anything is written


TRAIN_CONFIG_SETTINGS = ("epochs", "batch_size", "lr", "wd", "l2", "min_steps", "budget_rule", "max_steps", "search",
                         "scale", "method_grid", "device", "compile", "cuda_graph", "tf32",
                         "log")
"""The settings that are :class:`TrainConfig` fields, under their own names."""


def train_config(v: dict[str, Any], probe: ProbeConfig, method_params: dict[str, dict[str, Any]] | None,
                 progress: bool) -> TrainConfig:
    """The :class:`TrainConfig` of resolved settings ``v`` (grids as tuples)."""
    given = {n: tuple(v[n]) if TRAIN[n].kind == "floats" else v[n] for n in TRAIN_CONFIG_SETTINGS}
    return TrainConfig(**given, method_params={m: dict(p) for m, p in (method_params or {}).items()}, probe=probe,
                       progress=progress)


def config_from_settings(features: Path, out: Path, methods: list[str], seeds: list[int], head: str = "linear",
                         adapter: str = "none", values: dict[str, Any] | None = None,
                         method_params: dict[str, dict[str, Any]] | None = None, profile: str = "full",
                         progress: bool = True) -> ExperimentConfig:
    """The ``ExperimentConfig`` of ``mr2probe train`` and of one suite cell, from :data:`~mr2probe.settings.TRAIN`
    values (name → value; missing ones take their defaults; grids as tuples). The report's settings
    (:data:`~mr2probe.settings.REPORT`) are not part of it."""
    v = resolved(values or {})
    probe = ProbeConfig(head=head, adapter=adapter, width=v["width"], scale=v["scale"][0] if v["scale"] else 16.0,
                        learn_scale=v["learn_scale"])
    return ExperimentConfig(features=Path(features), out=Path(out), methods=list(methods), seeds=list(seeds),
                            select=v["select"], val_fraction=v["val_fraction"], reference=v["reference"],
                            null=v["null"], refit=v["refit"], train=train_config(v, probe, method_params, progress),
                            max_memory=parse_size(v["max_memory"]),
                            profile=parse_profile(profile, v["episodes"], v["profile_seed"]))


def replicates(cfg: ExperimentConfig) -> list[tuple[int, int]]:
    """(seed, episode) of every stack: each seed once per episode of the training profile. With E > 1 episodes the
    seeds of episode e are shifted by e·(max seed + 1), so every stack has its own seed (init and data order) and
    the table averages over all E × S of them like seeds."""
    stride = max(cfg.seeds) + 1
    return [(s + e * stride, e) for e in range(cfg.profile.episodes) for s in cfg.seeds]


def null_seeds(seeds: list[int]) -> list[int]:
    """The null control's seeds: as many as ``seeds``, disjoint from them (max + 1, max + 2, …; 0..N−1 → N..2N−1)."""
    return list(range(max(seeds) + 1, max(seeds) + 1 + len(seeds)))
