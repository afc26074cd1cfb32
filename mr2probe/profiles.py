"""Training-set profiles: which training rows a run keeps (protocol.md, "Splits"). Val and test are never touched.

Text forms (``parse_profile``):

- ``full`` — every training row (the default).
- ``longtail:RHO`` — exponential long tail over a seeded class order (CIFAR-LT / ImageNet-LT convention), drawn
  again for every episode, so that rarity is not tied to one set of classes; ``longtail:RHO,order=fixed`` keeps
  episode 0's order for every episode (**[choice]**: the default is a class order per episode). The
  class of rank r = 0 … K−1 keeps ``n_r = min(a_c, max(1, ⌊n_max · RHO^(−r/(K−1))⌋))`` rows, where a_c is the
  number of rows class c has and ``n_max = max_c a_c`` (on a balanced set: the per-class count, as CIFAR-LT). A
  class with fewer rows than its quota keeps all it has. RHO ≥ 1 is real; K = 1 keeps n_max.
- ``shots:N`` — N rows of every class; each of E episodes is an independent draw (episodes may overlap). N
  larger than the smallest class is a :class:`UserError` naming that class and its count.
- ``fraction:F`` — ``min(a_c, ⌈F · a_c⌉)`` rows of every class, F ∈ (0, 1], so every non-empty class keeps ≥ 1.

``⌊·⌋`` and ``⌈·⌉`` are taken with a relative tolerance of 1e-9 so that products that are integers in exact
arithmetic (0.07 · 100, 500 · 100^−1) are not pushed to the next integer by floating-point rounding.

Seeds (all through :class:`numpy.random.SeedSequence`, so nearby seeds give unrelated streams):

- class order of episode e: ``default_rng(SeedSequence([seed, 1, e])).permutation(K)`` — rank r → class (with
  ``order=fixed``, e = 0 for every episode). ``SeedSequence([seed, 1, 0])`` equals ``SeedSequence([seed, 1])``, the
  one order every episode used before orders were drawn per episode, so a one-episode long tail keeps the rows it
  always had.
- rows of episode e: ``default_rng(draw_seed(seed, e))`` with
  ``draw_seed(seed, e) = SeedSequence([seed, 2, e]).generate_state(1, uint64)[0]``, an int that results record.
  The draw is one permutation of all rows, grouped by class (stable) and cut at each class's count, so for a
  fixed (seed, episode) smaller profiles keep subsets of larger ones (shots:1 ⊂ shots:5, fraction:0.1 ⊂ 0.5,
  longtail:100 ⊂ longtail:10 class by class).

Pure numpy; imports only :mod:`mr2probe.errors`.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import UserError

KINDS = ("full", "longtail", "shots", "fraction")
FORMS = "full, longtail:RHO[,order=fixed] (RHO ≥ 1), shots:N (N ≥ 1) or fraction:F (0 < F ≤ 1)"
ORDERS = ("episode", "fixed")  # longtail's class order: drawn per episode, or episode 0's for all
_ORDER_STREAM = 1  # SeedSequence([seed, _ORDER_STREAM]) → class order
_ROWS_STREAM = 2  # SeedSequence([seed, _ROWS_STREAM, episode]) → row draw
_TOL = 1e-9  # relative tolerance of ⌊·⌋ / ⌈·⌉


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _num(v: float) -> str:
    """Shortest exact text of a float: 100.0 → "100", 0.1 → "0.1"."""
    return str(int(v)) if v.is_integer() else repr(v)


def _is_real(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class Profile:
    """A training-set profile. ``value``: None (full), RHO float (longtail), N int (shots), F float (fraction).

    Construction validates and normalises (RHO, F → float; N → int), so equal profiles compare, hash and
    serialise equal whatever text they came from ("longtail:100" == "longtail:1e2")."""

    kind: str = "full"
    value: float | int | None = None
    episodes: int = 1
    seed: int = 0
    order: str = "episode"

    def __post_init__(self) -> None:
        kind, v = self.kind, self.value
        if kind not in KINDS:
            raise UserError(f"unknown training profile {kind!r}; use {FORMS}")
        if self.order not in ORDERS:
            raise UserError(f"order must be one of {', '.join(ORDERS)}, got {self.order!r}")
        if self.order != "episode" and kind != "longtail":
            raise UserError(f"order={self.order} applies to longtail:RHO only (the class order of the tail)")
        if kind == "full":
            if v is not None:
                raise UserError(f"the full training profile takes no value (got {v!r}); use 'full'")
        elif kind == "shots":
            if not (_is_int(v) or (isinstance(v, (float, np.floating)) and float(v).is_integer())) or v < 1:
                raise UserError(f"shots:N needs an integer N ≥ 1 training samples per class, got {v!r}")
            object.__setattr__(self, "value", int(v))
        else:
            if not _is_real(v) or not math.isfinite(float(v)):
                raise UserError(f"{kind} needs a finite number, got {v!r}; use {FORMS}")
            v = float(v)
            if kind == "longtail" and v < 1:
                raise UserError(f"longtail:RHO needs an imbalance ratio RHO ≥ 1 (head/tail count), got {v:g}")
            if kind == "fraction" and not 0 < v <= 1:
                raise UserError(f"fraction:F needs 0 < F ≤ 1 (the share of each class kept), got {v:g}")
            object.__setattr__(self, "value", v)
        if not _is_int(self.episodes) or self.episodes < 1:
            raise UserError(f"episodes must be an integer ≥ 1, got {self.episodes!r}")
        if kind == "full" and self.episodes != 1:
            raise UserError(f"the full training profile has one episode (every row), got episodes={self.episodes}; "
                            "use shots:N, fraction:F or longtail:RHO for repeated draws")
        if not _is_int(self.seed) or self.seed < 0:
            raise UserError(f"the profile seed must be an integer ≥ 0, got {self.seed!r}")
        object.__setattr__(self, "episodes", int(self.episodes))
        object.__setattr__(self, "seed", int(self.seed))

    @property
    def text(self) -> str:
        """The canonical text form, e.g. ``longtail:100``; ``parse_profile(p.text, p.episodes, p.seed) == p``."""
        if self.kind == "full":
            return "full"
        v = self.value
        text = f"{self.kind}:{v}" if self.kind == "shots" else f"{self.kind}:{_num(float(v))}"  # type: ignore[arg-type]
        return text + (f",order={self.order}" if self.order != "episode" else "")

    @property
    def class_orders(self) -> int | None:
        """How many class orders a long tail draws: one per episode, or 1 under ``order=fixed`` or with one
        episode (then rarity stays with the same classes in every replicate); None for the other kinds."""
        if self.kind != "longtail":
            return None
        return 1 if self.order == "fixed" else self.episodes

    def describe(self) -> str:
        """Human-readable, e.g. ``longtail ρ=100, one class order (seed 0)``, ``longtail ρ=100 × 5 episodes,
        5 class orders (seed 0)``, ``shots 5 × 10 episodes (seed 0)``."""
        if self.kind == "full":
            return "full training set"
        eps = f" × {self.episodes} episodes" if self.episodes > 1 else ""
        label = {"longtail": f"longtail ρ={self.value:g}", "shots": f"shots {self.value}",
                 "fraction": f"fraction {self.value:g}"}[self.kind]
        orders = {None: "", 1: ", one class order"}.get(self.class_orders, f", {self.class_orders} class orders")
        return f"{label}{eps}{orders} (seed {self.seed})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-able: kind, value, episodes, seed, the canonical text, and ``order`` when it is not the default
        (so records and run identities of profiles made before the setting existed are unchanged)."""
        d = {"kind": self.kind, "value": self.value, "episodes": self.episodes, "seed": self.seed, "text": self.text}
        return d | ({"order": self.order} if self.order != "episode" else {})


def parse_profile(text: str, episodes: int = 1, seed: int = 0) -> Profile:
    """``full`` | ``longtail:RHO[,order=episode|fixed]`` | ``shots:N`` | ``fraction:F`` → :class:`Profile`;
    anything else → UserError."""
    raw = str(text).strip()
    head, *opts = raw.split(",")
    order = "episode"
    for opt in opts:
        key, eq, val = (p.strip() for p in opt.partition("="))
        if key != "order" or not eq:
            raise UserError(f"training profile {raw!r}: unknown option {opt.strip()!r}; use {FORMS}")
        order = val.lower()
    kind, sep, val = head.partition(":")
    kind, val = kind.strip().lower(), val.strip()
    if kind not in KINDS:
        raise UserError(f"unknown training profile {raw!r}; use {FORMS}")
    if kind == "full":
        if sep:
            raise UserError(f"the full training profile takes no value (got {raw!r}); use 'full'")
        return Profile("full", None, episodes, seed, order)
    if not val:
        raise UserError(f"training profile {raw!r} needs a value; use {FORMS}")
    try:
        value: float | int = int(val) if kind == "shots" else float(val)
    except ValueError:
        what = "an integer N ≥ 1" if kind == "shots" else "a number"
        raise UserError(f"training profile {raw!r}: {val!r} is not {what}; use {FORMS}") from None
    return Profile(kind, value, episodes, seed, order)


def class_order(num_classes: int, seed: int, episode: int = 0) -> np.ndarray:
    """The seeded class order of longtail in ``episode``: ``order[r]`` is the class of rank r (rank 0 = head),
    ``default_rng(SeedSequence([seed, 1, episode])).permutation(K)``."""
    if num_classes < 0:
        raise ValueError(f"num_classes must be ≥ 0, got {num_classes}")
    if episode < 0:
        raise ValueError(f"episode must be ≥ 0, got {episode}")
    ss = np.random.SeedSequence([int(seed), _ORDER_STREAM, int(episode)])
    return np.random.default_rng(ss).permutation(num_classes)


def draw_seed(seed: int, episode: int) -> int:
    """The integer seed of episode ``episode``'s row draw: ``SeedSequence([seed, 2, episode])`` → uint64."""
    if episode < 0:
        raise ValueError(f"episode must be ≥ 0, got {episode}")
    ss = np.random.SeedSequence([int(seed), _ROWS_STREAM, int(episode)])
    return int(ss.generate_state(1, np.uint64)[0])


def longtail_quota(n_max: int, num_classes: int, rho: float) -> np.ndarray:
    """Per-rank quota ``max(1, ⌊n_max · ρ^(−r/(K−1))⌋)`` for r = 0 … K−1 (before capping at availability)."""
    r = np.arange(num_classes, dtype=np.float64)
    expo = r / (num_classes - 1) if num_classes > 1 else r
    x = n_max * np.power(float(rho), -expo)
    return np.maximum(1, np.floor(x * (1 + _TOL))).astype(np.int64)


def _class_label(c: int, class_names: Sequence[str] | None) -> str:
    if class_names is not None and 0 <= c < len(class_names):
        return f"{c} ({class_names[c]!r})"
    return str(c)


def kept_counts(available: np.ndarray, profile: Profile,
                class_names: Sequence[str] | None = None, episode: int = 0) -> np.ndarray:
    """Rows kept per class (int64, length K) in ``episode`` from the rows ``available`` per class; formulas in the
    module doc (only longtail depends on the episode, through its class order).

    shots:N with N > min(available) → UserError naming the smallest class and its count."""
    a = np.asarray(available, dtype=np.int64)
    if a.ndim != 1 or (a < 0).any():
        raise ValueError("available must be a 1-D array of counts ≥ 0")
    k = len(a)
    if profile.kind == "full" or k == 0:
        return a.copy()
    if profile.kind == "shots":
        n = int(profile.value)  # type: ignore[arg-type]
        c = int(np.argmin(a))
        if a[c] < n:
            raise UserError(f"shots:{n} needs {n} training samples per class, but class "
                            f"{_class_label(c, class_names)} has only {a[c]}; use shots:{a[c]} or fewer"
                            if a[c] > 0 else
                            f"shots:{n} needs {n} training samples per class, but class "
                            f"{_class_label(c, class_names)} has none in the training split")
        return np.full(k, n, dtype=np.int64)
    if profile.kind == "fraction":
        x = float(profile.value) * a  # type: ignore[arg-type]
        return np.minimum(a, np.ceil(x * (1 - _TOL))).astype(np.int64)
    # longtail
    quota = longtail_quota(int(a.max()), k, float(profile.value))  # type: ignore[arg-type]
    out = np.empty(k, dtype=np.int64)
    e = episode if profile.order == "episode" else 0
    out[class_order(k, profile.seed, e)] = quota  # class order[r] gets quota[r]
    return np.minimum(a, out)


def select_rows(y: np.ndarray, profile: Profile, episode: int = 0, num_classes: int | None = None,
                class_names: Sequence[str] | None = None) -> np.ndarray:
    """Sorted, unique positions into ``y`` (training labels 0 … K−1) kept for training in ``episode``.

    K = ``num_classes`` (classes absent from y count: they take a longtail rank and fail shots), else
    ``max(y) + 1``. Within each class a seeded random subset (``draw_seed(profile.seed, episode)``)."""
    y = np.asarray(y)
    if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or y.size == 0):
        raise ValueError(f"labels must be a 1-D integer array, got shape {y.shape} dtype {y.dtype}")
    y = y.astype(np.int64, copy=False)
    if y.size and y.min() < 0:
        raise ValueError("labels must be ≥ 0")
    k = int(y.max()) + 1 if num_classes is None and y.size else int(num_classes or 0)
    if y.size and y.max() >= k:
        raise ValueError(f"label {int(y.max())} ≥ num_classes {k}")
    if not 0 <= episode < profile.episodes:
        raise ValueError(f"episode {episode} outside 0 … {profile.episodes - 1}")
    available = np.bincount(y, minlength=k)
    keep = kept_counts(available, profile, class_names, episode)
    if profile.kind == "full":
        return np.arange(len(y))
    rng = np.random.default_rng(draw_seed(profile.seed, episode))
    order = rng.permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]  # grouped by class, random within class
    cls = y[order]
    rank = np.arange(len(y)) - np.searchsorted(cls, cls, side="left")
    return np.sort(order[rank < keep[cls]])
