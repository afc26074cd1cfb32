"""The report plots at scale: K = 10, 100 and 1000 classes with 20 methods (reference, null control and 18
others; synthetic per-class accuracies, no predictions): every PNG is written, valid and of sane size, every
method has its own (colour, marker), and the figures say how the groups were ranked and what the error bars are."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from mr2probe import plots
from mr2probe.metrics import null_name
from mr2probe.summary import summarize

OTHERS = ["mr2", "mr2_uniform", "mr2_sqrt", "mr2_linear", "mr2_no_rep", "focal", "ldam", "cdb", "eql", "jtt", "lff",
          "fair_dro", "group_dro", "logit_adjust", "balanced_softmax", "class_balanced", "label_smoothing",
          "supcon"]
METHODS = ["ce", null_name("ce")] + OTHERS  # 20 methods
PNGS = ("per_class.png", "groups.png", "variability.png", "tradeoff.png")


def synthetic_results(k: int, methods: list[str] = METHODS, seeds: int = 3, seed: int = 0) -> dict:
    """A results.json dict: per method and seed, per_class_acc and val_per_class_acc (+ MR2 variability)."""
    rng = np.random.default_rng(seed)
    base = rng.beta(6, 2, size=k)  # the reference's true per-class accuracy
    runs = []
    for j, method in enumerate(methods):
        effect = 0.0 if j < 2 else rng.normal(0, 0.02) + rng.normal(0.01, 0.01) * (base < np.median(base))
        for sd in range(seeds):
            test = np.clip(base + effect + rng.normal(0, 0.01, k), 0, 1)
            run = {"method": method, "seed": sd + (100 if j == 1 else 0), "hparams": {},
                   "per_class_acc": test.tolist(),
                   "val_per_class_acc": np.clip(base + effect + rng.normal(0, 0.02, k), 0, 1).tolist()}
            if method.startswith("mr2"):
                v = 1 - base + rng.normal(0, 0.05, k)
                run |= {"variability": v.tolist(), "margins": np.abs(v).tolist()}
            runs.append(run)
    return {"class_names": [f"class {i}" for i in range(k)], "test_class_counts": [20] * k, "reference": "ce",
            "head": "linear", "adapter": "none", "provenance": {"encoder": "synth_enc", "dataset": f"synth{k}"},
            "runs": runs}


def test_method_styles_unique_for_20_methods() -> None:
    s = summarize(synthetic_results(10))
    assert len(s.methods) == 20 and s.null == "ce (null)"
    styles = plots.method_styles(s)
    assert set(styles) == set(s.methods)
    assert len(set(styles.values())) == 20, styles
    assert styles["ce"] == plots.REFERENCE_STYLE and styles["ce (null)"] == plots.NULL_STYLE
    grey = {c for c, _ in (plots.REFERENCE_STYLE, plots.NULL_STYLE)}
    assert not grey & {c for m, (c, _) in styles.items() if m not in ("ce", "ce (null)")}
    assert plots.method_colours(s) == {m: c for m, (c, _) in styles.items()}
    # well past 20: 60 other methods still get 60 distinct pairs, none taking the reference's or the null's
    many = summarize(synthetic_results(4, ["ce"] + [f"m{i}" for i in range(60)], seeds=1))
    assert len(set(plots.method_styles(many).values())) == 61


@pytest.mark.parametrize("k", [10, 100, 1000])
def test_all_plots_at_scale(tmp_path: Path, k: int, monkeypatch: pytest.MonkeyPatch) -> None:
    results = synthetic_results(k)
    s = summarize(results)
    texts: dict[str, str] = {}
    save = plots._save

    drawn: dict[str, np.ndarray] = {}

    def capture(fig, path):  # every text the figure draws: titles, axis labels, tick labels, legends
        texts[Path(path).name] = "\n".join(t.get_text() for t in fig.findobj(lambda o: hasattr(o, "get_text")))
        out = save(fig, path)
        drawn[Path(path).name] = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(int)  # what was drawn
        return out

    monkeypatch.setattr(plots, "_save", capture)
    written, notes = plots.write_plots(s, results, tmp_path)
    assert notes == [] and sorted(p.name for p in written) == sorted(PNGS)
    for name in PNGS:
        png = tmp_path / name
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        with Image.open(png) as im:
            im.verify()
        with Image.open(png) as im:
            w, h = im.size
            assert 600 <= w <= 4000 and 400 <= h <= 4000, (name, im.size)
            assert im.mode == "P" and len(im.getcolors()) <= plots.PNG_COLOURS  # indexed: a few colours
            error = np.abs(np.asarray(im.convert("RGB"), dtype=int) - drawn[name])
            assert error.mean() < 2.0, name  # of 255: the palette keeps the drawn colours (edges aside)
    for name in ("per_class.png", "groups.png", "tradeoff.png"):
        assert "ranked on val" in texts[name], name
        assert all(m in texts[name] for m in OTHERS), name  # every method is named (rows or legend)
    for name in ("groups.png", "tradeoff.png"):
        assert "sample SD over seeds" in texts[name], name
    per_class = texts["per_class.png"]
    assert ("class 0" in per_class.split("\n")) == (k <= plots.NAMES_UP_TO)  # names only while K is small
    bins = plots.class_bins(s)
    assert sorted(np.concatenate(bins).tolist()) == list(range(k))
    if k > plots.BIN_ABOVE:
        assert 40 <= len(bins) <= 60 and "quantile bins" in per_class
        bounds = {int(b[0]) for b in bins}  # no bin straddles two groups
        assert {len(s.groups.hard), k - len(s.groups.easy)} <= bounds
    else:
        assert len(bins) == k


def test_groups_on_test_and_one_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Groups ranked on test (no separate ranking line) and one seed (SD NaN: no error bars, said so)."""
    results = synthetic_results(30, ["ce", "mr2", "focal"], seeds=1)
    s = summarize(results, group_on="test")
    titles = {}
    save = plots._save
    monkeypatch.setattr(plots, "_save", lambda fig, path: titles.setdefault(Path(path).name, fig.get_suptitle())
                        and save(fig, path))
    written, _ = plots.write_plots(s, results, tmp_path)
    assert len(written) == 4
    assert all("ranked on test" in titles[n] for n in ("per_class.png", "groups.png", "tradeoff.png"))
    assert "one seed: no SD" in titles["groups.png"]
