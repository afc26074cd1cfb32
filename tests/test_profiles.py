"""Training-set profiles (mr2probe/profiles.py; protocol.md "Splits"): counts per class follow the formulas,
rows are sorted unique subsets drawn deterministically from the seed, bad values are one-line UserErrors."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mr2probe.errors import UserError
from mr2probe.profiles import (
    Profile,
    class_order,
    draw_seed,
    kept_counts,
    longtail_quota,
    parse_profile,
    select_rows,
)

FAST = {"max_examples": 60, "deadline": None, "derandomize": True}
# the forms, spelled out
USE = "use full, longtail:RHO[,order=fixed] (RHO ≥ 1), shots:N (N ≥ 1) or fraction:F (0 < F ≤ 1)"


def balanced(k: int, n: int, seed: int = 0) -> np.ndarray:
    """k classes × n rows each, shuffled (so positions are not grouped by class)."""
    return np.random.default_rng(seed).permutation(np.repeat(np.arange(k), n))


def per_class(y: np.ndarray, rows: np.ndarray, k: int) -> np.ndarray:
    return np.bincount(y[rows], minlength=k)


def check_rows(rows: np.ndarray, n: int) -> None:
    assert rows.ndim == 1 and np.issubdtype(rows.dtype, np.integer)
    assert np.all(np.diff(rows) > 0), "sorted and unique"
    assert rows.size == 0 or (rows[0] >= 0 and rows[-1] < n)


# ---------------------------------------------------------------- longtail

def test_longtail_hand_computed_k3():
    """K = 3, 100 per class, ρ = 100: ranks keep 100, 100·100^(−1/2) = 10, 100·100^(−1) = 1 in the seeded order."""
    y = balanced(3, 100)
    p = parse_profile("longtail:100", seed=0)
    order = class_order(3, 0)
    rows = select_rows(y, p)
    check_rows(rows, len(y))
    counts = per_class(y, rows, 3)
    assert counts[order].tolist() == [100, 10, 1]
    assert kept_counts(np.bincount(y), p)[order].tolist() == [100, 10, 1]


def test_longtail_quota_formula_k5():
    """ρ = 16, K = 5, n_max = 160: 160·16^(−r/4) = 160, 80, 40, 20, 10."""
    assert longtail_quota(160, 5, 16.0).tolist() == [160, 80, 40, 20, 10]
    assert longtail_quota(7, 1, 100.0).tolist() == [7]  # K = 1: the head only
    assert longtail_quota(3, 4, 1000.0).tolist() == [3, 1, 1, 1]  # ⌊0.3⌋ → at least 1


@pytest.mark.parametrize("k,n,rho,total", [(10, 5000, 100, 12406), (10, 5000, 50, 13996), (10, 5000, 10, 20431),
                                           (100, 500, 100, 10847), (100, 500, 50, 12608), (100, 500, 10, 19573)])
def test_longtail_matches_cifar_lt_totals(k, n, rho, total):
    """The published CIFAR-10-LT / CIFAR-100-LT training-set sizes."""
    counts = kept_counts(np.full(k, n), parse_profile(f"longtail:{rho}"))
    assert counts.sum() == total
    assert sorted(counts.tolist(), reverse=True)[:2] == [n, int(n * rho ** (-1 / (k - 1)))]


def test_longtail_n_max_is_largest_class_and_short_classes_keep_all():
    """n_max = max available; a class below its quota keeps everything it has."""
    order = class_order(3, 0)
    avail = np.zeros(3, dtype=int)
    avail[order] = [50, 5, 100]  # rank 0 has only 50 (< quota 100); rank 1 has 5 (< 10); rank 2 has 100 (> 1)
    y = np.random.default_rng(1).permutation(np.repeat(np.arange(3), avail))
    counts = per_class(y, select_rows(y, parse_profile("longtail:100")), 3)
    assert counts[order].tolist() == [50, 5, 1]


def test_longtail_rho_1_keeps_everything_on_balanced_data():
    y = balanced(4, 30)
    assert np.array_equal(select_rows(y, parse_profile("longtail:1")), np.arange(len(y)))


def test_longtail_absent_class_takes_a_rank():
    """With num_classes, a class missing from y still takes its rank (and keeps 0)."""
    y = np.repeat([0, 1, 2], 100)
    p = parse_profile("longtail:100", seed=3)
    counts = per_class(y, select_rows(y, p, num_classes=4), 4)
    order = class_order(4, 3)
    expect = np.empty(4, dtype=np.int64)
    expect[order] = np.minimum(np.bincount(y, minlength=4)[order], longtail_quota(100, 4, 100.0))
    assert counts.tolist() == expect.tolist()
    assert counts[3] == 0


def test_class_order_is_a_seeded_permutation():
    a, b = class_order(10, 0), class_order(10, 1)
    assert sorted(a.tolist()) == list(range(10)) and sorted(b.tolist()) == list(range(10))
    assert np.array_equal(a, class_order(10, 0))
    assert not np.array_equal(a, b)
    assert len({tuple(class_order(10, s)) for s in range(20)}) == 20
    assert class_order(0, 0).size == 0


def test_longtail_order_follows_seed():
    y = balanced(10, 50)
    c0 = per_class(y, select_rows(y, parse_profile("longtail:10", seed=0)), 10)
    c1 = per_class(y, select_rows(y, parse_profile("longtail:10", seed=1)), 10)
    assert sorted(c0.tolist()) == sorted(c1.tolist()) and not np.array_equal(c0, c1)
    assert int(np.argmax(c0)) == class_order(10, 0)[0] and int(np.argmax(c1)) == class_order(10, 1)[0]


# ---------------------------------------------------------------- shots

def test_longtail_class_order_is_drawn_per_episode():
    """5 episodes of longtail:100 rank the classes in 5 different orders, each a function of (seed, episode) only,
    and every episode's counts are the ρ-quota in its own order."""
    k, n, rho = 10, 50, 100
    y = balanced(k, n)
    p = parse_profile(f"longtail:{rho}", episodes=5, seed=0)
    quota = longtail_quota(n, k, rho)
    counts = [per_class(y, select_rows(y, p, episode=e), k) for e in range(5)]
    orders = {tuple(np.argsort(-c, kind="stable")) for c in counts}
    assert len(orders) == 5, "a different class order per episode"
    for e, c in enumerate(counts):
        assert np.array_equal(c[class_order(k, 0, e)], quota), "counts follow ρ in the episode's order"
        assert np.array_equal(per_class(y, select_rows(y, parse_profile(f"longtail:{rho}", 5, 0), episode=e), k), c)
    assert not np.array_equal(per_class(y, select_rows(y, parse_profile("longtail:100", 5, 1), episode=1), k),
                              counts[1]), "another seed, another order"


def test_longtail_episode_0_and_order_fixed_keep_the_one_order_of_before():
    """Episode 0's order is SeedSequence([seed, 1]), the order every episode had before orders were drawn per
    episode; order=fixed keeps it for every episode (rows still drawn per episode)."""
    k, n = 10, 50
    y = balanced(k, n)
    before = np.random.default_rng(np.random.SeedSequence([3, 1])).permutation(k)
    assert np.array_equal(class_order(k, 3, 0), before) and np.array_equal(class_order(k, 3), before)
    fixed = parse_profile("longtail:100,order=fixed", episodes=5, seed=3)
    quota = longtail_quota(n, k, 100)
    for e in range(5):
        assert np.array_equal(kept_counts(np.full(k, n), fixed, episode=e)[before], quota)
    rows = [select_rows(y, fixed, episode=e) for e in range(2)]
    assert not np.array_equal(rows[0], rows[1]), "rows are drawn per episode"
    one = parse_profile("longtail:100", episodes=1, seed=3)
    assert np.array_equal(select_rows(y, one), select_rows(y, fixed)), "one episode: the same rows either way"


def test_order_option_text_and_record():
    p = parse_profile(" longtail:1e2 , order = FIXED ", episodes=5)
    assert p.order == "fixed" and p.text == "longtail:100,order=fixed"
    assert p.as_dict()["order"] == "fixed" and "one class order" in p.describe()
    q = parse_profile("longtail:100", episodes=5)
    assert "order" not in q.as_dict(), "the default leaves records of runs made before the option unchanged"
    assert q.text == "longtail:100" and q != p
    assert parse_profile("longtail:100,order=episode", episodes=5) == q


def test_shots_exactly_n_per_class_and_episodes():
    y = balanced(5, 40)
    p = parse_profile("shots:3", episodes=4, seed=7)
    draws = [select_rows(y, p, episode=e) for e in range(4)]
    for rows in draws:
        check_rows(rows, len(y))
        assert per_class(y, rows, 5).tolist() == [3] * 5
    assert len({tuple(r) for r in draws}) == 4, "different episodes differ"
    for e in range(4):
        assert np.array_equal(select_rows(y, p, episode=e), draws[e]), "same episode, same rows"
    other = parse_profile("shots:3", episodes=4, seed=8)
    assert not np.array_equal(select_rows(y, other, episode=0), draws[0]), "seed changes the draw"


def test_shots_n_equal_to_smallest_class_keeps_all_of_it():
    y = np.repeat([0, 1, 2], [4, 9, 6])
    rows = select_rows(y, parse_profile("shots:4"))
    assert per_class(y, rows, 3).tolist() == [4, 4, 4]
    assert set(np.flatnonzero(y == 0)) <= set(rows.tolist())


def test_shots_too_many_names_the_class():
    y = np.repeat([0, 1, 2], [10, 2, 6])
    with pytest.raises(UserError) as e:
        select_rows(y, parse_profile("shots:5"))
    msg = str(e.value)
    assert msg == "shots:5 needs 5 training samples per class, but class 1 has only 2; use shots:2 or fewer"
    with pytest.raises(UserError, match=r"class 1 \('cat'\) has only 2"):
        select_rows(y, parse_profile("shots:5"), class_names=["dog", "cat", "bird"])
    with pytest.raises(UserError) as e:
        select_rows(y, parse_profile("shots:1"), num_classes=4)
    assert str(e.value) == "shots:1 needs 1 training samples per class, but class 3 has none in the training split"


def test_episode_out_of_range_is_a_bug():
    with pytest.raises(ValueError):
        select_rows(balanced(2, 5), parse_profile("shots:1", episodes=2), episode=2)


def test_draw_seed_is_a_deterministic_int():
    assert draw_seed(0, 0) == draw_seed(0, 0)
    assert len({draw_seed(s, e) for s in range(5) for e in range(5)}) == 25
    # the recorded int reproduces the draw on its own
    y = balanced(3, 10)
    rows = select_rows(y, parse_profile("shots:2", episodes=3, seed=4), episode=2)
    order = np.random.default_rng(draw_seed(4, 2)).permutation(len(y))
    order = order[np.argsort(y[order], kind="stable")]
    expect = np.sort(np.concatenate([order[y[order] == c][:2] for c in range(3)]))
    assert np.array_equal(rows, expect)


# ---------------------------------------------------------------- fraction / full

@pytest.mark.parametrize("f,avail,expect", [(0.1, [100, 35, 3, 1], [10, 4, 1, 1]),
                                            (0.07, [100, 200, 15], [7, 14, 2]),  # 0.07·100 is 7.000…01
                                            (0.5, [9, 10, 1], [5, 5, 1]),
                                            (1.0, [3, 8, 2], [3, 8, 2])])
def test_fraction_keeps_ceil_per_class(f, avail, expect):
    y = np.random.default_rng(0).permutation(np.repeat(np.arange(len(avail)), avail))
    rows = select_rows(y, parse_profile(f"fraction:{f}"))
    check_rows(rows, len(y))
    assert per_class(y, rows, len(avail)).tolist() == expect


def test_full_keeps_everything():
    y = balanced(3, 7)
    assert np.array_equal(select_rows(y, parse_profile("full")), np.arange(len(y)))
    assert np.array_equal(select_rows(y, Profile()), np.arange(len(y)))
    assert select_rows(np.zeros(0, dtype=np.int64), Profile()).size == 0


def test_smaller_profiles_are_subsets_of_larger_ones():
    """One permutation per (seed, episode), cut per class: shots:1 ⊂ shots:4, fraction:0.2 ⊂ 0.6."""
    y = balanced(4, 25)
    assert set(select_rows(y, parse_profile("shots:1"))) <= set(select_rows(y, parse_profile("shots:4")))
    assert set(select_rows(y, parse_profile("fraction:0.2"))) <= set(select_rows(y, parse_profile("fraction:0.6")))


# ---------------------------------------------------------------- parsing and serialisation

def test_parse_and_describe():
    p = parse_profile("longtail:100")
    assert (p.kind, p.value, p.episodes, p.seed) == ("longtail", 100.0, 1, 0)
    assert p.describe() == "longtail ρ=100, one class order (seed 0)"
    five = parse_profile("longtail:100", episodes=5)
    assert five.describe() == "longtail ρ=100 × 5 episodes, 5 class orders (seed 0)" and five.class_orders == 5
    fixed = parse_profile("longtail:100,order=fixed", episodes=5)
    assert fixed.describe() == "longtail ρ=100 × 5 episodes, one class order (seed 0)" and fixed.class_orders == 1
    assert parse_profile("shots:5", episodes=5).class_orders is None
    assert parse_profile("shots:5", episodes=10, seed=2).describe() == "shots 5 × 10 episodes (seed 2)"
    assert parse_profile("fraction:0.1").describe() == "fraction 0.1 (seed 0)"
    assert parse_profile(" Full ").describe() == "full training set"
    assert parse_profile("longtail:1e2") == p and hash(parse_profile("longtail:100.0")) == hash(p)
    assert isinstance(parse_profile("shots:5").value, int)


@pytest.mark.parametrize("text", ["full", "longtail:100", "longtail:2.5", "shots:5", "fraction:0.1",
                                  "fraction:1", "fraction:0.07", "longtail:100,order=fixed"])
def test_as_dict_is_json_and_round_trips(text):
    p = parse_profile(text, episodes=1 if text == "full" else 3, seed=5)
    d = json.loads(json.dumps(p.as_dict()))
    assert d == p.as_dict() and d["text"] == text
    assert parse_profile(d["text"], d["episodes"], d["seed"]) == p
    assert Profile(d["kind"], d["value"], d["episodes"], d["seed"], d.get("order", "episode")) == p


@pytest.mark.parametrize("text,episodes,seed,message", [
    ("longtail:0.5", 1, 0, "longtail:RHO needs an imbalance ratio RHO ≥ 1 (head/tail count), got 0.5"),
    ("longtail:-3", 1, 0, "longtail:RHO needs an imbalance ratio RHO ≥ 1 (head/tail count), got -3"),
    ("longtail:inf", 1, 0, f"longtail needs a finite number, got inf; {USE}"),
    ("longtail:nan", 1, 0, f"longtail needs a finite number, got nan; {USE}"),
    ("longtail:abc", 1, 0, f"training profile 'longtail:abc': 'abc' is not a number; {USE}"),
    ("shots:0", 1, 0, "shots:N needs an integer N ≥ 1 training samples per class, got 0"),
    ("shots:-2", 1, 0, "shots:N needs an integer N ≥ 1 training samples per class, got -2"),
    ("shots:2.5", 1, 0, f"training profile 'shots:2.5': '2.5' is not an integer N ≥ 1; {USE}"),
    ("fraction:0", 1, 0, "fraction:F needs 0 < F ≤ 1 (the share of each class kept), got 0"),
    ("fraction:1.5", 1, 0, "fraction:F needs 0 < F ≤ 1 (the share of each class kept), got 1.5"),
    ("fraction:-0.1", 1, 0, "fraction:F needs 0 < F ≤ 1 (the share of each class kept), got -0.1"),
    ("fraction:", 1, 0, f"training profile 'fraction:' needs a value; {USE}"),
    ("shots", 1, 0, f"training profile 'shots' needs a value; {USE}"),
    ("balanced:3", 1, 0, f"unknown training profile 'balanced:3'; {USE}"),
    ("", 1, 0, f"unknown training profile ''; {USE}"),
    ("full:1", 1, 0, "the full training profile takes no value (got 'full:1'); use 'full'"),
    ("shots:5", 0, 0, "episodes must be an integer ≥ 1, got 0"),
    ("fraction:0.5", -1, 0, "episodes must be an integer ≥ 1, got -1"),
    ("full", 3, 0, ("the full training profile has one episode (every row), got episodes=3; use shots:N, "
                    "fraction:F or longtail:RHO for repeated draws")),
    ("shots:5", 1, -1, "the profile seed must be an integer ≥ 0, got -1"),
    ("longtail:100,order=random", 1, 0, "order must be one of episode, fixed, got 'random'"),
    ("longtail:100,sort=fixed", 1, 0,
     f"training profile 'longtail:100,sort=fixed': unknown option 'sort=fixed'; {USE}"),
    ("shots:5,order=fixed", 5, 0, "order=fixed applies to longtail:RHO only (the class order of the tail)"),
])
def test_bad_values_are_one_line_user_errors(text, episodes, seed, message):
    with pytest.raises(UserError) as e:
        parse_profile(text, episodes=episodes, seed=seed)
    assert str(e.value) == message
    assert "\n" not in str(e.value)


def test_direct_construction_is_validated():
    for args in [("nope", 1), ("shots", True), ("shots", "5"), ("longtail", None), ("fraction", 2.0),
                 ("full", 1.0)]:
        with pytest.raises(UserError):
            Profile(*args)
    with pytest.raises(UserError):
        Profile("shots", 5, episodes=1.5)  # type: ignore[arg-type]
    assert Profile("shots", 5.0).value == 5 and isinstance(Profile("shots", 5.0).value, int)


# ---------------------------------------------------------------- properties

labels = st.lists(st.integers(0, 7), min_size=1, max_size=300).map(lambda v: np.asarray(v, dtype=np.int64))


@settings(**FAST)
@given(y=labels, rho=st.floats(1, 1e4), seed=st.integers(0, 2**32), extra=st.integers(0, 2))
def test_property_longtail(y, rho, seed, extra):
    k = int(y.max()) + 1 + extra
    p = Profile("longtail", rho, seed=seed)
    rows = select_rows(y, p, num_classes=k)
    check_rows(rows, len(y))
    avail, counts = np.bincount(y, minlength=k), per_class(y, rows, k)
    assert np.all(counts <= avail)
    assert np.all(counts[avail > 0] >= 1)
    assert np.array_equal(counts, kept_counts(avail, p))
    quota = longtail_quota(int(avail.max()), k, rho)
    assert np.array_equal(counts[class_order(k, seed)], np.minimum(avail[class_order(k, seed)], quota))
    assert np.all(np.diff(quota) <= 0) and quota[0] == avail.max()
    assert np.array_equal(rows, select_rows(y, p, num_classes=k)), "deterministic"


@settings(**FAST)
@given(y=labels, f=st.floats(1e-6, 1), seed=st.integers(0, 2**32))
def test_property_fraction(y, f, seed):
    p = Profile("fraction", f, seed=seed)
    rows = select_rows(y, p)
    check_rows(rows, len(y))
    avail = np.bincount(y)
    counts = per_class(y, rows, len(avail))
    assert np.all(counts <= avail) and np.all(counts[avail > 0] >= 1)
    assert np.all(counts >= np.floor(f * avail)) and np.all(counts <= np.ceil(f * avail))


@settings(**FAST)
@given(y=labels, n=st.integers(1, 50), episodes=st.integers(1, 3), seed=st.integers(0, 2**32))
def test_property_shots(y, n, episodes, seed):
    k = int(y.max()) + 1
    avail = np.bincount(y, minlength=k)
    p = Profile("shots", n, episodes=episodes, seed=seed)
    if n > avail.min():
        with pytest.raises(UserError, match=rf"^shots:{n} needs {n} training samples per class, but class "
                                            rf"{int(np.argmin(avail))} has "):
            select_rows(y, p)
        return
    for e in range(episodes):
        rows = select_rows(y, p, episode=e)
        check_rows(rows, len(y))
        assert per_class(y, rows, k).tolist() == [n] * k


def test_vectorised_on_a_large_set_is_fast():
    """1M labels, 1000 classes: no per-sample Python loop (well under a second; the bound is loose)."""
    y = np.random.default_rng(0).integers(0, 1000, size=1_000_000)
    t = time.perf_counter()
    rows = select_rows(y, parse_profile("longtail:100"))
    assert time.perf_counter() - t < 5
    assert np.array_equal(per_class(y, rows, 1000), kept_counts(np.bincount(y, minlength=1000),
                                                                parse_profile("longtail:100")))


def test_layering_imports_only_errors_and_numpy():
    """profiles sits below experiment: importing it pulls in no other mr2probe module, no torch, no h5py."""
    import subprocess
    import sys
    code = ("import sys, mr2probe.profiles; "
            "print(sorted(m for m in sys.modules if m.startswith('mr2probe')), 'torch' in sys.modules, "
            "'h5py' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "['mr2probe', 'mr2probe.errors', 'mr2probe.profiles'] False False"


def test_tables_name_a_recorded_long_tail_s_class_orders():
    """Runs recorded before the class orders were named read in today's words; an unparsable record keeps its text."""
    from mr2probe.summary import described
    old = {"kind": "longtail", "value": 100.0, "episodes": 1, "seed": 0, "text": "longtail:100",
           "describe": "longtail ρ=100 (seed 0)"}
    assert described(old) == "longtail ρ=100, one class order (seed 0)"
    assert described(old | {"episodes": 5}) == "longtail ρ=100 × 5 episodes, 5 class orders (seed 0)"
    assert described({"kind": "odd", "text": "odd:1", "describe": "as recorded"}) == "as recorded"
