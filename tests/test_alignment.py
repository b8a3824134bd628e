"""Table 2's alignment columns: the noise-free scale expected_scale (against exhaustive enumeration of every label
sequence of a tiny softmax policy) and the logged grad/cos_ce and grad/cos_expected_ce (against cosines computed
here in closed form for a linear classifier, from the step's own rollouts)."""

import itertools

import numpy as np
import pytest
import torch

from experiments.imagenet import policy
from sera.advantages import ADVANTAGES, expected_scale
from sera.estimation import HistoricalEstimator
from sera.methods import MethodSettings
from tests.test_lm import loop_cfg

CASES = [("maxrl", {}), ("maxrl", {"keep_cv_on_zero": True}), ("grpo", {}), ("dr_grpo", {}), ("rloo", {})]
CASES += [("pkpo", {"k": 2})]


def enumerated_gradient(logits: np.ndarray, n: int, name: str, kwargs: dict) -> np.ndarray:
    """E[(1/n) sum_j A_j grad_logits log pi(y_j)] over all C^n label sequences (true label 0), exactly."""
    pi = np.exp(logits - logits.max())
    pi /= pi.sum()
    eye = np.eye(pi.size)
    total = np.zeros(pi.size)
    for labels in itertools.product(range(pi.size), repeat=n):
        prob = np.prod(pi[list(labels)])
        rewards = np.array([float(y == 0) for y in labels])
        adv = ADVANTAGES[name](rewards, np.array([n]), **kwargs)
        total += prob * sum(a * (eye[y] - pi) for a, y in zip(adv, labels, strict=True)) / n
    return total


@pytest.mark.parametrize(
    "name, kwargs", CASES, ids=[f"{n}{'-cv' if k.get('keep_cv_on_zero') else ''}" for n, k in CASES]
)
def test_expected_scale_matches_exhaustive_enumeration(name, kwargs):
    """E[step gradient] = kappa(p, n) grad log p as a vector (every logit), with kappa from expected_scale, for prompts
    of several group sizes in one call."""
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(5, 3)) * np.array([[2.0], [1.0], [0.5], [1.5], [3.0]])
    sizes = np.array([2, 3, 4, 2, 5])
    pi = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    kappa = expected_scale(name, pi[:, 0], sizes, **kwargs)
    for b in range(5):
        grad_log_p = np.eye(3)[0] - pi[b]
        np.testing.assert_allclose(enumerated_gradient(logits[b], sizes[b], name, kwargs), kappa[b] * grad_log_p,
                                   atol=1e-12, rtol=1e-9)  # fmt: skip
    if name == "maxrl":  # and docs/design.md section 1's closed form c(p, n) = 1 - (1 - p)^(n - delta)
        delta = 0 if kwargs.get("keep_cv_on_zero") else 1
        np.testing.assert_allclose(kappa, 1 - (1 - pi[:, 0]) ** (sizes - delta), rtol=1e-12)


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("method, estimator, m", [("maxrl", "none", 0), ("sera_pilot", "pilot", 2)])
def test_logged_cosines_match_closed_form_gradients(method, estimator, m):
    """A linear classifier logits = W x + b: grad log pi(l | x) = (e_l - pi) (x, 1). The step's gradient is
    (1/N) sum_ij w_i A_ij (e_l_ij - pi_i)(x_i, 1), its expectation given the counts (1/N) sum_i w_i n_i c(p_i, n_i)
    (e_y_i - pi_i)(x_i, 1), and the CE gradient (1/B) sum_i (e_y_i - pi_i)(x_i, 1); the logged cosines and norm ratio
    are theirs."""
    settings = MethodSettings.from_config(loop_cfg(method, estimator, m), policy.STUDY)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 6).double()
    x, y, idx = torch.randn(8, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 4, 5, 0, 1]), torch.arange(8)
    with torch.no_grad():
        model.weight[y, torch.arange(8) % 4] += 1.5  # some images are easy, so pilots see both outcomes
    logp = torch.log_softmax(model(x), -1)
    logp_true = logp.gather(1, y[:, None])[:, 0]
    generator = torch.Generator().manual_seed(3)
    rows, labels, collected = policy.draw_rollouts(
        settings, logp.detach().exp(), logp_true.detach().exp().numpy(), idx, y.numpy(), None, generator
    )
    loss, out = policy.rollout_loss(settings, logp, logp_true, idx, y, HistoricalEstimator(8), generator.manual_seed(3))
    metrics = policy.gradient_alignment(settings, loss, -logp_true.mean(), logp_true, out, list(model.parameters()))

    counts = np.bincount(rows, minlength=8)
    np.testing.assert_array_equal(counts, out.counts)  # the same draws as the step's
    assert (method == "sera_pilot") == (len(set(counts)) > 1)
    pi, xs = logp.detach().exp().numpy(), np.hstack([x.numpy(), np.ones((8, 1))])  # (B, C), (B, D + 1)

    def grad_log(i, label):  # d log pi(label | x_i) / d (W, b), flattened as (C, D + 1)
        return np.outer(np.eye(6)[label] - pi[i], xs[i]).ravel()

    rewards = (labels == y.numpy()[rows]).astype(float)
    step = np.zeros(6 * 5)
    for i in range(8):
        r = rewards[rows == i]
        mean = r.mean()
        w = settings.n0 / counts[i] if method == "sera_pilot" else 1.0
        for label, r_ij in zip(labels[rows == i], r, strict=True):
            step += w * ((r_ij - mean) / mean if mean > 0 else 0.0) * grad_log(i, label) / counts.sum()
    p = pi[np.arange(8), y.numpy()]
    c = 1 - (1 - p) ** (counts - 1)  # MaxRL's c(p, n), delta = 1
    w = settings.n0 / counts if method == "sera_pilot" else np.ones(8)
    expected = sum(w[i] * counts[i] * c[i] * grad_log(i, y[i]) for i in range(8)) / counts.sum()
    ce = sum(grad_log(i, y[i]) for i in range(8)) / 8
    # (W, b) flattened in the order the model's parameters are: weight (C, D), then bias (C,)
    order = np.concatenate([np.arange(30).reshape(6, 5)[:, :4].ravel(), np.arange(30).reshape(6, 5)[:, 4]])
    assert metrics["grad/cos_ce"] == pytest.approx(cosine(step[order], ce[order]), abs=1e-9)
    assert metrics["grad/cos_expected_ce"] == pytest.approx(cosine(expected[order], ce[order]), abs=1e-9)
    assert metrics["grad/norm_ratio"] == pytest.approx(np.linalg.norm(step) / np.linalg.norm(ce), rel=1e-9)
