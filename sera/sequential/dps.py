"""DPS, dynamics-predictive sampling (docs/design.md section 4): each prompt's three-state chain with decay and
the top-B selection by predicted P(partial). Pure numpy.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from sera.sequential.common import NextPrompts

# ----------------------------------------------------------------------------------------------------------------------
# DPS: dynamics-predictive sampling

UNSOLVED, PARTIAL, SOLVED = 0, 1, 2  # DPS's three states of a prompt's group: K = 0, 0 < K < n, K = n


def _transition(alpha: np.ndarray) -> np.ndarray:
    """Phi(alpha): Dirichlet means, column-stochastic, Phi[..., i, j] = P(next state i | previous state j)."""
    return alpha / alpha.sum(axis=-2, keepdims=True)


class DynamicsPredictor:
    """DPS's per-prompt three-state chain (unsolved, partial, solved) with Dirichlet transition counts.

    Each prompt has alpha (3, 3) (prior alpha0 everywhere), a belief mu over its state at its last step (uniform
    initially) and the prior over its next state. `update` observes some prompts' groups, with e the observed state
    (one-hot) and lam = decay:
        xi[i, j] = e[i] Phi(alpha)[i, j] mu[j] / sum(.)            (Phi before this update)
        alpha <- lam alpha + (1 - lam) alpha0 + xi,   mu <- e,   prior <- Phi(alpha) e;
    every other tracked prompt: alpha <- lam alpha + (1 - lam) alpha0, mu <- prior, prior <- Phi(alpha) mu.
    As in maoyixiu/DPS (recipe/dps/task_sampler.py), mu is the belief at the prompt's previous step: the observed
    state after an observation, the propagated prior after a step without one. A prompt never observed keeps alpha0
    and the uniform belief (a fixed point of the decay), so only observed prompts are tracked. Reference values: one
    partial observation gives P(partial) = 0.40, one unsolved or solved 0.30, unseen 1/3. Prompts are integer ids in
    [0, num_prompts). docs/design.md section 4.
    """

    def __init__(self, num_prompts: int, decay: float, alpha0: float = 1.0):
        if not 0 <= decay <= 1:
            raise ValueError(f"decay must lie in [0, 1], got {decay}")
        if alpha0 <= 0:
            raise ValueError(f"alpha0 must be > 0, got {alpha0}")
        self.decay, self.alpha0 = decay, alpha0
        self.alpha = np.full((num_prompts, 3, 3), alpha0)  # (P, 3, 3)
        self.belief = np.full((num_prompts, 3), 1 / 3)  # (P, 3) mu
        self.prior = np.full((num_prompts, 3), 1 / 3)  # (P, 3) over the next group's state
        self.tracked = np.zeros(num_prompts, dtype=bool)

    def partial_probability(self, ids) -> np.ndarray:
        """Prior probability (B,) that each prompt's next group is partial (0 < K < n)."""
        return self.prior[np.asarray(ids, dtype=np.int64), PARTIAL]

    def _decayed(self, alpha: np.ndarray) -> np.ndarray:
        # alpha0 + lam (alpha - alpha0) = lam alpha + (1 - lam) alpha0, exact at alpha = alpha0
        return self.alpha0 + self.decay * (alpha - self.alpha0)

    def update(self, ids, successes, n) -> None:
        """Observe the groups of prompts ids (B,), unique: successes (B,) out of n (scalar or (B,)) rollouts each."""
        ids = np.asarray(ids, dtype=np.int64).reshape(-1)
        k = np.asarray(successes).reshape(-1)
        n = np.broadcast_to(np.asarray(n), k.shape)
        if ids.shape != k.shape or np.unique(ids).size != ids.size:
            raise ValueError("update needs unique prompt ids and one success count per id")
        if np.any(k < 0) or np.any(k > n):
            raise ValueError("successes must lie in [0, n]")
        state = np.where(k == 0, UNSOLVED, np.where(k == n, SOLVED, PARTIAL))  # (B,)
        unobserved = self.tracked.copy()
        unobserved[ids] = False
        rest = np.flatnonzero(unobserved)
        self.alpha[rest] = self._decayed(self.alpha[rest])
        self.belief[rest] = self.prior[rest]
        self.prior[rest] = np.einsum("pij,pj->pi", _transition(self.alpha[rest]), self.belief[rest])
        rows = np.arange(ids.size)
        weight = _transition(self.alpha[ids])[rows, state, :] * self.belief[ids]  # (B, 3): xi's only nonzero row
        xi = np.zeros((ids.size, 3, 3))
        xi[rows, state, :] = weight / weight.sum(axis=1, keepdims=True)
        self.alpha[ids] = self._decayed(self.alpha[ids]) + xi
        self.belief[ids] = np.eye(3)[state]
        self.prior[ids] = _transition(self.alpha[ids])[rows, :, state]
        self.tracked[ids] = True

    def state_dict(self) -> dict:
        return {k: getattr(self, k).copy() for k in ("alpha", "belief", "prior", "tracked")}

    def load_state_dict(self, state: dict) -> None:
        for key in ("alpha", "belief", "prior", "tracked"):
            value = np.asarray(state[key])
            if value.shape != getattr(self, key).shape:
                raise ValueError(f"{key} has shape {value.shape}, expected {getattr(self, key).shape}")
            setattr(self, key, value.astype(getattr(self, key).dtype).copy())


def dps_order(predictor: DynamicsPredictor, candidate_ids, batch_size: int) -> np.ndarray:
    """DPS selection as positions: the batch_size candidates (C,) with the highest prior P(partial), best first,
    (B,) int64 indices into candidate_ids.

    Ties keep the candidates' order in the pool (a stable sort), so the pool's own order (normally a random draw)
    breaks them and the result is deterministic given the pool. docs/design.md section 4.
    """
    candidate_ids = np.asarray(candidate_ids, dtype=np.int64).reshape(-1)
    if not 0 <= batch_size <= candidate_ids.size:
        raise ValueError(f"cannot select {batch_size} of {candidate_ids.size} candidates")
    return np.argsort(-predictor.partial_probability(candidate_ids), kind="stable")[:batch_size]


def dps_prompts(
    predictor: DynamicsPredictor,
    candidates: NextPrompts,
    ratio: int,
    prompt_ids: Callable[[np.ndarray], np.ndarray] | None = None,
) -> NextPrompts:
    """A DPS-ranked prompt stream (DPS and SARA+DPS): next_prompts(k) draws a pool of ratio * k candidates from
    `candidates` and returns its top k by P(partial) (`dps_order`); unselected candidates are dropped. `prompt_ids`
    maps the candidates to the predictor's prompt ids when they are not the same (a step's stream hands out step
    positions); by default they are. docs/design.md section 4."""
    if ratio < 1:
        raise ValueError(f"ratio must be >= 1, got {ratio}")

    def next_prompts(k: int) -> np.ndarray:
        pool = np.asarray(candidates(ratio * k), dtype=np.int64).reshape(-1)
        ids = pool if prompt_ids is None else prompt_ids(pool)
        return pool[dps_order(predictor, ids, min(k, pool.size))]

    return next_prompts
