"""Sequential rollout allocation and prompt selection: SARA, DS (DAPO dynamic sampling) and DPS (docs/design.md
section 4).

Pure numpy (no torch, no I/O). SARA probes each prompt with a few rollouts, keeps a Beta posterior over its pass rate,
and commits, abandons or probes further by the closed-form probability that the full group ends mixed
(`effective_probability`, `sara_decision`) under a Beta prior that is flat, fitted to the population's recent probes, or
that plus the prompt's own history (`SaraPrior`, `fit_beta_prior`); `sara_step` runs one training step of it in
batched waves, vectorised over the step's groups. `ds_step` is the dynamic-sampling baseline, `DynamicsPredictor`
and `dps_order` are DPS's per-prompt three-state chain and its top-B selection (`dps_prompts`: a prompt stream ranked
by it). Both step loops talk to the model only through two callbacks, `draw(prompt_ids, counts) -> rewards`
(flat, grouped by prompt in order) and `next_prompts(k) -> up to k prompt ids`, so they run the same against a
simulator in the tests and an LM rollout engine in training; both return a `StepResult` with the accounting every
method reports (rollouts generated and trained, groups kept and dropped).
"""

from __future__ import annotations

from sera.sequential.common import PRIOR_CLIP, PRIORS, Draw, NextPrompts, SequentialSettings, StepResult
from sera.sequential.dps import PARTIAL, SOLVED, UNSOLVED, DynamicsPredictor, dps_order, dps_prompts
from sera.sequential.ds import ds_step
from sera.sequential.sara import (
    SaraAction,
    SaraPrior,
    effective_probability,
    fit_beta_prior,
    mixed_probability,
    sara_decision,
    sara_step,
    sera_counts_after_probe,
)

__all__ = [
    "PARTIAL", "PRIORS", "PRIOR_CLIP", "SOLVED", "UNSOLVED", "Draw", "DynamicsPredictor", "NextPrompts",
    "SaraAction", "SaraPrior", "SequentialSettings", "StepResult", "dps_order", "dps_prompts", "ds_step",
    "effective_probability", "fit_beta_prior", "mixed_probability", "sara_decision", "sara_step",
    "sera_counts_after_probe",
]  # fmt: skip
