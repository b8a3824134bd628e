"""The shared policy-gradient loss and the run directory (refuse, resume, rewind)."""

import json
import struct

import pytest
import torch

from sera.losses import pg_loss
from sera.runlog import RunDir, RunExistsError, read_jsonl


def test_pg_loss_aggregations_on_hand_values():
    logp = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    adv = torch.tensor([2.0, -1.0])
    w = torch.tensor([1.0, 3.0])
    # sum w A logp: 1*2*(-3) + 3*(-1)*(-0.5) = -6 + 1.5 = -4.5
    assert pg_loss(logp, mask, adv, w, "token-mean").item() == pytest.approx(4.5 / 3)
    assert pg_loss(logp, mask, adv, w, "seqnorm", max_len=10).item() == pytest.approx(4.5 / 2 / 10)
    assert pg_loss(logp, mask, adv, w, "seq-mean-token-mean").item() == pytest.approx(-(2 * -1.5 + 1.5) / 2)
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        pg_loss(logp, mask, adv, w, "sum")


def test_pg_loss_gradient_is_weighted_score():
    logits = torch.tensor([[0.2, -0.1, 0.5]], requires_grad=True)
    logp = torch.log_softmax(logits, -1)[:, [2, 0]].T  # two one-token rollouts of one prompt: labels 2 and 0
    pg_loss(logp, torch.ones_like(logp), torch.tensor([1.0, -1.0])).backward()
    pi = torch.softmax(logits.detach(), -1)[0]
    expected = -((torch.eye(3)[2] - pi) - (torch.eye(3)[0] - pi)) / 2
    torch.testing.assert_close(logits.grad[0], expected)


def test_rundir_refuses_finished_and_different_and_resumes(tmp_path):
    cfg = {"method": "sera_pilot", "n0": 16, "threads": 1}
    run = RunDir(tmp_path / "r", cfg)
    assert not run.resumed
    for step in range(5):
        run.log(step, {"train/reward": step / 10, "eval/nan": float("nan")})
    run.save_checkpoint({"step": 2})
    run.close()
    again = RunDir(tmp_path / "r", {**cfg, "threads": 2})  # threads may change on resume
    assert again.resumed and again.load_checkpoint() == {"step": 2}
    again.rewind(2)
    assert [r["step"] for r in read_jsonl(again.metrics_file)] == [0, 1, 2]
    assert read_jsonl(again.metrics_file)[0]["eval/nan"] is None
    again.close()
    with pytest.raises(RunExistsError, match="different config"):
        RunDir(tmp_path / "r", {**cfg, "n0": 128})
    again = RunDir(tmp_path / "r", cfg)
    again.finish({"final": 1})
    assert json.loads((tmp_path / "r" / "DONE").read_text()) == {"final": 1}
    with pytest.raises(RunExistsError, match="finished run"):
        RunDir(tmp_path / "r", cfg)


def wandb_history(run_file) -> list[dict]:
    """The history rows of an offline wandb run file (run-<id>.wandb): a leveldb-style log of 32 KiB blocks after a
    7-byte header, each record in chunks (crc32, length, type: 1 full, 2 first, 3 middle, 4 last) holding one
    protobuf Record."""
    from wandb.proto import wandb_internal_pb2

    data = run_file.read_bytes()
    assert data[:4] == b":W&B", f"{run_file} is not a wandb run file"
    rows, pos, parts = [], 7, b""
    while pos + 7 <= len(data):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a chunk header is padding
            pos += 32768 - pos % 32768
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        parts += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(parts)
            parts = b""
            if record.WhichOneof("record_type") == "history":
                items = record.history.item
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in items})
    return rows


def test_wandb_mirror_offline(tmp_path, monkeypatch):
    """With wandb enabled (offline), every JSONL record is mirrored into a local wandb run, read back here from the
    run file; disabled, nothing is."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = RunDir(tmp_path / "w", {"method": "sera_pilot"}, {"enabled": True, "project": "sera-test", "mode": "offline"})
    run.log(0, {"train/reward": 0.5})
    run.log(1, {"train/reward": 0.25, "eval/pass@1": 0.125, "phat/moments": [2, 1.0]})
    run.finish()
    (run_file,) = (tmp_path / "w" / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file)
    assert [{k: v for k, v in row.items() if not k.startswith("_")} for row in history] == [
        {"step": 0, "train/reward": 0.5},
        {"step": 1, "train/reward": 0.25, "eval/pass@1": 0.125},  # numbers only: the list stays in the JSONL
    ]
    assert [row["_step"] for row in history] == [0, 1]
    quiet = RunDir(tmp_path / "q", {"method": "sera_pilot"}, {"enabled": False})
    quiet.log(0, {"train/reward": 0.5})
    assert not (tmp_path / "q" / "wandb").exists()


def test_settings_a_method_does_not_read_do_not_change_the_run(tmp_path):
    """A SERA run made before method.sequential existed is the same run; for SARA those settings matter."""
    RunDir(tmp_path / "sera_pilot", {"method": {"name": "sera_pilot"}}).finish()
    assert json.loads((tmp_path / "sera_pilot" / "DONE").read_text()) == {}
    from sera.runlog import finished_summary

    assert finished_summary(tmp_path / "sera_pilot", {"method": {"name": "sera_pilot", "sequential": {"k0": 4}}}) == {}
    RunDir(tmp_path / "sara", {"method": {"name": "sara", "sequential": {"k0": 4}}}).finish()
    with pytest.raises(RunExistsError, match="different config"):
        finished_summary(tmp_path / "sara", {"method": {"name": "sara", "sequential": {"k0": 2}}})
    # the vllm block is read only with engine=vllm
    RunDir(tmp_path / "hf", {"engine": "hf", "method": {"name": "sera_pilot"}}).finish()
    assert (
        finished_summary(tmp_path / "hf", {"engine": "hf", "vllm": {"dtype": None}, "method": {"name": "sera_pilot"}})
        == {}
    )
    RunDir(tmp_path / "vllm", {"engine": "vllm", "vllm": {"dtype": None}}).finish()
    with pytest.raises(RunExistsError, match="different config"):
        finished_summary(tmp_path / "vllm", {"engine": "vllm", "vllm": {"dtype": "bfloat16"}})


def test_sequential_runs_made_before_the_sara_prior_are_recognised(tmp_path):
    """Runs made before SARA's prior existed (k0 = 4, no prior, window or history_decay: the flat prior) are the same
    run as today's config with prior=flat and k0=4; with today's defaults (the population prior, k0 = 2) they are
    not. DS and DPS read none of SARA's settings, so a new SARA default leaves their old runs recognised; their own
    settings still matter."""
    from sera.runlog import finished_summary

    old = {"k0": 4, "k_min": 2, "chunk": 2, "tau_lo": 0.45, "tau_hi": 0.95, "max_waves": 16, "mode": "fill",
           "gen_batch": None, "max_rounds": 10, "dps_ratio": 8, "dps_decay": 0.5}  # fmt: skip
    today = old | {"k0": 2, "prior": "population", "window": 20, "history_decay": 0.7}
    for name in ("sara", "ds", "dps"):
        RunDir(tmp_path / name, {"method": {"name": name, "sequential": old}, "eval": {"every": 1}}).finish()
    flat = today | {"k0": 4, "prior": "flat"}
    added = {"eval": {"every": 1, "at_start": False}}  # a measurement added later, at its old value
    assert finished_summary(tmp_path / "sara", {"method": {"name": "sara", "sequential": flat}} | added) == {}
    with pytest.raises(RunExistsError, match="different config"):
        finished_summary(tmp_path / "sara", {"method": {"name": "sara", "sequential": today}} | added)
    for name in ("ds", "dps"):
        assert finished_summary(tmp_path / name, {"method": {"name": name, "sequential": today}} | added) == {}
    with pytest.raises(RunExistsError, match="different config"):
        fair = {"method": {"name": "dps", "sequential": today | {"dps_decay": 0.7}}}
        finished_summary(tmp_path / "dps", fair | added)


def test_a_run_is_its_own_learning_rate_not_the_other_methods_rates(tmp_path):
    """Of optim.lr_by_method a run reads only its own rate: a run made before the setting existed (or with the rate
    given as optim.lr) is the same run; another method's entry changes nothing; a different own rate is refused."""
    from sera.runlog import finished_summary

    RunDir(tmp_path / "grpo", {"method": {"name": "grpo"}, "optim": {"lr": 1e-4}}).finish()
    RunDir(tmp_path / "maxrl", {"method": {"name": "maxrl"}, "optim": {"lr": 3e-4}}).finish()
    by_method = {"optim": {"lr": 3e-4, "lr_by_method": {"grpo": 1e-4}}}
    assert finished_summary(tmp_path / "grpo", {"method": {"name": "grpo"}} | by_method) == {}
    assert finished_summary(tmp_path / "maxrl", {"method": {"name": "maxrl"}} | by_method) == {}
    assert (
        finished_summary(tmp_path / "maxrl", {"method": {"name": "maxrl"}, "optim": {"lr": 3e-4, "lr_by_method": {}}})
        == {}
    )
    with pytest.raises(RunExistsError, match="different config"):
        finished_summary(tmp_path / "grpo", {"method": {"name": "grpo"}, "optim": {"lr": 3e-4, "lr_by_method": {}}})
