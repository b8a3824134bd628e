"""What each rollout allocator needs, as data: the registry that validation (sera.methods), the loops and the tables
read, so nothing else names an allocator. A method's registry entry (sera.methods.METHODS) names its allocator here;
the allocator's collection function is `sera.collect.COLLECTORS`' entry of the same name. Pure data; docs/design.md
sections 2-4.
"""

from __future__ import annotations

from dataclasses import dataclass

# The method.sequential settings each sequential allocator reads (SequentialSettings fields): run-config comparison
# and run names look only at these, so a setting an allocator ignores never tells two of its runs apart.
DS_READS = ("gen_batch", "max_rounds")
DPS_READS = ("dps_ratio", "dps_decay")
SARA_READS = ("k0", "k_min", "chunk", "tau_lo", "tau_hi", "prior", "a0", "b0", "window", "history_decay", "max_waves",
              "mode")  # fmt: skip


@dataclass(frozen=True)
class Sampler:
    """A rollout allocator: what it needs from the study and the step. Validation (sera.methods), the loops and the
    tables read these flags; nothing else names an allocator. Its collection function is sera.collect.COLLECTORS'."""

    p_hat: bool = False  # allocates from an estimate p_hat, so the method needs method.estimator != none
    stream: bool = False  # takes prompts from a stream during the step (sequential: DS, DPS, SARA)
    predictor: bool = False  # ranks prompts by DPS's predictor, which needs prompts that recur
    prior: bool = False  # decides by SARA's rule under its Beta prior, carried across steps
    reads: tuple[str, ...] = ()  # the method.sequential settings it reads
    unequal_counts: bool = False  # n_i can differ between prompts, so the multiplicity correction means something
    cap: tuple[str, str] | None = None  # (the method.sequential setting that caps a step's draws, its unit)


DS_CAP, SARA_CAP = ("max_rounds", "rounds"), ("max_waves", "waves")  # generation rounds / waves a step at most
SAMPLERS = {
    "none": Sampler(),  # Direct CE: no rollouts
    "uniform": Sampler(),
    "waterline": Sampler(p_hat=True, unequal_counts=True),
    "active": Sampler(p_hat=True, unequal_counts=True),  # the authors' rule: active set, some prompts get none
    "dars_hw": Sampler(unequal_counts=True),
    "ds": Sampler(stream=True, reads=DS_READS, cap=DS_CAP),
    "dps": Sampler(stream=True, predictor=True, reads=DPS_READS),
    "sara": Sampler(stream=True, prior=True, reads=SARA_READS, cap=SARA_CAP),
    "sara+dps": Sampler(stream=True, predictor=True, prior=True, reads=SARA_READS + DPS_READS, cap=SARA_CAP),
    "sara+sera": Sampler(stream=True, unequal_counts=True, prior=True, reads=SARA_READS, cap=SARA_CAP),
}
