"""The never-solved sink: where a run's rollouts go on a fixed training pool read in epochs, and a guard against the
authors' rule spending them on prompts it has never seen solved (claim C5, results/cpu/PLAN_SINK.md).

`SinkMonitor` watches any method's steps on such a pool through its own Beta history (the authors' prior 0.5/0.5 and
discount 0.75, fed every step's outcomes; the method's own estimator is untouched, so its records do not change) and
reports, each step from the second epoch on, the share of the step's rollouts given to prompts never solved so far;
at each epoch's end, the training pool's success in that epoch by the p_hat bin each prompt was read at. When more than
half of an epoch's rollouts went to never-solved prompts it warns once for that epoch (`SinkWarning`), naming the
remedies and what each has measured so far (EVIDENCE). Pure numpy: the suite's LM loop and `sera.trl.SERAGRPOTrainer`
both call it.
"""

from __future__ import annotations

import warnings

import numpy as np

from sera.estimation import BetaHistory

# p_hat bins of the epoch-end success (the Beta mean an epoch froze; the first epoch has none): edges, right-open
BINS = (0.0, 0.05, 0.2, 0.4, 0.6, 0.8, 1.0)
WARN_SHARE = 0.5  # the guard: more than this share of an epoch's rollouts on never-solved prompts
REMEDIES = (
    "on the maze pool (claim C5) the authors' rule, spending its budget on such prompts, starved the learnable ones "
    "and ended far below MaxRL; remedies under test (results/cpu/PLAN_SINK.md, docs/troubleshooting.md 'When SERA "
    "hurts'): alloc.never_solved=leave_out (never-solved prompts get no rollouts) or =cap (at most n0 each), "
    "alloc.n_min=4 (a floor for the others), alloc.uniform_epochs=3 (more uniform epochs before the history is "
    "read), or a stronger base model"
)
# What the plan's interventions have measured so far, as results/cpu/sink/interventions.csv gives it (exploratory; a
# test holds this to the committed table, so the warning never quotes a number the archive does not give):
# (intervention, its setting, seeds, SERA minus MaxRL in pp at C5's endpoint [seed 95% t], the authors' rule on those
# seeds, the plan's reading)
EVIDENCE = (
    (
        "leave_out",
        "alloc.never_solved=leave_out",
        4,
        "-3.34 [-11.63, +4.95]",
        "-37.79 [-73.61, -1.96]",
        "in progress (4 of 6 seeds)",
    ),
    ("floor", "alloc.n_min=4", 2, "-41.46 [-53.83, -29.08]", "-44.85 [-357.75, +268.04]", "in progress (2 of 6 seeds)"),
)


def evidence() -> str:
    """EVIDENCE in words, for the warning."""
    if not EVIDENCE:
        return "; none has measured anything yet (results/cpu/sink/interventions.md)"
    measured = "; ".join(
        f"{setting}: {diff} over {seeds} seed{'s' * (seeds > 1)} (the authors' rule {rule}), {reading}"
        for _, setting, seeds, diff, rule, reading in EVIDENCE
    )
    shown = [name for name, *_, reading in EVIDENCE if "removes the sink" in reading or "helps" in reading]
    verdict = f"shown to work: {', '.join(shown)}" if shown else "none yet shown to work at the plan's seeds"
    return (
        "; measured so far on the maze pool (exploratory, SERA minus MaxRL in pp at held-out Pass@32, step 800, "
        f"results/cpu/sink/interventions.md): {measured}; {verdict}"
    )


class SinkWarning(UserWarning):
    """More than half of an epoch's rollouts went to prompts never solved so far."""


def bin_label(lo: float, hi: float) -> str:
    return f"{lo:g}-{hi:g}"


class SinkMonitor:
    """Sink measures of a run on a fixed pool of `num_prompts` prompts read in epochs. Call `start(epoch)` before a
    step's collection (returns the ended epoch's measures when `epoch` is a new one), then `observe(ids, prompts,
    counts, successes)` after it. State for resume: `state_dict` / `load_state_dict`."""

    def __init__(self, num_prompts: int, warn_share: float = WARN_SHARE):
        self.history = BetaHistory(num_prompts)  # the authors' defaults: what their rule would read
        self.warn_share = float(warn_share)
        self.warn = True  # False on all processes but one, where every process watches the same global batch
        self.epoch_rollouts = 0  # this epoch's rollouts, and those on prompts never solved when the step began
        self.epoch_unsolved = 0

    def start(self, epoch: int) -> dict:
        """Advance to `epoch`; at each boundary crossed, the ended epoch's measures (and the guard's warning)."""
        metrics = {}
        while self.history.epoch < epoch:
            if self.history.epoch >= 0:
                metrics = self._epoch_end()
            self.history.start_epoch()
        return metrics

    def observe(self, ids, prompts, counts, successes) -> dict:
        """The step's prompt ids (S,) as taken, the collected groups' positions among them `prompts` (C,), their
        rollouts `counts` (C,) and successes (C,): records the outcomes and returns the step's measures (none in
        the first epoch, before any prompt has an estimate)."""
        ids = np.asarray(ids)
        never = self.history.never_solved(ids)
        full = np.zeros(ids.size, dtype=np.int64)
        full[np.asarray(prompts)] = counts
        self.epoch_rollouts += int(full.sum())
        self.epoch_unsolved += int(full[never].sum())
        metrics = {}
        if self.history.epoch >= 1 and full.sum():
            metrics = {
                "alloc/unsolved_share": float(full[never].sum() / full.sum()),
                "alloc/unsolved_active": int(np.count_nonzero(full[never])),
            }
            if not never.all():
                metrics["alloc/solved_n_median"] = float(np.median(full[~never]))
        self.history.update(ids[np.asarray(prompts)], np.asarray(successes), np.asarray(counts))
        return metrics

    def _epoch_end(self) -> dict:
        """The ended epoch: the pool's success by the p_hat bin it was read at, the share of seen prompts never
        solved by its end, its rollouts' share on never-solved prompts, and the guard."""
        h = self.history
        tried = h.pending_successes + h.pending_failures > 0
        metrics = {}
        if tried.any():
            wins, tries = h.pending_successes[tried], (h.pending_successes + h.pending_failures)[tried]
            metrics["pool/success"] = float(wins.sum() / tries.sum())
            frozen = h.frozen[tried]
            for lo, hi in zip(BINS[:-1], BINS[1:], strict=True):
                inside = (frozen >= lo) & ((frozen < hi) | (hi == BINS[-1]))
                if inside.any():
                    metrics[f"pool/success_phat_{bin_label(lo, hi)}"] = float(wins[inside].sum() / tries[inside].sum())
                    metrics[f"pool/prompts_phat_{bin_label(lo, hi)}"] = int(inside.sum())
            seen = ~np.isnan(h.frozen) | tried
            solved = (h.successes + h.pending_successes) > 0
            metrics["pool/never_solved"] = float(np.count_nonzero(seen & ~solved) / np.count_nonzero(seen))
        if self.epoch_rollouts and h.epoch >= 1:
            share = self.epoch_unsolved / self.epoch_rollouts
            metrics["sink/epoch_unsolved_share"] = float(share)
            if share > self.warn_share:
                metrics["sink/warned"] = 1
            if share > self.warn_share and self.warn:
                with warnings.catch_warnings():
                    warnings.simplefilter("always", SinkWarning)  # once per epoch that crosses, not once a run
                    warnings.warn(
                        f"epoch {h.epoch}: {share:.0%} of the rollouts went to prompts never solved so far (more "
                        f"than {self.warn_share:.0%}); {REMEDIES}{evidence()}",
                        SinkWarning,
                        stacklevel=3,
                    )
        self.epoch_rollouts = self.epoch_unsolved = 0
        return metrics

    def state_dict(self) -> dict:
        return {"history": self.history.state_dict(), "epoch_rollouts": self.epoch_rollouts,
                "epoch_unsolved": self.epoch_unsolved}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.history.load_state_dict(state["history"])
        self.epoch_rollouts, self.epoch_unsolved = int(state["epoch_rollouts"]), int(state["epoch_unsolved"])

    def arrays(self) -> dict:
        """The state as flat arrays (np.savez: SERAGRPOTrainer's checkpoints)."""
        return {
            **self.history.state_dict(),
            "epoch_rollouts": self.epoch_rollouts,
            "epoch_unsolved": self.epoch_unsolved,
        }

    def load_arrays(self, saved) -> None:
        counters = ("epoch_rollouts", "epoch_unsolved")
        history = {k: saved[k] for k in saved if k not in counters}
        self.load_state_dict({"history": history, **{k: saved[k] for k in counters}})
