"""The classification study: sampler, estimator expectation on a tiny classifier, configs, bad input, smoke runs,
and resume determinism. Smoke runs call the real entry point at scale=imagenet/smoke in a temp dir."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from experiments.imagenet import policy, train
from experiments.imagenet.sampling import RowSampler
from sera.allocation import active_waterline, scale_factor
from sera.estimation import HistoricalEstimator
from sera.methods import MethodSettings, get_method
from sera.runlog import RunExistsError, read_jsonl

CONFIGS = str(Path(__file__).resolve().parents[1] / "configs")
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}


def cfg_for(*overrides):
    with initialize_config_dir(config_dir=CONFIGS, version_base=None):
        return compose("imagenet", overrides=list(overrides))


@pytest.mark.parametrize("kernel", [True, False])
def test_sample_labels_counts_and_distribution(kernel):
    probs = torch.tensor([[0.7, 0.2, 0.1, 0.0], [0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.25, 0.25]])
    counts = np.array([20000, 3, 40000])
    rows, labels = RowSampler(probs, kernel=kernel).sample(counts, torch.Generator().manual_seed(0))
    assert np.array_equal(np.bincount(rows), counts)
    assert np.all(rows[:-1] <= rows[1:])  # grouped by prompt
    for i in (0, 2):
        freq = np.bincount(labels[rows == i], minlength=4) / counts[i]
        p = probs[i].double().numpy()
        assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / counts[i]) + 1e-12)
    assert set(labels[rows == 1].tolist()) <= {2, 3}  # zero-probability labels are never drawn


def test_cpu_kernel_and_searchsorted_draw_the_same_labels():
    """The CPU kernel and the accelerator path (torch.searchsorted, run here on the CPU) agree draw for draw,
    on unnormalised rows with zero-probability classes and ragged counts, including an empty row."""
    gen = torch.Generator().manual_seed(3)
    probs = torch.rand(64, 1000, generator=gen) ** 8 * (torch.rand(64, 1000, generator=gen) > 0.3)
    counts = np.random.default_rng(0).integers(0, 300, 64)
    counts[5] = 0
    drawn = [RowSampler(probs, kernel=k).sample(counts, torch.Generator().manual_seed(1)) for k in (True, False)]
    (rows_k, labels_k), (rows_t, labels_t) = drawn
    assert np.array_equal(rows_k, rows_t)
    assert (labels_k != labels_t).sum() <= 2  # only a uniform within float rounding of a boundary may differ
    assert probs.numpy()[rows_k, labels_k].min() > 0


def test_sampler_rejects_bad_counts():
    sampler = RowSampler(torch.ones(3, 4))
    with pytest.raises(ValueError, match="non-negative"):
        sampler.sample(np.array([1, -1, 2]), torch.Generator())
    with pytest.raises(ValueError, match="3 non-negative"):
        sampler.sample(np.array([1, 2]), torch.Generator())


def spec(name, estimator="none", pilot_m=0, n0=6, n_max=48) -> MethodSettings:
    method = get_method(name)
    return MethodSettings(
        method, n0, estimator, pilot_m, 0.01, 0.99, max(2, pilot_m), n_max, 1,
        method.multiplicity_correction, "token-mean", {},
    )  # fmt: skip


@pytest.mark.parametrize("name", ["maxrl", "sera_pilot"])
def test_sampled_maxrl_gradient_averages_to_scaled_ce_gradient(name):
    """Averaging many steps of the shipped rollout loss (MaxRL, or SERA with the oracle p_hat: waterline counts and
    multiplicity weights) on a tiny linear classifier gives (1/B) sum_i c(p_i, n_i) grad log p_i, within 5
    standard errors per coordinate."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 5)
    x, y, idx = torch.randn(4, 3), torch.tensor([0, 1, 2, 3]), torch.arange(4)
    logp = torch.log_softmax(model(x), -1)
    logp_true = logp.gather(1, y[:, None])[:, 0]
    p = logp_true.exp().detach().double().numpy()
    run = spec(name, estimator="oracle" if name == "sera_pilot" else "none")
    params, history = list(model.parameters()), HistoricalEstimator(4)
    gen, draws = torch.Generator().manual_seed(1), []
    for _ in range(4000):
        loss, out = policy.rollout_loss(run, logp, logp_true, idx, y, history, gen)
        draws.append(torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params, retain_graph=True)]))
    assert (out.counts != run.n0).any() == (name == "sera_pilot") and out.counts.sum() == 4 * run.n0
    expected_loss = -(torch.as_tensor(scale_factor(p, out.counts, 1)) * logp_true.double()).mean()
    expected = torch.cat([g.reshape(-1) for g in torch.autograd.grad(expected_loss, params)]).double()
    draws = torch.stack(draws).double()
    mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws))
    assert torch.all((mean - expected).abs() <= 5 * se + 1e-9)
    assert torch.nn.functional.cosine_similarity(mean, expected, dim=0) > 0.99


def test_pilots_are_the_first_rollouts_of_each_group():
    """With pilots, a group holds its m pilot labels first (the draws that set p_hat), then its n_i - m others; the
    budget is spent exactly."""
    probs = torch.softmax(2 * torch.randn(8, 50, generator=torch.Generator().manual_seed(0)), -1)
    y = probs.argmax(1).numpy()  # likely labels, so the pilots see successes and failures
    run = spec("sera_pilot", estimator="pilot", pilot_m=3, n0=10, n_max=80)
    rows, labels, out = policy.draw_rollouts(
        run, probs, None, torch.arange(8), y, None, torch.Generator().manual_seed(5)
    )
    counts, p_hat = out.counts, out.p_hat
    assert out.rollouts_generated == out.rollouts_trained == 80  # pilots count toward the budget, drawn once
    _, pilots = RowSampler(probs).sample(np.full(8, 3), torch.Generator().manual_seed(5))  # the same first draws
    first = np.cumsum(counts) - counts
    assert counts.sum() == 80 and counts.min() >= 3 and np.array_equal(np.bincount(rows), counts)
    assert np.array_equal(labels[first[:, None] + np.arange(3)], pilots.reshape(8, 3))
    successes = (pilots.reshape(8, 3) == y[:, None]).sum(1)
    assert np.array_equal(p_hat, np.clip(successes / 3, 0.01, 0.99))


@pytest.mark.parametrize("method", ["direct_ce", "grpo", "maxrl", "sera_pilot", "pkpo", "dars_hw"])
@pytest.mark.parametrize("scale", ["smoke", "cpu", "cpu_scratch", "paper"])
def test_every_config_composes_and_validates(method, scale):
    cfg = cfg_for(f"method={method}", f"scale=imagenet/{scale}")
    if scale == "paper":  # real ImageNet: the missing root is the error, raised before any work
        with pytest.raises(ValueError, match="data.root"):
            train.validate(cfg)
    else:
        assert train.validate(cfg).method.name == method


@pytest.mark.parametrize(
    "overrides, error, match",
    [
        (["method=serra"], Exception, "serra"),
        (["method=sera_pilot", "alloc.n_max=8"], ValueError, "infeasible budget"),
        (["method=sera_pilot", "method.pilot_m=32"], ValueError, "infeasible budget"),
        (["method=sera_pilot", "method.estimator=bogus"], ValueError, "unknown method.estimator"),
        (["method=sera_pilot", "method.estimator=none"], ValueError, "needs a p_hat estimator"),
        (["method=sera_pilot", "method.estimator=history", "method.pilot_m=4"], ValueError, "pilot_m=0"),
        (["method=maxrl", "method.multiplicity_correction=true"], ValueError, "no effect"),
        (["method=sera_pilot", "alloc.delta=0"], ValueError, "keep_cv_on_zero"),
        (["method=sera_pilot", "method.pilot_m=4", "alloc.n_min=2"], ValueError, "below method.pilot_m"),
        (["method=common"], ValueError, "not a method"),
        (["method=sara", "method.sequential.k0=99"], ValueError, "must be <= n0"),
        (["method=dps", "method.estimator=pilot"], ValueError, "without p_hat"),
        (["method=direct_ce", "train.steps=0"], ValueError, "train.steps"),
        (["run.checkpoint_every=0"], ValueError, "checkpoint_every"),
        (["eval.every=0"], ValueError, "eval.every"),
        (["eval.ks=[]"], ValueError, "eval.ks"),
        (["threads=foo"], ValueError, "threads"),
        (["seed=-1"], ValueError, "seed"),
        (["device=tpu"], ValueError, "unknown device"),
        (["optim.lr=nan"], ValueError, "optim.lr"),
        (["optim.name=sgd", "optim.lr=-inf"], ValueError, "optim.lr"),
        (["run.max_skipped_steps=0"], ValueError, "max_skipped_steps"),
        (["run.if_finished=overwrite"], ValueError, "error, skip or extend"),
        (["run.if_finished=extend"], ValueError, "for the LM studies"),
        (["data.name=imagenet", "data.root=/nonexistent/imagenet"], FileNotFoundError, "does not exist"),
        (["data.name=mnist"], ValueError, "unknown data.name"),
        (["method=maxrl", "train.steps=50"], ValueError, "no RL steps"),
    ],
)
def test_bad_input_is_rejected_before_work(overrides, error, match):
    with pytest.raises(error, match=match):
        train.validate(cfg_for(*overrides))


def run_cli(tmp_path, *overrides, check=True):
    cmd = [sys.executable, "-m", "experiments.imagenet.train", *overrides, f"run.root={tmp_path}", "threads=1"]
    return subprocess.run(cmd, env=ENV, capture_output=True, text=True, check=check)


@pytest.mark.slow
def test_smoke_every_method_through_the_real_entry_point(tmp_path):
    run_cli(tmp_path, "--multirun", "scale=imagenet/smoke", "method=direct_ce,grpo,maxrl,sera_pilot,pkpo")
    run_cli(
        tmp_path,
        "--multirun",
        "scale=imagenet/smoke",
        "method=sera_pilot",
        "method.estimator=history,oracle",
        "method.pilot_m=0",
    )
    root = tmp_path / "imagenet-smoke"
    names = sorted(p.name for p in root.iterdir())
    assert names == [
        "direct_ce_seed-0",
        "grpo_n0-16_seed-0",
        "maxrl_n0-16_seed-0",
        "pkpo_n0-16_seed-0",
        "sera-history_n0-16_seed-0",
        "sera-m8_n0-16_seed-0",
        "sera-oracle_n0-16_seed-0",
    ]
    for name in names:
        run = root / name
        assert (run / "DONE").exists() and (run / "config.yaml").exists() and (run / "val_p.npy").exists()
        records = read_jsonl(run / "metrics.jsonl")
        assert [r["step"] for r in records] == list(range(8))
        assert "eval/pass@1024" in records[-1] and "eval/pass@1" in records[3]
        summary = json.loads((run / "DONE").read_text())
        assert 0 <= summary["eval/pass@1"] <= summary["eval/pass@1024"] <= 1
        rl = [r for r in records if "alloc/rollouts" in r]
        if not name.startswith("direct_ce"):
            assert len(rl) == 6 and all(r["alloc/rollouts"] == r["alloc/budget"] == 16 * 16 for r in rl)
            assert any("grad/cos_ce" in r for r in rl)
    sera = read_jsonl(root / "sera-m8_n0-16_seed-0" / "metrics.jsonl")
    assert all("phat/mae" in r and "alloc/tau" in r for r in sera if "alloc/rollouts" in r)


@pytest.mark.slow
def test_sequential_methods_through_the_real_entry_point(tmp_path):
    """DS, DPS, SARA, SARA+DPS and SARA+SERA on the classifier: images drawn as the step goes, every rollout generated
    counted, only committed groups trained (n0 each, but SARA+SERA's waterline), the abandonment error logged with
    exact p and below SARA's threshold on average, and an all-saturated start (the untrained classifier: p ~ 1/1000,
    nearly every group all-fail) runs to the end at the wave and round caps without a crash."""
    run_cli(tmp_path, "--multirun", "scale=imagenet/smoke", "n0=8", "method=ds,dps,sara,sara+dps,sara+sera")
    root = tmp_path / "imagenet-smoke"
    for name in ["ds", "dps", "sara", "sara+dps", "sara+sera"]:
        run = root / f"{name}_n0-8_seed-0"
        assert (run / "DONE").exists(), name
        records = read_jsonl(run / "metrics.jsonl")
        rl = [r for r in records if "alloc/generated" in r]
        assert len(rl) == 6, name  # 2 CE warm-start steps, then RL
        for r in rl:
            assert r["alloc/generated"] >= r.get("alloc/rollouts", 0)
            if name != "dps":
                assert r["alloc/prompts_drawn"] >= r["alloc/groups_committed"] + r["alloc/groups_abandoned"]
            if "alloc/rollouts" in r and name != "sara+sera":
                assert r["alloc/n_min"] == r["alloc/n_max"] == 8
            if name in ("sara", "sara+dps", "sara+sera") and "alloc/abandon_error_mean" in r:
                assert 0 <= r["alloc/abandon_error_mean"] <= r["alloc/abandon_error_max"] <= 0.45
            if name == "ds" and "alloc/abandon_error_max" in r:
                assert r["alloc/abandon_error_max"] == 0  # DS drops complete groups: nothing left to be mixed
        if name in ("ds", "sara", "sara+dps"):
            # p ~ 1e-3: the caps (or, for SARA+DPS's 8x pools, one epoch of images a step) end the steps short
            assert any(r["alloc/shortfall"] > 0 for r in rl)
            assert name == "sara+dps" or any(r["alloc/hit_wave_cap"] for r in rl)
        if name == "dps":
            assert all(r["alloc/prompts_drawn"] == 8 * 16 and r["alloc/generated"] == 16 * 8 for r in rl)


def test_image_prompts_take_each_image_once_and_forward_lazily():
    """The classifier's prompt stream: images from the training stream, never twice in a step (the step runs into the
    next epoch), at most one epoch a step, and the softmax computed only for images with rollouts."""
    from experiments.imagenet.data import BatchStream

    x = torch.randn(10, 3)
    stream = BatchStream(10, 4, 0, lambda batches, epoch: ((x[i], torch.arange(10)[i] % 2) for i in batches))
    calls = []
    model = torch.nn.Linear(3, 2)

    def forward(inputs):
        calls.append(len(inputs))
        return model(inputs)

    prompts = policy.ImagePrompts(stream, forward, "cpu")
    assert prompts.take(3).tolist() == [0, 1, 2] and prompts.size() == 3
    prompts.take(20)  # asks for more than the data has: stops after one epoch's worth pulled, no repeat
    assert len(set(prompts.ids.tolist())) == prompts.size() <= 10
    assert calls == []  # nothing forwarded yet
    probs = prompts.probs_for(np.array([4, 1]))
    assert calls == [2]
    with torch.no_grad():
        expected = torch.softmax(model(torch.stack([x[prompts.ids[4]], x[prompts.ids[1]]])), -1)
    torch.testing.assert_close(probs, expected)
    prompts.probs_for(np.array([1, 4]))
    assert calls == [2]  # each image forwarded once
    np.testing.assert_allclose(prompts.p_true([1]), expected[1, prompts.y[1]].item(), rtol=1e-6)


def tiny_image_folder(root: Path, classes: int = 2, per_class: int = 3) -> Path:
    """An ImageFolder `train/` of small random RGB images (what `imagenet_datasets` reads, at toy size)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for c in range(classes):
            (root / split / f"class{c}").mkdir(parents=True)
            for i in range(per_class):
                pixels = rng.integers(0, 256, (40, 56, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(root / split / f"class{c}" / f"{i}.png")
    return root


@pytest.mark.parametrize("workers", [0, 2])
def test_imagefolder_crops_resume_exactly_and_do_not_depend_on_workers(tmp_path, workers):
    """ImageNet's random crops and flips come from (run seed, epoch, image): a stream resumed mid-epoch yields the
    very tensors the uninterrupted stream yields, with or without decoding workers, and the training's own torch RNG
    is left as it was."""
    from experiments.imagenet.data import BatchStream, image_folder_batches, imagenet_datasets

    train, _ = imagenet_datasets(tiny_image_folder(tmp_path))
    whole = BatchStream(len(train), 2, 5, image_folder_batches(train, 0, 5))  # 3 batches an epoch
    torch.manual_seed(0)
    rng_before = torch.get_rng_state()
    batches = [whole.next_batch() for _ in range(5)]  # into the second epoch
    assert torch.equal(torch.get_rng_state(), rng_before)
    torch.manual_seed(123)  # a resumed process's RNG is not the uninterrupted one's
    resumed = BatchStream(len(train), 2, 5, image_folder_batches(train, workers, 5))
    resumed.load_state_dict({"epoch": 0, "pos": 2})
    for idx, x, y in batches[2:]:
        idx2, x2, y2 = resumed.next_batch()
        assert torch.equal(idx, idx2) and torch.equal(x, x2) and torch.equal(y, y2)
    first = {int(i): x[k] for idx, x, _ in batches[:3] for k, i in enumerate(idx)}
    second = {int(i): x[k] for idx, x, _ in batches[3:] for k, i in enumerate(idx)}
    again = [i for i in second if i in first]
    assert again and all(not torch.equal(first[i], second[i]) for i in again)  # a new epoch, new crops
    assert all(x.shape[-2:] == (224, 224) for _, x, _ in batches)


@pytest.mark.slow
def test_finished_run_is_never_overwritten(tmp_path):
    run_cli(tmp_path, "scale=imagenet/smoke", "method=maxrl")
    again = run_cli(tmp_path, "scale=imagenet/smoke", "method=maxrl", check=False)
    assert again.returncode != 0 and "finished run" in again.stderr, again.stderr[-4000:]
    skip = run_cli(tmp_path, "scale=imagenet/smoke", "method=maxrl", "run.if_finished=skip")
    assert "skipping" in skip.stdout
    # a setting that differs from the default is an ablation: its own folder, named by the setting (sera.identity)
    run_cli(tmp_path, "scale=imagenet/smoke", "method=maxrl", "optim.lr=0.1")
    assert sorted(p.name for p in (tmp_path / "imagenet-smoke").iterdir() if not p.name.startswith(".")) == [
        "maxrl_n0-16_optim.lr=0.1_seed-0", "maxrl_n0-16_seed-0"]  # fmt: skip
    # the same folder with another config (run.name reused) is refused, naming the setting and both values
    other = run_cli(tmp_path, "scale=imagenet/smoke", "method=maxrl", "optim.lr=0.2", "run.name=maxrl_n0-16_seed-0",
                    check=False)  # fmt: skip
    assert other.returncode != 0 and "optim.lr: 0.003 there, 0.2 here" in other.stderr, other.stderr[-4000:]
    assert "run.name=" in other.stderr  # and says what to do


def test_bad_cli_input_fails_before_creating_a_run(tmp_path):
    out = run_cli(tmp_path, "scale=imagenet/smoke", "method=sera_pilot", "alloc.n_max=4", check=False)
    assert out.returncode != 0 and "infeasible budget" in out.stderr, out.stderr[-4000:]
    assert not (tmp_path / "imagenet-smoke").exists()
    out = run_cli(tmp_path, "scale=imagenet/huge", check=False)  # Hydra alone would not list the choices
    assert out.returncode != 0 and "unknown scale=imagenet/huge; choose from: imagenet/cpu" in out.stderr, out.stderr
    out = run_cli(tmp_path, "--multirun", "method=sera_pilot,serra", check=False)
    assert out.returncode != 0 and "unknown method=serra" in out.stderr, out.stderr[-4000:]
    assert not tmp_path.joinpath("imagenet-cpu").exists()


def run_twice_one_interrupted(tmp_path, monkeypatch, base: list, scale: str):
    """Run `base` whole under a/, and under b/ killed at step 6 then rerun by the same command; return both runs'
    (metric records without timings, final validation probabilities)."""
    train.run(cfg_for(*base, f"run.root={tmp_path / 'a'}"))

    original_log = train.RunDir.log

    def crash_at_step_6(self, step, metrics):
        if step == 6:
            raise KeyboardInterrupt("simulated kill")
        original_log(self, step, metrics)

    cfg_b = cfg_for(*base, f"run.root={tmp_path / 'b'}")
    monkeypatch.setattr(train.RunDir, "log", crash_at_step_6)
    with pytest.raises(KeyboardInterrupt):
        train.run(cfg_b)
    monkeypatch.setattr(train.RunDir, "log", original_log)
    train.run(cfg_b)  # same command: resumes from the last checkpoint before step 6
    with pytest.raises(RunExistsError):
        train.run(cfg_b)

    def load(root):
        run = next((root / f"imagenet-{scale}").iterdir())
        recs = [{k: v for k, v in r.items() if not k.startswith("time/")} for r in read_jsonl(run / "metrics.jsonl")]
        return recs, np.load(run / "val_p.npy")

    return load(tmp_path / "a"), load(tmp_path / "b")


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sera_pilot", "direct_ce", "sara+dps"])
def test_interrupted_run_resumes_to_identical_metrics(tmp_path, monkeypatch, method):
    base = [
        "scale=imagenet/smoke",
        f"method={method}",
        "method.estimator=history" if method == "sera_pilot" else "seed=0",
        "method.pilot_m=0" if method == "sera_pilot" else "seed=0",
        "threads=1",
    ]
    (rec_a, p_a), (rec_b, p_b) = run_twice_one_interrupted(tmp_path, monkeypatch, base, "smoke")
    assert rec_a == rec_b
    np.testing.assert_array_equal(p_a, p_b)


@pytest.mark.slow
def test_resnet50_on_an_imagefolder_resumes_to_identical_metrics(tmp_path, monkeypatch):
    """The paper scale's code path (an ImageFolder of images, its crops, ResNet-50 from scratch) at toy size on the
    CPU: it trains, evaluates, and a run killed mid-way resumes to the uninterrupted run's records and probabilities
    (its crops included: they differ between epochs, and the kill falls mid-epoch)."""
    folder = tiny_image_folder(tmp_path / "imagenet", per_class=5)  # 10 images: 2 batches of 4 an epoch
    base = [
        "scale=imagenet/paper",
        "device=cpu",
        f"data.root={folder}",
        "data.workers=2",  # decoding workers: their crops must not depend on where the resume began
        "method=maxrl",
        "n0=4",
        "train.batch_size=4",
        "train.epochs=4",
        "eval.every=4",
        "eval.grad_cos_every=4",
        "run.checkpoint_every=5",
        "progress=false",
        "threads=1",
    ]
    (rec_a, p_a), (rec_b, p_b) = run_twice_one_interrupted(tmp_path, monkeypatch, base, "paper")
    assert [r["step"] for r in rec_a] == list(range(8)) and "eval/pass@1" in rec_a[-1]
    assert rec_a == rec_b
    np.testing.assert_array_equal(p_a, p_b)


@pytest.mark.slow
def test_two_process_run_equals_the_one_process_run(tmp_path):
    """The multi-GPU path (torchrun + DistributedDataParallel, gloo on CPU): each of two ranks takes B / 2 images a
    step and DDP averages the gradients, so with the same labels drawn for each image (tests/imagenet_ddp_toy.py) and
    a uniform allocation, two processes train the same classifier as one. Plain SGD, whose step scales with the
    gradient (ranks that summed instead of averaging would not match), on 32 training images, so that 10 CE steps
    lift p enough for the 6 RL steps to see successes and have a gradient."""
    overrides = ["scale=imagenet/smoke", "method=maxrl", "device=cpu", "threads=1", "data.num_train=32"]
    overrides += ["optim.name=sgd", "optim.momentum=0", "optim.lr=0.3", "train.steps=16", "train.warm_start_steps=10"]
    overrides += ["eval.every=8"]
    harness = ["-m", "tests.imagenet_ddp_toy"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
    root = Path(__file__).resolve().parents[1]
    for name, launcher in [("one", [sys.executable]), ("two", torchrun)]:
        cmd = [*launcher, *harness, str(tmp_path / name), *overrides]
        subprocess.run(cmd, env={**ENV, "OMP_NUM_THREADS": "1"}, cwd=root, check=True, capture_output=True, timeout=600)
    runs = [tmp_path / name / "imagenet-smoke" / "maxrl_n0-16_seed-0" for name in ("one", "two")]
    records = [read_jsonl(run / "metrics.jsonl") for run in runs]
    assert all((run / "DONE").exists() for run in runs) and [r["step"] for r in records[1]] == list(range(16))
    assert sum(r.get("alloc/effective_groups", 0) for r in records[0]) > 6  # the RL steps had mixed groups
    np.testing.assert_allclose(np.load(runs[0] / "val_p.npy"), np.load(runs[1] / "val_p.npy"), rtol=1e-4, atol=1e-9)
    evals = [[r["eval/pass@1"] for r in recs if "eval/pass@1" in r] for recs in records]
    assert evals[0] == pytest.approx(evals[1], rel=1e-5) and evals[0][0] != evals[0][1]  # and the model trained


@pytest.mark.slow
def test_one_torchrun_launch_runs_a_sweep_data_parallel_and_skips_it_when_finished(tmp_path):
    """The real entry point's --multirun sweep under one torchrun launch (two gloo processes here, GPUs in
    docs/paper-scale.md), every run data parallel over both: one process group for all its runs (a group started
    again in the same launch would wait forever); launched again, it skips the finished runs."""
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
    cmd = [*torchrun, "-m", "experiments.imagenet.train", "--multirun", "run.if_finished=skip", "threads=1",
           "scale=imagenet/smoke", "device=cpu", "method=direct_ce,maxrl", f"run.root={tmp_path}"]  # fmt: skip
    env = {**ENV, "OMP_NUM_THREADS": "1"}
    root = Path(__file__).resolve().parents[1]
    subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True, timeout=600)
    runs = [tmp_path / "imagenet-smoke" / name for name in ("direct_ce_seed-0", "maxrl_n0-16_seed-0")]
    assert all((run / "DONE").exists() for run in runs)
    assert [r["step"] for r in read_jsonl(runs[1] / "metrics.jsonl")] == list(range(8))
    again = subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True, text=True, timeout=600)
    assert again.stdout.count("is finished with this config; skipping") == 4  # two runs, each on both ranks


def test_the_authors_rule_gradient_averages_to_the_scaled_ce_gradient_with_prompts_left_out():
    """sera through the shipped rollout loss: the images its active set leaves out (a hopeless and a
    saturated one) get no rollouts and no gradient, the others their counts from active_waterline and weights
    n0 / n_i, and the loss keeps the budget B * n0 as its denominator, so the average over many steps is
    (1/B) sum_i c(p_i, n_i) grad log p_i with c = 0 for an image left out (within 5 standard errors)."""
    logits = torch.tensor([[-9.0, 0, 0, 0, 0], [0.5, 0, 0.2, 0, 0], [1.0, 0, 0, -1, 0], [12.0, 0, 0, 0, 0]],
                          requires_grad=True)  # fmt: skip
    y, idx = torch.zeros(4, dtype=torch.long), torch.arange(4)
    logp = torch.log_softmax(logits, -1)
    logp_true = logp[:, 0]
    p = logp_true.exp().detach().double().numpy()
    run = MethodSettings.build(train.STUDY, "sera", 6)
    assert (run.n_min, run.n_max, run.threshold, run.estimator) == (2, 24, 0.05, "oracle")
    gen, draws = torch.Generator().manual_seed(1), []
    for _ in range(3000):
        loss, out = policy.rollout_loss(run, logp, logp_true, idx, y, HistoricalEstimator(4), gen)
        draws.append(torch.autograd.grad(loss, logits, retain_graph=True)[0].reshape(-1))
    counts = np.zeros(4, dtype=np.int64)
    counts[out.collected.prompts] = out.counts
    np.testing.assert_array_equal(counts, active_waterline(p, 24, 2, 24))
    assert counts[0] == counts[3] == 0 and counts.sum() == 24  # left out, and the budget spent on the others
    expected_loss = -(torch.as_tensor(scale_factor(p, counts, 1)) * logp_true.double()).mean()
    expected = torch.autograd.grad(expected_loss, logits)[0].reshape(-1).double()
    draws = torch.stack(draws).double()
    mean, se = draws.mean(0), draws.std(0) / np.sqrt(len(draws))
    assert torch.all(draws.reshape(len(draws), 4, 5)[:, [0, 3]] == 0)  # no gradient through an image left out
    assert torch.all((mean - expected).abs() <= 5 * se + 1e-9)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        (["method=sera", "alloc.threshold=1.5"], "alloc.threshold must lie in"),
        (["method=sera_pilot", "alloc.threshold=0.1"], "alloc.threshold is the authors' active-set rule"),
        (["method=sera", "method.estimator=pilot", "method.pilot_m=8"], "allocates from the exact p"),
        (["method=sera", "method.estimator=beta"], "unavailable in classification"),
        (["method=sera", "method.keep_cv_on_zero=true"], "keep_cv_on_zero must be false"),
    ],
)
def test_the_authors_rule_refuses_settings_it_does_not_have(overrides, match):
    with pytest.raises(ValueError, match=match):
        train.validate(cfg_for(*overrides, "scale=imagenet/smoke"))


def test_gauss1000_starts_every_image_at_one_in_a_thousand():
    cfg = cfg_for("method=maxrl", "scale=imagenet/gauss1000", "data.num_train=2000", "data.num_val=300")
    stream, val_batches, in_features, classes = train.build_task(cfg, 0, 1)
    model = train.build_model("mlp", in_features, classes, [256], zero_head=True)
    x, y = next(iter(val_batches()))
    probs = torch.softmax(model(x), -1)
    assert in_features == 64 and classes == 1000 and x.shape == (300, 64)
    assert torch.equal(probs, torch.full_like(probs, 1 / 1000))
    idx, x_train, _ = stream.next_batch()
    assert x_train.shape == (256, 64) and not torch.equal(x_train[:5], x[:5])


def test_sera_authors_through_the_real_entry_point(tmp_path):
    run_cli(tmp_path, "scale=imagenet/smoke", "method=sera", "n0=16")
    records = read_jsonl(tmp_path / "imagenet-smoke" / "sera_authors-oracle_n0-16_seed-0" / "metrics.jsonl")
    rl = [r for r in records if "alloc/rollouts" in r]
    assert rl and all(r["alloc/rollouts"] == r["alloc/budget"] == 16 * 16 for r in rl)
    assert all(1 <= r["alloc/active"] <= 16 for r in rl) and any(r["alloc/active"] < 16 for r in rl)


def test_the_warm_up_can_be_given_in_epochs_as_the_authors_recipe_does():
    """optim.warmup_epochs: the linear warm-up lasts that many epochs of the training set (the paper scale: 2); it
    replaces optim.warmup_steps, which must then be 0."""
    cfg = cfg_for("scale=imagenet/smoke", "optim.warmup_steps=0", "optim.warmup_epochs=2")
    train.validate(cfg)
    assert train.warmup_steps(cfg.optim, steps_per_epoch=5) == 10
    lrs = [train.lr_at(cfg, step, 0, 100, warmup=10) / cfg.optim.lr for step in (0, 4, 9, 10, 50)]
    assert lrs == pytest.approx([0.1, 0.5, 1.0, 1.0, 1.0])  # smoke's schedule is constant after the warm-up
    assert train.warmup_steps(cfg_for("scale=imagenet/smoke").optim, steps_per_epoch=5) == 2  # warmup_steps as before
    with pytest.raises(ValueError, match="one warm-up length"):
        train.validate(cfg_for("scale=imagenet/smoke", "optim.warmup_epochs=2"))  # smoke keeps warmup_steps=2
    paper = cfg_for("scale=imagenet/paper", "data.root=/nonexistent")
    assert (paper.optim.warmup_steps, paper.optim.warmup_epochs) == (0, 2)


def test_the_paper_scale_decays_from_the_warm_ups_end_as_the_authors_do():
    """The authors' ImageNet recipe: lr 0.1 t/W over a 2-epoch warm-up W, then 0.05 (1 + cos(pi (t - W)/(T - W)))
    over 20 epochs T, Pass@K every 1000 steps. At ImageNet's 5004 steps an epoch (1,281,167 images, batches of 256):
    W = 10008, T = 100080; mid-run (t = T/2) the cosine has gone (10 - 2)/(20 - 2) = 4/9 of its way, 80 degrees."""
    paper = cfg_for("scale=imagenet/paper", "data.root=/nonexistent")
    assert (paper.optim.schedule, paper.eval.every) == ("warmup_cosine", 1000)
    w = train.warmup_steps(paper.optim, steps_per_epoch=5004)
    steps = (0, 5004, 10008, 50040, 55044, 100079)
    lrs = [train.lr_at(paper, t, 0, 20 * 5004, warmup=w) for t in steps]
    cos80 = 0.17364817766693033
    assert w == 10008 and lrs == pytest.approx([0.0, 0.05, 0.1, 0.05 * (1 + cos80), 0.05, 0.0], abs=1e-9)
    smoke = cfg_for("scale=imagenet/smoke", "optim.schedule=cosine")  # the suite's cosine, from the phase's start
    lrs = [train.lr_at(smoke, t, 0, 100, warmup=10) / smoke.optim.lr for t in (0, 25, 50)]
    assert lrs == pytest.approx([0.1, 0.5 + 0.5 * 0.5**0.5, 0.5])


@pytest.mark.slow
def test_two_processes_evaluate_a_batchnorm_model_on_rank_zero_alone(tmp_path):
    """Under torchrun only rank 0 evaluates; a DDP-wrapped model with BatchNorm would make that forward a buffer
    sync the other rank never joins (a hang). The evaluation runs on the unwrapped module: a two-process run with a
    BatchNorm layer evaluates mid-run and at the end and finishes."""
    overrides = ["scale=imagenet/smoke", "method=maxrl", "device=cpu", "threads=1", "data.num_train=32"]
    overrides += ["train.steps=8", "train.warm_start_steps=4", "eval.every=4"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
    cmd = [*torchrun, "-m", "tests.imagenet_ddp_toy", str(tmp_path), *overrides]
    env = {**ENV, "OMP_NUM_THREADS": "1", "SERA_TEST_BATCHNORM": "1"}
    subprocess.run(cmd, env=env, cwd=Path(__file__).resolve().parents[1], check=True, capture_output=True, timeout=300)
    run = tmp_path / "imagenet-smoke" / "maxrl_n0-16_seed-0"
    records = read_jsonl(run / "metrics.jsonl")
    assert (run / "DONE").exists() and sum("eval/pass@1" in r for r in records) == 2


@pytest.mark.slow
def test_two_processes_skip_a_step_together_and_resume_only_as_launched(tmp_path):
    """Under torchrun a non-finite loss on one rank makes every rank skip the step (backward is DDP's all-reduce: a
    rank that skipped alone would leave the other waiting in it), and a checkpoint resumes only under the number of
    processes that wrote it (each rank's RNG streams are its own), with a clear error otherwise."""
    overrides = ["scale=imagenet/smoke", "method=maxrl", "device=cpu", "threads=1", "data.num_train=32"]
    overrides += ["train.steps=8", "train.warm_start_steps=4", "eval.every=4", "run.checkpoint_every=4"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
    root = Path(__file__).resolve().parents[1]
    env = {**ENV, "OMP_NUM_THREADS": "1", "SERA_TEST_NAN_AT": "1,6"}  # rank 1's loss at step 6
    cmd = [*torchrun, "-m", "tests.imagenet_ddp_toy", str(tmp_path), *overrides]
    subprocess.run(cmd, env=env, cwd=root, check=True, capture_output=True, timeout=300)
    run = tmp_path / "imagenet-smoke" / "maxrl_n0-16_seed-0"
    records = read_jsonl(run / "metrics.jsonl")
    assert (run / "DONE").exists()
    assert [r["step"] for r in records if r.get("train/skipped_nonfinite")] == [6]  # rank 0's loss was finite
    (run / "DONE").unlink()  # as if interrupted after its last checkpoint: one process may not take it up
    one = subprocess.run([sys.executable, "-m", "tests.imagenet_ddp_toy", str(tmp_path), *overrides], env=ENV,
                         cwd=root, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert one.returncode != 0 and "written by 2 process(es) and is resumed by 1" in one.stderr


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sera", "sera_pilot"])
def test_two_processes_allocate_the_whole_step_as_one_process_does(tmp_path, method):
    """Under torchrun the allocation is over the step's whole batch, not each rank's half: every rank gathers the
    batch's softmax and draws every image's rollouts from the one label stream, so two processes log the same
    counts, rewards and loss as one (floats to rounding: each rank's forward sees half the batch), and (DDP averaging
    the ranks' shares of the gradient) train the same model.
    The authors' rule leaves images out; SERA with pilots draws its pilots first."""
    overrides = ["scale=imagenet/smoke", f"method={method}", "device=cpu", "threads=1", "data.num_train=32"]
    overrides += ["optim.name=sgd", "optim.momentum=0", "optim.lr=0.3", "train.steps=16", "train.warm_start_steps=10"]
    overrides += ["eval.every=8", "eval.grad_cos_every=1000"]
    torchrun = [str(Path(sys.executable).with_name("torchrun")), "--standalone", "--nproc_per_node=2"]
    root = Path(__file__).resolve().parents[1]
    for name, launcher in [("one", [sys.executable]), ("two", torchrun)]:
        cmd = [*launcher, "-m", "tests.imagenet_ddp_toy", str(tmp_path / name), *overrides]
        subprocess.run(cmd, env={**ENV, "OMP_NUM_THREADS": "1"}, cwd=root, check=True, capture_output=True, timeout=600)
    runs = [next((tmp_path / name / "imagenet-smoke").iterdir()) for name in ("one", "two")]
    records = [read_jsonl(run / "metrics.jsonl") for run in runs]
    rl = [[r for r in recs if "alloc/budget" in r] for recs in records]
    assert len(rl[0]) == len(rl[1]) == 6
    for one, two in zip(*rl, strict=True):
        for key in one:  # counts exactly; floats (from each rank's forward of half the batch) to rounding
            if isinstance(one[key], int) and key.startswith("alloc/"):
                assert one[key] == two[key], key
            elif key.startswith("alloc/") or key == "train/reward":
                assert one[key] == pytest.approx(two[key], rel=1e-4), key
        assert one["train/loss"] == pytest.approx(two["train/loss"], rel=1e-4)
    assert any(r["alloc/n_min"] != r["alloc/n_max"] for r in rl[0])  # the counts were unequal
    np.testing.assert_allclose(np.load(runs[0] / "val_p.npy"), np.load(runs[1] / "val_p.npy"), rtol=1e-4, atol=1e-9)
