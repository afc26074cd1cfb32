"""Experiment trackers (``--log``, mr2probe.tracking): the spec and its one-line errors, the trainer's epoch-end
hook, and a real run logged to each tracker and read back with the tracker's own reader — TensorBoard event files
(EventAccumulator), an MLflow file store (MlflowClient), an offline W&B run (its .wandb record log on disk)."""
from __future__ import annotations

import json
import struct
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import write_by_hand
from mr2probe import tracking
from mr2probe.cli import app
from mr2probe.errors import UserError
from mr2probe.experiment import _config_key, config_from_settings
from mr2probe.tracking import TrackerSpec, metric_name, parse_spec
from mr2probe.trainer import TrainData, expand_runs, select_scores, train_stack

EPOCHS, SEEDS = 3, 2
METHODS = ("ce", "mr2", "ce_null")  # the null control's "ce (null)" as a metric name


def train(tmp_path: Path, spec: str) -> tuple[Path, object]:
    """``mr2probe train`` of ce and mr2 on a tiny file with val, logged to ``spec``; returns the run folder."""
    feats, out = write_by_hand(tmp_path / "hand.h5", val=True), tmp_path / "run"
    r = CliRunner().invoke(app, ["train", "--features", str(feats), "--out", str(out), "--methods", "ce,mr2",
                                 "--seeds", str(SEEDS), "--epochs", str(EPOCHS), "--min-steps", "0", "--lr", "0.1",
                                 "-q", "--log", spec])
    assert r.exit_code == 0, r.output
    return out, r


def final_means(out: Path) -> dict[str, dict[str, float]]:
    return json.loads((out / "summary.json").read_text())["mean"]


def selected_val(out: Path) -> dict[tuple[str, int], float]:
    """(method, seed) → the selected head's val score (%): the best grid point's score after the last epoch."""
    runs = json.loads((out / "results.json").read_text())["runs"]
    return {(metric_name(r["method"]), r["seed"]): 100 * r["val_score"] for r in runs}


# ---- the spec ----------------------------------------------------------------------------------------------

def test_specs_parse_and_bad_ones_are_one_line() -> None:
    assert parse_spec("") is None and parse_spec("  ") is None
    assert parse_spec("tensorboard:runs/tb") == TrackerSpec("tensorboard", "runs/tb")
    assert parse_spec("mlflow") == TrackerSpec("mlflow", "")
    assert parse_spec("mlflow:file:/tmp/ml") == TrackerSpec("mlflow", "file:/tmp/ml")  # the URI keeps its colon
    assert parse_spec("WandB:team/proj") == TrackerSpec("wandb", "team/proj")
    for bad, says in [("tensorboard", "tensorboard needs a folder"), ("tensorboard:", "needs a folder"),
                      ("neptune:x", "unknown tracker 'neptune'; known: mlflow, tensorboard, wandb")]:
        with pytest.raises(UserError, match=says) as e:
            parse_spec(bad)
        assert "\n" not in str(e.value)


def test_metric_names() -> None:
    assert [metric_name(n) for n in ("ΔHard", "ce (null)", "Sig↑", "mr2_uniform")] == \
        ["delta_Hard", "ce_null", "Sigup", "mr2_uniform"]


def test_a_bad_spec_or_a_missing_library_is_one_error_line_and_nothing_is_written(tmp_path: Path,
                                                                                 monkeypatch) -> None:
    feats, out = write_by_hand(tmp_path / "hand.h5"), tmp_path / "run"
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb → ImportError, as when it is not installed
    for spec, says in [("wandb", "error: --log wandb needs wandb, which is not installed: pip install "
                                 "'mr2probe[wandb]'"),
                       ("tb:x", "error: --log 'tb:x': unknown tracker 'tb'")]:
        r = CliRunner().invoke(app, ["train", "--features", str(feats), "--out", str(out), "--methods", "ce",
                                     "--seeds", "1", "--epochs", "1", "-q", "--log", spec])
        assert r.exit_code == 2, r.output
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(says), r.output
        assert not out.exists()


def test_the_tracker_is_not_part_of_the_run_key(tmp_path: Path) -> None:
    cfg = config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0])
    logged = replace(cfg, train=replace(cfg.train, log="tensorboard:tb"))
    assert logged.train.log == "tensorboard:tb" and _config_key(logged, "h") == _config_key(cfg, "h")


def test_only_rank_0_logs(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("tensorboard")
    cfg = config_from_settings(tmp_path / "f.h5", tmp_path / "run", ["ce"], [0],
                               values={"log": f"tensorboard:{tmp_path}/tb"})
    monkeypatch.setattr(tracking, "rank_world", lambda: (1, 2))
    with tracking.tracked(cfg, "run") as t:
        t.epoch(0, 1, {"ce": 0.5})
        assert t.tracker is None
    assert not (tmp_path / "tb").exists()


# ---- the trainer's hook ------------------------------------------------------------------------------------

def test_epoch_hook_gives_each_methods_best_val_score_also_across_cpu_chunks() -> None:
    """A stack cut into one-head chunks on the CPU (each method's heads in several chunks) reports once per epoch,
    after the last chunk, each method's best score over all its heads; after the last epoch that is the best of
    the trained heads' val scores."""
    rng = np.random.default_rng(0)
    k, d, n = 4, 6, 64
    centers = rng.normal(0, 3, (k, d))
    y, vy = np.arange(n) % k, np.arange(32) % k
    t = lambda a, dt=torch.float32: torch.as_tensor(a, dtype=dt)  # noqa: E731
    data = TrainData(t(centers[y] + rng.normal(0, 1, (n, d))), t(y, torch.long),
                     t(centers[vy] + rng.normal(0, 1, (32, d))), t(vy, torch.long), k)
    values = {"epochs": 4, "min_steps": 0, "batch_size": 16, "lr": (0.01, 0.1), "wd": (0.0,), "device": "cpu"}
    cfg = replace(config_from_settings(Path("f.h5"), Path("run"), ["ce", "mr2"], [0], values=values).train,
                  progress=False, chunk_mib=1e-6)  # one head per chunk
    seen: list[tuple[int, dict[str, float]]] = []
    trained = train_stack(data, expand_runs(["ce", "mr2"], [0], cfg), cfg, on_epoch=lambda e, s: seen.append((e, s)))
    assert [e for e, _ in seen] == [1, 2, 3, 4] and all(set(s) == {"ce", "mr2"} for _, s in seen)
    scores = select_scores(trained.predict(data.val_x), data.val_y, k, "acc")
    for m in ("ce", "mr2"):
        heads = [i for i, s in enumerate(trained.specs) if s.method == m]
        assert seen[-1][1][m] == pytest.approx(scores[heads].max())


# ---- each tracker, read back -------------------------------------------------------------------------------

def test_tensorboard_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = train(tmp_path, f"tensorboard:{tmp_path / 'tb'}")
    acc = EventAccumulator(str(tmp_path / "tb" / "run"))
    acc.Reload()
    best = selected_val(out)
    for (m, seed), val in best.items():
        series = acc.Scalars(f"val_acc/{m}/seed{seed}")
        assert [e.step for e in series] == list(range(1, EPOCHS + 1))
        assert series[-1].value == pytest.approx(val, abs=1e-4)  # the last epoch: what selection saw
    assert {m for m, _ in best} == set(METHODS)
    for m, cols in final_means(out).items():
        for col in ("All", "Hard", "Worst", "ΔHard"):
            assert acc.Scalars(f"final/{metric_name(m)}/{metric_name(col)}")[0].value == pytest.approx(cols[col],
                                                                                                        abs=1e-3)
    text = {tag: acc.Tensors(tag)[0].tensor_proto.string_val[0].decode() for tag in acc.Tags()["tensors"]}
    table = text["final/table/text_summary"]
    assert "| method" in table and "ΔHard" in table and "verdict" in table and "ce (null)" in table
    assert "train.epochs" in text["config/text_summary"]
    assert text["files/table.md/text_summary"] == (out / "table.md").read_text()


def test_mlflow_file_store(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 asks for this opt-in for a file store
    uri = f"file:{tmp_path / 'mlruns'}"
    out, _ = train(tmp_path, f"mlflow:{uri}")
    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("mr2probe").experiment_id])
    assert run.info.run_name == "run" and run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == str(EPOCHS) and run.data.params["methods"] == '["ce", "mr2"]'
    assert run.data.params["report.groups_on"] == "val"
    for (m, seed), val in selected_val(out).items():
        history = client.get_metric_history(run.info.run_id, f"val_acc/{m}/seed{seed}")
        assert sorted(h.step for h in history) == list(range(1, EPOCHS + 1))
        assert max(history, key=lambda h: h.step).value == pytest.approx(val, abs=1e-4)
    for m, cols in final_means(out).items():
        assert run.data.metrics[f"final/{metric_name(m)}/delta_Hard"] == pytest.approx(cols["ΔHard"], abs=1e-3)
    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"table.md", "table.csv", "summary.json"} <= names
    table = json.loads(Path(client.download_artifacts(run.info.run_id, "final/table.json", str(tmp_path))).read_text())
    assert table["columns"][0] == "method" and "verdict" in table["columns"]
    assert [row[0] for row in table["data"]] == ["ce", "mr2", "ce (null)"]


def wandb_records(path: Path) -> list:
    """The records of a W&B ``.wandb`` file (LevelDB log format: a 7-byte file header, 32 KiB blocks of chunks
    each with a 7-byte header crc32c · length · type (1 full, 2 first, 3 middle, 4 last)), as protobuf Records."""
    from wandb.proto import wandb_internal_pb2 as pb

    data, pos, block, out, buf = path.read_bytes(), 7, 32768, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            break
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            out.append(rec)
            buf = b""
    return out


def test_wandb_offline_run_on_disk(tmp_path: Path, monkeypatch) -> None:
    pytest.importorskip("wandb")
    for var, sub in [("WANDB_DIR", "wb"), ("WANDB_DATA_DIR", "wb-data"), ("WANDB_CACHE_DIR", "wb-cache"),
                     ("WANDB_CONFIG_DIR", "wb-config")]:
        (tmp_path / sub).mkdir()
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    out, _ = train(tmp_path, "wandb:probes")
    (run_dir,) = (tmp_path / "wb" / "wandb").glob("offline-run-*")
    records = wandb_records(next(run_dir.glob("run-*.wandb")))
    kinds = {r.WhichOneof("record_type") for r in records}
    assert {"run", "history", "summary", "artifact", "exit"} <= kinds
    (start,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert start.project == "probes" and start.display_name == "run"
    config = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "config"
              for i in r.config.update}
    assert config["train"]["epochs"] == EPOCHS and config["report"]["groups_on"] == "val"
    history = [{"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    for (m, seed), val in selected_val(out).items():
        series = [(h["epoch"], h[f"val_acc/{m}/seed{seed}"]) for h in history if f"val_acc/{m}/seed{seed}" in h]
        assert [e for e, _ in series] == list(range(1, EPOCHS + 1)) and series[-1][1] == pytest.approx(val, abs=1e-4)
    summary = {i.key: json.loads(i.value_json) for r in records if r.WhichOneof("record_type") == "summary"
               for i in r.summary.update if i.key}
    for m, cols in final_means(out).items():
        assert summary[f"final/{metric_name(m)}/All"] == pytest.approx(cols["All"], abs=1e-3)
    artifact = next(r.artifact for r in records if r.WhichOneof("record_type") == "artifact"
                    and r.artifact.type == "results")
    assert {c.path for c in artifact.manifest.contents} == {"table.md", "table.csv", "summary.json"}
    (table_file,) = (run_dir / "files" / "media" / "table" / "final").glob("table_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"][0] == "method" and [row[0] for row in table["data"]] == ["ce", "mr2", "ce (null)"]


def test_a_suite_train_key_logs_each_run(tmp_path: Path) -> None:
    """``[train] log`` of a suite: every run of ``bench`` is logged, under the suite's folder name."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from mr2probe.bench import load_suite, run_suite

    feats = write_by_hand(tmp_path / "hand.h5", val=True)
    suite = tmp_path / "s.toml"
    suite.write_text(f'methods = ["ce", "mr2"]\nseeds = 1\n[train]\nepochs = 2\nmin_steps = 0\nnull = false\n'
                     f'log = "tensorboard:{tmp_path / "tb"}"\n[[runs]]\nname = "a"\nfeatures = "{feats}"\n')
    cells = run_suite(load_suite(suite), features_dir=tmp_path / "f", out=tmp_path / "out", progress=False,
                      log=lambda m: None)
    assert [c.status for c in cells] == ["done"]
    acc = EventAccumulator(str(tmp_path / "tb" / "out" / "a"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("val_acc/ce/seed0")] == [1, 2]
    assert acc.Scalars("final/ce/All")[0].value == pytest.approx(final_means(tmp_path / "out" / "a")["ce"]["All"],
                                                                 abs=1e-3)
