"""Numbers README quotes that come from logged metrics or pooled runs, each against a direct computation here: the
seed pooling of the SERA-minus-MaxRL rows (classifier and maze), Table 3's MAE, the saturated share, the LM
evaluation's logged pass@k against sera.passk on its saved per-question records, and response log-probs at a
temperature other than 1."""

import itertools
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from experiments.imagenet import policy
from paper_figures import imagenet, maze, sara
from sera.estimation import HistoricalEstimator
from sera.lm_loop import LoopSettings, evaluate
from sera.methods import MethodSettings
from sera.passk import pass_at_k
from sera.rollout import HFEngine, Rollouts, response_logprobs
from sera.runlog import read_jsonl
from sera.stats import paired_bootstrap_ci
from tests.test_lm import EOS, PAD, PROMPTS, ToyTask, loop_cfg, run_toy, tiny_model
from tests.test_paper_figures_imagenet import make_run, read_csv_rows
from tests.test_paper_figures_maze import maze_run
from tests.test_paper_figures_sara import step, write_run


def cell(diff_per_seed: list[np.ndarray], ci) -> str:
    """'+d [+lo, +hi]' in pp: d the mean over seeds of each seed's mean difference."""
    return f"{100 * np.mean([d.mean() for d in diff_per_seed]):+.2f} [{100 * ci.low:+.2f}, {100 * ci.high:+.2f}]"


def test_classifier_verdict_pools_pass_at_k_per_image_over_seeds(tmp_path):
    """Three seeds: the pooled dPass@k is the mean over seeds of each seed's mean difference, and its interval
    resamples images of the seed-averaged per-image Pass@k (README: "Pass@k per image computed per seed, then
    averaged over seeds"). At k = 1024 averaging p over seeds first would give another number."""
    rng = np.random.default_rng(1)
    p = {m: rng.beta(0.3, 0.3, size=(3, 50)) for m in ("sera_pilot", "maxrl")}  # (seeds, images), far apart per seed
    for method, seed in itertools.product(("sera_pilot", "maxrl"), range(3)):
        make_run(tmp_path, method, seed=seed, val_p=p[method][seed])
    imagenet.table2(tmp_path, "cpu", tmp_path / "out")
    verdict = (tmp_path / "out" / "imagenet-cpu" / "table2_verdict.md").read_text()
    (row,) = [line for line in verdict.splitlines() if line.startswith("| 16 |")]
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "3 vs 3"
    for k, got in [(1, cells[2]), (1024, cells[3])]:
        passk = {m: 1 - (1 - v) ** k for m, v in p.items()}  # (seeds, images)
        ci = paired_bootstrap_ci(passk["sera_pilot"].mean(0), passk["maxrl"].mean(0))
        assert got == cell([passk["sera_pilot"][s] - passk["maxrl"][s] for s in range(3)], ci)
    pooled_p = {m: 1 - (1 - v.mean(0)) ** 1024 for m, v in p.items()}
    assert cells[3].split()[0] != f"{100 * (pooled_p['sera_pilot'] - pooled_p['maxrl']).mean():+.2f}"


def test_maze_verdict_pools_pass_at_k_per_maze_over_seeds(tmp_path):
    """Two seeds per method: the `all` row is the mean over seeds of each seed's mean difference per k, with the
    interval over mazes of the seed-averaged Pass@k."""
    rng = np.random.default_rng(2)
    correct = {(m, s): rng.integers(0, 65, 20) for m in ("sera_pilot", "maxrl") for s in range(2)}
    for (method, seed), c in correct.items():
        maze_run(tmp_path, f"{method}_seed-{seed}", method, c.tolist(), seed=seed)
    text = maze.table4(tmp_path, "cpu", tmp_path / "out")
    ks = [1, 2, 4, 8, 16, 32, 64]
    per_seed = {key: pass_at_k(64, c, ks) for key, c in correct.items()}  # (mazes, K)
    pooled = {m: (per_seed[(m, 0)] + per_seed[(m, 1)]) / 2 for m in ("sera_pilot", "maxrl")}
    ci = paired_bootstrap_ci(pooled["sera_pilot"], pooled["maxrl"])
    diffs = [per_seed[("sera_pilot", s)] - per_seed[("maxrl", s)] for s in range(2)]
    expected = [cell([d[:, j] for d in diffs], SimpleNamespace(low=ci.low[j], high=ci.high[j])) for j in range(len(ks))]
    assert f"| token-mean | {' | '.join(expected)} |" in text


def test_table3_mae_is_the_seed_mean_of_each_runs_last_epoch(tmp_path):
    """Seed 0 logs an epoch of 4 steps (MAE 0.1 .. 0.4: mean 0.25), seed 1 an epoch of 2 (0.3, 0.4: mean 0.35): the
    row is 0.30, not the mean of all six steps (0.283) nor one seed's."""
    make_run(tmp_path, "sera_pilot", seed=0, m=2)
    make_run(tmp_path, "sera_pilot", seed=1, m=2, final={"train/steps_per_epoch": 2})
    imagenet.table3(tmp_path, "cpu", tmp_path / "out")
    (row,) = [r for r in read_csv_rows(tmp_path / "out" / "imagenet-cpu" / "table3.csv") if r["m"] == "2"]
    assert row["seeds"] == "2" and float(row["MAE"]) == pytest.approx(0.30, abs=1e-4)


def test_logged_mae_and_saturated_share():
    """A SERA step with 2 pilots on a linear classifier: phat/mae is the mean |p_hat - p| over the step's images
    (p_hat = the clipped pilot success rate, p = softmax[y]); alloc/saturated_share is the probability that a fresh
    group of n0 = 8 rollouts has all-equal rewards, averaged over images: the sum over all 2^8 reward patterns."""
    settings = MethodSettings.from_config(loop_cfg("sera_pilot", "pilot", 2), policy.STUDY)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6).double()
    x, y, idx = torch.randn(8, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1]), torch.arange(8)
    with torch.no_grad():
        model.weight[y, torch.arange(8) % 4] += 3 * torch.arange(8, dtype=torch.float64) / 7  # p from low to high
    logp = torch.log_softmax(model(x), -1)
    logp_true = logp.gather(1, y[:, None])[:, 0]
    p = logp_true.detach().exp().numpy()
    rows, labels, _ = policy.draw_rollouts(
        settings, logp.detach().exp(), p, idx, y.numpy(), None, torch.Generator().manual_seed(5)
    )
    loss, out = policy.rollout_loss(
        settings, logp, logp_true, idx, y, HistoricalEstimator(8), torch.Generator().manual_seed(5)
    )
    metrics = policy.step_metrics(settings, out, loss.item(), 8)
    counts = np.bincount(rows, minlength=8)
    first = np.cumsum(counts) - counts
    pilots_won = labels[first[:, None] + np.arange(2)] == y.numpy()[:, None]  # (B, m): the first m of each group
    p_hat = np.clip(pilots_won.mean(1), 1 / 16, 15 / 16)
    assert len(set(p_hat)) > 1
    assert metrics["phat/mae"] == pytest.approx(np.mean([abs(a - b) for a, b in zip(p_hat, p, strict=True)]))
    patterns = np.array(list(itertools.product([0, 1], repeat=8)))  # (256, 8)
    equal = (patterns.min(1) == patterns.max(1)).astype(float)
    k = patterns.sum(1)
    share = [float((equal * q**k * (1 - q) ** (8 - k)).sum()) for q in p]
    assert metrics["alloc/saturated_share"] == pytest.approx(np.mean(share), rel=1e-12)


def test_sara_note_averages_the_saturated_share_over_steps_then_seeds(tmp_path):
    root = tmp_path / "imagenet-x"
    write_run(root, "grpo", [step(100, 100, 20, **{"alloc/saturated_share": s}) for s in (0.7, 0.9, 0.8, 0.8)])
    write_run(root, "grpo", [step(100, 100, 20, **{"alloc/saturated_share": s}) for s in (0.9, 0.9)], seed=1)
    text = sara.build(tmp_path, "x", tmp_path / "out")
    assert "all-equal rewards], exact p, mean over RL steps): 85.0%." in text  # (0.80 + 0.90) / 2


def test_lm_evaluation_logs_pass_at_k_of_its_saved_records(tmp_path):
    """Every logged eval/<set>/pass@k of a toy run equals sera.passk over the per-question record it saved."""
    cfg = loop_cfg("sera_pilot", "pilot", 2, steps=4)
    run_toy(cfg, tmp_path / "run")
    checked = 0
    for record in read_jsonl(tmp_path / "run" / "metrics.jsonl"):
        for name in ("pair", "single"):
            if f"eval/{name}/pass@1" not in record:
                continue
            saved = json.loads((tmp_path / "run" / f"eval_step{record['step'] + 1}_{name}.json").read_text())
            values = pass_at_k(saved["n"], np.array(saved["correct"]), [1, 2, 8]).mean(axis=0)
            for k, value in zip([1, 2, 8], values, strict=True):
                assert record[f"eval/{name}/pass@{k}"] == pytest.approx(value, abs=1e-12)
                checked += 1
    assert checked == 2 * 2 * 3  # evaluations at steps 2 and 4, two sets, three k


class CountingEngine:
    """Evaluation samples whose first token is 3 (the toy task's success) for the first c_q samples of question q."""

    def __init__(self, successes: dict[tuple, int]):
        self.successes = successes

    def generate(self, prompts, counts, max_new_tokens, generator, temperature=None, top_p=1.0):
        rows, first = [], []
        for i, (prompt, count) in enumerate(zip(prompts, counts, strict=True)):
            rows += [i] * int(count)
            first += [3 if j < self.successes[tuple(prompt)] else 5 for j in range(int(count))]
        tokens = torch.tensor([[t, EOS] for t in first])
        return Rollouts(torch.tensor(rows), tokens, torch.ones_like(tokens), torch.zeros(tokens.shape))


def test_lm_evaluation_counts_and_pass_at_k_on_known_outcomes():
    ls = LoopSettings.from_config(loop_cfg())
    engine = CountingEngine({(1, 2): 0, (1, 3): 5, (1, 4, 5): 8})
    metrics, records = evaluate(ls, ToyTask(), engine, torch.Generator())
    assert records["pair"]["correct"] == [0, 5] and records["single"]["correct"] == [8]
    for k in (1, 2, 8):
        assert metrics[f"eval/pair/pass@{k}"] == pytest.approx(pass_at_k(8, np.array([0, 5]), k).mean())
    assert metrics["eval/pair/pass@1"] == pytest.approx(5 / 16) and metrics["eval/single/pass@8"] == 1.0


def test_logprobs_at_temperature_07():
    """The sampling-time log-probs and the loss's recomputed ones at T = 0.7 are log_softmax(logits / 0.7) of a
    plain forward pass, and differ from T = 1's."""
    model = tiny_model()
    out = HFEngine(model, EOS, PAD).generate(PROMPTS, [2, 2, 2], 6, torch.Generator().manual_seed(4), temperature=0.7)
    recomputed = response_logprobs(model, PROMPTS, out, PAD, temperature=0.7)
    torch.testing.assert_close(recomputed * out.mask, out.logprobs * out.mask, atol=1e-5, rtol=0)
    for r in range(6):
        prompt = PROMPTS[int(out.prompt_index[r])]
        response = out.tokens[r][out.mask[r].bool()]
        logits = model(torch.tensor([prompt + response.tolist()])).logits[0, len(prompt) - 1 : -1]
        plain = torch.log_softmax(logits / 0.7, -1).gather(1, response[:, None])[:, 0]
        torch.testing.assert_close(recomputed[r, : len(response)], plain, atol=1e-5, rtol=0)
    at_one = response_logprobs(model, PROMPTS, out, PAD, temperature=1.0)
    assert ((at_one - recomputed).abs() * out.mask).max() > 1e-2
