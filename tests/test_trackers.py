"""Eval and ablation results logged to TensorBoard and W&B (offline) through their own libraries."""

import argparse
import json

import pytest

from turngym.credit.ablate import ablate
from turngym.episode import EpisodeWriter
from turngym.episode.reader import read_episodes
from turngym.evals.harness import EvalSpec, run_eval
from turngym.rewards import get_reward
from turngym.views.trackers import (
    TrackerError,
    add_tracker_arguments,
    flatten_metrics,
    log_from_args,
    log_results,
    log_run_dir,
    read_run_dir,
)


def wandb_records(path):
    """The protobuf records of a W&B run file (a LevelDB-style log after a 7-byte ``:W&B`` header: 32 KiB
    blocks of chunks, each crc32c(4) length(2, little-endian) type(1: full, 2: first, 3: middle, 4: last)).
    wandb ships no Python reader for it since its core moved to Go; ``wandb sync`` reads the same bytes."""
    from wandb.proto import wandb_internal_pb2

    data, block, pos, out, parts = path.read_bytes(), 32768, 7, [], b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        if kind == 0:
            break
        parts += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(parts)
            out.append(rec)
            parts = b""
    return out


def wandb_history(path):
    """The run's history rows (step 0 here) as nested mappings, as the W&B UI shows them."""
    rows = []
    for rec in wandb_records(path):
        if rec.WhichOneof("record_type") == "history":
            row = {}
            for i in rec.history.item:
                *parents, leaf = list(i.nested_key) or [i.key]
                node = row
                for p in parents:
                    node = node.setdefault(p, {})
                node[leaf] = json.loads(i.value_json)
            rows.append(row)
    return rows


def tensorboard_scalars(run_dir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    return acc, {tag: acc.Scalars(tag)[-1].value for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def eval_run(tmp_path_factory, tiny_chat_policy):
    out = tmp_path_factory.mktemp("eval")
    run_eval(EvalSpec(env_id="turngym/Calculator-v0", env_kwargs={"max_turns": 2}, limit=3, k=2, max_new_tokens=6,
                      temperature=1.0), out, policy=tiny_chat_policy)
    return out


def test_eval_results_reach_tensorboard_and_wandb_offline(eval_run, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    results = json.loads((eval_run / "results.json").read_text())
    logged = log_run_dir(eval_run, n_samples=4, tensorboard_dir=tmp_path / "tb", wandb_project="turngym-test",
                         wandb_dir=tmp_path / "wb")
    acc_value = results["metrics"]["accuracy"]["value"]
    assert logged.scalars["metrics/accuracy/value"] == acc_value
    assert logged.scalars["episodes"] == 6.0

    acc, scalars = tensorboard_scalars(logged.tensorboard)
    assert scalars["metrics/accuracy/value"] == pytest.approx(acc_value)
    assert scalars["episodes"] == 6.0
    assert set(scalars) == set(logged.scalars)
    assert "samples/text_summary" in acc.Tags()["tensors"]
    table = acc.Tensors("samples/text_summary")[-1].tensor_proto.string_val[0].decode()
    first = read_episodes(eval_run / "episodes.jsonl").episodes[0]
    assert first.id.replace("|", "\\|") in table and table.count("\n| ") == 4  # 4 rows after the header

    run = logged.wandb
    assert run is not None and run.name.startswith("offline-run-")
    import wandb

    wandb.teardown()  # offline records reach the file when wandb's service stops (at the latest, at exit)
    (record_file,) = run.glob("run-*.wandb")  # what `wandb sync` uploads
    (logged_wb,) = wandb_history(record_file)
    assert logged_wb["metrics/accuracy/value"] == pytest.approx(acc_value) and logged_wb["episodes"] == 6
    assert set(logged.scalars) <= set(logged_wb)
    assert logged_wb["samples"]["_type"] == "table-file"
    wb_table = json.loads((run / "files" / logged_wb["samples"]["path"]).read_text())
    assert wb_table["columns"][0] == "episode" and len(wb_table["data"]) == 4
    assert wb_table["data"][0][0] == first.id


def test_ablation_summary_flattens_and_logs(tmp_path, eval_run):
    eps = read_episodes(eval_run / "episodes.jsonl").episodes
    out = tmp_path / "abl"
    ablate(eps, {"outcome": get_reward("outcome")}, out_dir=out)
    results, rows = read_run_dir(out)  # ablate writes no episodes file: no sample rows
    assert rows == []
    assert "per_turn_rewards" in results and not any(k.startswith("per_turn_rewards") for k in flatten_metrics(results))
    with EpisodeWriter(out / "episodes.jsonl", fsync=False) as w:
        w.write_all(eps)
    logged = log_run_dir(out, tensorboard_dir=tmp_path / "tb")
    _, scalars = tensorboard_scalars(logged.tensorboard)
    assert scalars and set(scalars) == set(logged.scalars)
    assert any(k.startswith("rewards/outcome/") for k in scalars)


def test_flatten_skips_non_numbers_and_keeps_paths():
    flat = flatten_metrics({"a": {"b": 1, "c": [0.5, float("nan"), "x"], "ok": True}, "n": None, "s": "text"})
    assert flat == {"a/b": 1.0, "a/c/0": 0.5}


def test_bad_inputs_are_one_clear_message(tmp_path):
    with pytest.raises(TrackerError, match="none of results.json"):
        read_run_dir(tmp_path)
    (tmp_path / "results.json").write_text("{not json")
    with pytest.raises(TrackerError, match="not valid JSON"):
        read_run_dir(tmp_path)
    with pytest.raises(TrackerError, match="no tracker asked for"):
        log_results(tmp_path, {"x": 1})


def test_tracker_arguments_parse_and_log(eval_run, tmp_path):
    parser = argparse.ArgumentParser()
    add_tracker_arguments(parser)
    assert log_from_args(parser.parse_args([]), eval_run) is None  # nothing asked: nothing logged
    assert "default: 20" in parser.format_help()
    lines = []
    logged = log_from_args(parser.parse_args(["--tensorboard", str(tmp_path / "tb"), "--tracker-samples", "2"]),
                           eval_run, echo=lines.append)
    assert logged is not None and logged.tensorboard.is_dir() and "tensorboard:" in lines[0]


def test_ablate_command_logs_to_tensorboard(eval_run, tmp_path, capsys):
    """The flags are wired into the commands: ``turngym ablate ... --tensorboard DIR`` writes the ablation's
    numbers as TensorBoard scalars after its report (eval and creditbench take the same flags)."""
    from turngym.cli import build_parser, main

    assert main(["ablate", "--episodes", str(eval_run / "episodes.jsonl"), "--rewards", "outcome",
                 "--out", str(tmp_path / "ab"), "--tensorboard", str(tmp_path / "tb")]) == 0
    assert "tensorboard:" in capsys.readouterr().out
    _, scalars = tensorboard_scalars(next((tmp_path / "tb").rglob("events.out.tfevents*")).parent)
    ablation = json.loads((tmp_path / "ab" / "ablation.json").read_text())
    assert scalars and any(k.startswith("rewards/outcome") for k in scalars) and "rewards" in ablation
    for command in (["eval", "--out", "x"], ["creditbench", "--out", "x"]):
        assert build_parser().parse_args([*command, "--tensorboard", "tb"]).tensorboard == "tb"
