"""Training-set profiles through `mr2probe train` and suites: train changes, val and test do not; counts, draw
seeds and episodes are recorded; bad values are one-line errors before anything is written."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors import safe_open

from conftest import run_cli, write_by_hand
from mr2probe.bench import load_suite
from mr2probe.errors import UserError
from mr2probe.jsonfile import grid_rows
from mr2probe.profiles import class_order

FAST = ["--epochs", "1", "--min-steps", "4", "--batch-size", "64", "-q", "--lr", "1e-2", "--wd", "1e-4",
        "--methods", "ce,focal"]


@pytest.fixture
def feats(tmp_path: Path) -> Path:
    return write_by_hand(tmp_path / "f.h5", k=4, n_train=400, n_test=80, val=True)  # 100 per class, val split


@pytest.mark.slow
def test_longtail_profile_changes_train_only(tmp_path: Path, feats: Path) -> None:
    out = tmp_path / "lt"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "--seeds", "1", "--train-profile",
                "longtail:100", *FAST)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    order = class_order(4, 0)  # rank r → class: n = ⌊100·100^(−r/3)⌋ = 100, 21, 4, 1
    want = [0] * 4
    for rank, n in enumerate([100, 21, 4, 1]):
        want[order[rank]] = n
    assert res["train_class_counts"] == want
    assert res["profile"]["kind"] == "longtail" and res["profile"]["value"] == 100
    assert res["episodes"][0]["draw_seed"] == res["episodes"][0]["draw_seed"] and len(res["episodes"]) == 1
    assert res["provenance"]["splits"]["val"] == 80 and res["provenance"]["splits"]["test"] == 80
    assert "train: longtail" in (out / "table.md").read_text()
    assert res["budget"]["steps"] == 4  # 126 rows, batch 64: 2 steps per epoch, 2 epochs for the 4-step floor
    full = tmp_path / "full"
    assert run_cli("train", "--features", str(feats), "--out", str(full), "--seeds", "1", *FAST).returncode == 0
    assert json.loads((full / "results.json").read_text())["train_class_counts"] == [100] * 4
    parts = {p.name.split("-", 1)[1] for p in (out / "parts").glob("seed0-*.json")}
    assert not parts & {p.name.split("-", 1)[1] for p in (full / "parts").glob("seed0-*.json")}  # other keys


@pytest.mark.slow
def test_shots_with_episodes_are_replicates_like_seeds(tmp_path: Path, feats: Path) -> None:
    out = tmp_path / "shots"
    r = run_cli("train", "--features", str(feats), "--out", str(out), "--seeds", "2", "--train-profile", "shots:5",
                "--episodes", "2", *FAST)
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "results.json").read_text())
    assert [e["train_class_counts"] for e in res["episodes"]] == [[5] * 4, [5] * 4]
    assert res["episodes"][0]["draw_seed"] != res["episodes"][1]["draw_seed"]
    ce = sorted((x["seed"], x["episode"]) for x in res["runs"] if x["method"] == "ce")
    assert ce == [(0, 0), (1, 0), (2, 1), (3, 1)]  # episode e shifts the seeds by e·(max seed + 1)
    null = sorted((x["seed"], x["episode"]) for x in res["runs"] if x["method"] == "ce (null)")
    assert null == [(4, 0), (5, 0), (6, 1), (7, 1)]  # paired by position: the same episodes
    assert all(p.name.startswith(("seed0-ep0-", "seed1-ep0-", "seed2-ep1-", "seed3-ep1-", "seed4-ep0-", "seed5-ep0-",
                                  "seed6-ep1-", "seed7-ep1-")) for p in (out / "parts").glob("*.json"))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["seeds"]["ce"] == [0, 1, 2, 3]
    before = (out / "results.json").read_bytes()
    again = run_cli("train", "--features", str(feats), "--out", str(out), "--seeds", "2", "--train-profile", "shots:5",
                    "--episodes", "2", *FAST)
    assert again.returncode == 0
    said = " ".join(again.stderr.split())  # rich wraps long lines
    seed0 = next(p.name for p in (out / "parts").glob("seed0-*.json"))
    assert f"seed 0: already trained ({seed0}), kept" in said
    assert "kept as it is" in said and (out / "results.json").read_bytes() == before
    assert f"kept {out}/results.json (it already held these results); rendered table.md" in " ".join(
        again.stdout.split()) and "wrote" not in again.stdout
    assert f"wrote {out}/results.json, table.md" in " ".join(r.stdout.split())  # the first run wrote it


@pytest.mark.slow
def test_a_finished_run_without_its_parts_is_kept_not_retrained(tmp_path: Path, feats: Path) -> None:
    """parts/ is not committed: a fresh clone of a finished run folder has results.json, predictions and heads
    only. The same command then keeps the folder byte for byte; other settings or other features train."""
    out = tmp_path / "done"
    args = ["train", "--features", str(feats), "--out", str(out), "--seeds", "2", "--train-profile", "shots:5",
            "--episodes", "2", *FAST]
    assert run_cli(*args).returncode == 0
    before = (out / "results.json").read_bytes()
    for part in (out / "parts").iterdir():
        part.unlink()
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    assert "this run is finished" in " ".join(again.stderr.split())
    assert (out / "results.json").read_bytes() == before and not any((out / "parts").iterdir())  # nothing trained
    assert "kept" in again.stdout and (out / "table.md").exists()
    # the same settings on features of other content: trained, and the folder rewritten
    moved = write_by_hand(tmp_path / "g.h5", k=4, n_train=400, n_test=80, val=True, seed=1)
    other = run_cli(*[str(moved) if a == str(feats) else a for a in args])
    assert other.returncode == 0 and "this run is finished" not in " ".join(other.stderr.split())
    assert any((out / "parts").iterdir()) and (out / "results.json").read_bytes() != before
    # another setting (the lr grid) is another run: trained too
    for part in (out / "parts").iterdir():
        part.unlink()
    third = run_cli(*[str(moved) if a == str(feats) else "1e-3" if a == "1e-2" else a for a in args])
    assert third.returncode == 0 and "this run is finished" not in " ".join(third.stderr.split())
    assert any((out / "parts").iterdir())


def heads_of(out: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    with safe_open(out / "heads.safetensors", "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


def test_lost_heads_are_written_again_from_the_parts_and_a_committed_run_needs_none(tmp_path: Path,
                                                                                   feats: Path) -> None:
    """Heads are not kept in git: a folder without them (and without parts) is still finished; where the parts are
    there, the same command writes the heads again and leaves results.json as it was."""
    out = tmp_path / "done"
    args = ["train", "--features", str(feats), "--out", str(out), "--seeds", "1", *FAST]
    assert run_cli(*args).returncode == 0
    results, heads = (out / "results.json").read_bytes(), heads_of(out)
    (out / "heads.safetensors").unlink()
    again = run_cli(*args)
    assert again.returncode == 0, again.stderr
    again_heads = heads_of(out)
    assert again_heads[1] == heads[1] and sorted(again_heads[0]) == sorted(heads[0])  # metadata, tensor names
    assert all(np.array_equal(again_heads[0][k], v) for k, v in heads[0].items())
    assert (out / "results.json").read_bytes() == results
    rows = json.loads(results)  # the same run in the one-dict-per-point grid layout: still the same numbers
    rows["runs"] = [{**r, "grid": grid_rows(r["grid"])} for r in rows["runs"]]
    (out / "results.json").write_text(json.dumps(rows, indent=1))
    (out / "heads.safetensors").unlink()
    assert run_cli(*args).returncode == 0 and (out / "heads.safetensors").exists()
    assert json.loads((out / "results.json").read_text()) == rows  # kept as it is, not trained again
    (out / "results.json").write_bytes(results)
    (out / "heads.safetensors").unlink()
    for part in (out / "parts").iterdir():
        part.unlink()
    kept = run_cli(*args)
    assert kept.returncode == 0 and "this run is finished" in " ".join(kept.stderr.split())
    assert not (out / "heads.safetensors").exists() and (out / "results.json").read_bytes() == results


@pytest.mark.parametrize("args, message", [
    (["--train-profile", "longtail:0.5"], "RHO ≥ 1"),
    (["--train-profile", "shots:500"], "class 0 ('c0') has only 100"),
    (["--train-profile", "shots:5", "--episodes", "0"], "episodes"),
    (["--train-profile", "balanced"], "unknown training profile"),
])
def test_bad_profiles_are_one_line_errors(tmp_path: Path, feats: Path, args: list[str], message: str) -> None:
    out = tmp_path / "bad"
    r = run_cli("train", "--features", str(feats), "--out", str(out), *args, *FAST)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], r.stderr
    assert not out.exists()


def test_suite_profiles_are_a_cell_axis(tmp_path: Path) -> None:
    path = tmp_path / "s.toml"
    path.write_text('datasets = ["fashion-mnist"]\nencoders = ["efficientnet-lite0"]\n'
                    'profiles = ["full", "longtail:10", "shots:5"]\n[train]\nepisodes = 3\n')
    assert load_suite(path).profiles == ["full", "longtail:10", "shots:5"]
    path.write_text('datasets = ["fashion-mnist"]\nencoders = ["efficientnet-lite0"]\nprofiles = ["longtail:0"]\n')
    with pytest.raises(UserError, match="RHO ≥ 1"):
        load_suite(path)
