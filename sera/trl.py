"""SERA and MaxRL inside TRL: `SERAGRPOTrainer`, a `trl.GRPOTrainer` (trl 1.16) that allocates rollouts per prompt.

A researcher swaps the trainer and the config class and keeps the rest of a GRPO script (README "SERA inside TRL");
`method="sera"` runs the authors' rule (active set, their Beta history over epochs), `method="sera_pilot"` the suite's
first rule with pilots (docs/trl.md):

    from sera.trl import SERAGRPOConfig, SERAGRPOTrainer
    args = SERAGRPOConfig(output_dir="out", num_generations=16, loss_type="dapo", beta=0.0,
                          remove_unused_columns=False)  # method="sera" reads the dataset's prompt_id column
    trainer = SERAGRPOTrainer(model=model, reward_funcs=binary_reward, args=args, train_dataset=dataset)
    trainer.train()

How a step works (docs/design.md sections 1-3, 6). `num_generations` keeps meaning n0: TRL's sampler hands the
step B prompts x n0 copies, so the budget is B x n0 completions as TRL counts it. Those copies are slots, not groups.
The step is the suite's own collection step (`sera.collect.collect`) over a draw callback that generates with TRL's
own generation path: for SERA, m pilots of each prompt, p_hat and the waterline allocation of the B x n0 budget, then
the remaining n_i - m of each group; for MaxRL, n0 of each prompt at once (TRL's own layout). Every draw is split
evenly across the processes, so each keeps B x n0 / P rows (TRL's gathers need equal shapes) while a prompt's group
may span processes: the rows are relabelled in place with the prompt each one belongs to, and the rewards of a draw
are gathered before the next. Advantages are computed on the true groups by `sera.advantages` (MaxRL), times SERA's
multiplicity weight n0 / n_i, and folded into TRL's per-row advantage; TRL's loss then gives the suite's
aggregation for the supported loss types (`LOSS_AGGREGATION`; with vLLM, once TRL's importance-sampling correction
`vllm_importance_sampling_correction` is off, as the suite's scripts set it). TRL's group statistics
(`frac_reward_zero_std`, the logged advantages) are recomputed on the true groups, and the step logs the suite's
`alloc/*` metrics (budget, the counts' range, p_hat's range, the waterline level tau).

The trainer overrides private methods of GRPOTrainer (`_generate`, `_calculate_rewards`,
`_generate_and_score_completions`), which change in most minor TRL releases, so it refuses any TRL but 1.16.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
import transformers
import trl
from accelerate.utils import gather, gather_object
from trl import GRPOConfig, GRPOTrainer

from sera.advantages import ADVANTAGES
from sera.allocation import scale_factor
from sera.collect import advantages_and_weights, collect, collection_metrics
from sera.distributed import gathered_state, rank_seed
from sera.estimation import P_HI, P_LO, BetaHistory, HistoricalEstimator
from sera.methods import MethodSettings, Study
from sera.sink import SinkMonitor

TESTED_TRL = "1.16."  # the TRL minor version whose private methods this module overrides
STUDY = Study("trl", estimators=("none", "pilot", "history", "beta"), repeated_prompts=True, sequential=False)
METHODS = ("sera", "sera_pilot", "maxrl")  # the registry rows this trainer runs (sera.methods.METHODS)

# TRL loss type -> the suite's aggregation (sera.losses) its normalisation equals, on the step's rows. A per-row
# weight folded into the advantage is exact for the policy term of each (linear in A; clipping and masking depend
# only on the sign of A, which a positive weight keeps).
LOSS_AGGREGATION = {
    "dapo": "token-mean",  # sum over the generation batch's tokens / its token count
    "cispo": "token-mean",  # with epsilon_high >= 1: its cap then leaves the on-policy ratio 1 alone
    "vespo": "token-mean",  # its gamma weight phi(w) is 1 on-policy
    "dr_grpo": "seqnorm",  # sum over tokens / (rows x max_completion_length)
    "grpo": "seq-mean-token-mean",  # each row's token mean, averaged over rows
    "sapo": "seq-mean-token-mean",
}
UNSUPPORTED_LOSSES = {
    "bnpo": "it divides by the token count of each micro-batch on each process, so a token's weight depends on how "
    "the rows fall into micro-batches and processes (the suite's token-mean only with one of each); use dapo",
    "luspo": "it sums each row's tokens without a length constant: the suite's seqnorm times max_completion_length; "
    "use dr_grpo",
}
# TRL's completion-length metrics, appended once per generation: recomputed over the step's draws together
LENGTH_METRICS = (
    "completions/mean_length",
    "completions/min_length",
    "completions/max_length",
    "completions/clipped_ratio",
    "completions/mean_terminated_length",
    "completions/min_terminated_length",
    "completions/max_terminated_length",
)


@dataclass
class SERAGRPOConfig(GRPOConfig):
    """GRPOConfig plus SERA's settings; `num_generations` is n0 and `loss_type` picks the aggregation."""

    method: str = field(
        default="sera",
        metadata={"help": "sera (the authors' rule: active set, n_min 2, n_max 4 n0, their Beta history; MaxRL "
                  "advantage, n0 / n_i weights) | sera_pilot (the suite's first rule: waterline over every prompt, "
                  "p_hat from pilots or the last visit) | maxrl (n0 each)"},
    )  # fmt: skip
    estimator: str | None = field(
        default=None,
        metadata={"help": "p_hat source: beta (sera) | pilot | history (sera_pilot); null: beta for sera, pilot "
                  "for sera_pilot, none for maxrl"},
    )  # fmt: skip
    pilot_m: int | None = field(
        default=None, metadata={"help": "pilots per prompt, reused inside the budget (null: 8 with estimator=pilot)"}
    )
    n_min: int | None = field(default=None, metadata={"help": "fewest rollouts of a prompt (null: max(2, pilot_m))"})
    n_max: int | None = field(default=None, metadata={"help": "most rollouts of a prompt (null: 8 x n0)"})
    p_lo: float = field(default=P_LO, metadata={"help": "p_hat clipping range, low end"})
    p_hi: float = field(default=P_HI, metadata={"help": "p_hat clipping range, high end"})
    keep_cv_on_zero: bool = field(
        default=False, metadata={"help": "MaxRL: keep the control variate on all-fail groups (delta = 0)"}
    )
    multiplicity_correction: bool | None = field(
        default=None, metadata={"help": "SERA: weight each rollout by n0 / n_i (null: on for sera)"}
    )
    scale_rewards: str = field(
        default="none",
        metadata={"help": "must stay 'none': MaxRL's advantage normalises by the group's mean reward, never its std"},
    )
    active_threshold: float | None = field(
        default=None,
        metadata={"help": "sera: a prompt is active when P(0 < successes < n_max) is at least this (null: "
                  "their 0.05; 0: every prompt active)"},
    )  # fmt: skip
    prompt_id_column: str = field(
        default="prompt_id",
        metadata={"help": "estimator=history or beta: the dataset column that identifies a prompt"},
    )
    end_token_ids: list[int] | None = field(
        default=None,
        metadata={"help": "tokens that also end a completion, besides the model's and the tokenizer's end tokens "
                  "(e.g. <|im_end|> for a base model prompted with a chat template)"},
    )  # fmt: skip

    def __post_init__(self):
        super().__post_init__()
        self.sera_settings()  # every SERA setting checked when the config is made

    def sera_settings(self) -> MethodSettings:
        """The suite's method settings (sera.methods) of this config, every cross-field rule checked."""
        if self.method not in METHODS:
            raise ValueError(f"SERAGRPOConfig.method={self.method!r}; choose from {METHODS}")
        if self.loss_type in UNSUPPORTED_LOSSES:
            raise ValueError(f"loss_type={self.loss_type!r} is not supported: {UNSUPPORTED_LOSSES[self.loss_type]}")
        if self.loss_type not in LOSS_AGGREGATION:
            raise ValueError(f"unknown loss_type {self.loss_type!r}; supported: {sorted(LOSS_AGGREGATION)}")
        cispo_cap = self.epsilon_high if self.epsilon_high is not None else self.epsilon
        if self.loss_type == "cispo" and cispo_cap < 1:
            raise ValueError(
                f"loss_type='cispo' with epsilon_high={cispo_cap} < 1 caps even the on-policy ratio 1, scaling every "
                "token's gradient by epsilon_high (not the suite's token-mean); set epsilon_high >= 1 (CISPO's own "
                "setting is about 5)"
            )
        if self.scale_rewards != "none":
            raise ValueError(
                f"scale_rewards={self.scale_rewards!r} is not honoured: MaxRL's advantage divides by the group's mean "
                "reward, never by its std; set scale_rewards='none' (SERAGRPOConfig's default)"
            )
        settings = MethodSettings.build(
            STUDY, self.method, self.num_generations, estimator=self.estimator, pilot_m=self.pilot_m, p_lo=self.p_lo,
            p_hi=self.p_hi, aggregation=LOSS_AGGREGATION[self.loss_type],
            multiplicity_correction=self.multiplicity_correction, keep_cv_on_zero=self.keep_cv_on_zero,
            n_min=self.n_min, n_max=self.n_max, threshold=self.active_threshold,
        )  # fmt: skip
        if settings.sampler.unequal_counts and not settings.n_min < settings.n0 < settings.n_max:
            raise ValueError(
                f"SERA cannot reallocate: every prompt needs at least n_min={settings.n_min} and at most "
                f"n_max={settings.n_max} rollouts, and num_generations={settings.n0} is the mean, so every prompt "
                f"would get exactly {settings.n0}. Set num_generations above n_min (with pilot_m={settings.pilot_m} "
                f"pilots, e.g. num_generations={2 * max(settings.n_min, 8)}), or lower pilot_m / n_min"
            )
        return settings


@dataclass
class SeraStep:
    """What the last training generation decided, over the global batch (B prompts, N = B x n0 rows)."""

    counts: np.ndarray  # (B,) rollouts of each prompt (sum B x n0)
    p_hat: np.ndarray | None  # (B,) the estimate the waterline used; None for maxrl (and history's first step)
    tau: float | None  # SERA's continuous waterline level
    group: np.ndarray  # (N,) the prompt (0..B-1) of each row, rows in TRL's order (process 0's rows first)
    rewards: np.ndarray  # (N,) binary reward of each row, same order
    advantages: np.ndarray  # (N,) MaxRL advantage of each row on its true group, same order
    weights: np.ndarray  # (N,) multiplicity weight n0 / n_i (1 without the correction), same order
    rewards_per_func: torch.Tensor  # (N, F) TRL's gathered rewards per reward function, same order

    @property
    def coefficients(self) -> np.ndarray:
        """(N,) advantage x weight: what TRL's loss multiplies each row's log-probability by."""
        return self.advantages * self.weights


@dataclass
class _Draw:
    """One generation call of a step: this process's rows of it, what TRL generated and the gathered rewards."""

    share: int  # rows of this draw on every process
    inputs: list  # this process's dataset rows, one per completion
    prompts: list
    generated: tuple  # GRPOTrainer._generate's return value for this process's rows
    rewards_per_func: torch.Tensor  # (share x P, F) gathered, in the draw's grouped order


class SERAGRPOTrainer(GRPOTrainer):
    """GRPOTrainer with SERA's per-prompt rollout allocation (or MaxRL's uniform one) and MaxRL's advantage.

    Takes GRPOTrainer's arguments with a `SERAGRPOConfig`. Everything that cannot work is refused before the model
    is loaded: another TRL version, an unsupported loss type, tools / environments / rollout_func (multi-turn
    completions have no single binary outcome per rollout slot), reward models and normalize_then_sum (the reward
    must be binary), a KL or entropy term with the multiplicity correction (the weight n0 / n_i would not reach it),
    images, and a pilot round that cannot be split evenly across the processes. `last_step` holds the last
    training generation's allocation (`SeraStep`).
    """

    def __init__(self, *args, **kwargs):
        bound = inspect.signature(GRPOTrainer.__init__).bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = bound.arguments
        config = given["args"]
        if not isinstance(config, SERAGRPOConfig):
            raise TypeError(f"SERAGRPOTrainer needs args=SERAGRPOConfig(...), got {type(config).__name__}")
        settings = config.sera_settings()
        check_supported(config, settings, given)
        if note := vllm_seed_note(config):
            warnings.warn(note, stacklevel=2)
        self.sera = settings
        self.last_step: SeraStep | None = None
        self._history, self._history_index, self._sink = None, None, None
        self._generations = 0  # training generation batches so far: the Beta history's epochs count them
        watched = watches_sink(config, given["train_dataset"])
        if settings.estimator in ("history", "beta") or watched:
            column = given["train_dataset"][config.prompt_id_column]
            self._history_index = {value: i for i, value in enumerate(dict.fromkeys(column))}
            size = len(self._history_index)
            self._sink = SinkMonitor(size) if watched else None
        if settings.estimator in ("history", "beta"):
            self._history = (
                BetaHistory(size) if settings.estimator == "beta"
                else HistoricalEstimator(size, settings.p_lo, settings.p_hi)
            )  # fmt: skip
        self._batch: list | None = None  # the local generation batch being generated (relabelled in place)
        self._draw_record: tuple | None = None  # (SeraStep, this process's coefficients, collection metrics)
        self._eval_rewards: torch.Tensor | None = None
        super().__init__(*args, **kwargs)
        if self._sink is not None:
            self._sink.warn = self.accelerator.is_main_process  # every process watches the same global batch
        for callback in self.callback_handler.callbacks:
            if isinstance(callback, RecordsCallback):
                callback.trainer = self  # the records gather a sharded policy through the trainer (policy_engine)
        generation = getattr(self, "vllm_generation", None)
        if generation is not None and generation.mode == "colocate" and _vllm_on_cpu():
            generation.sync_weights = lambda: reload_colocated_weights(generation)
        if self.args.end_token_ids:
            self._end_completions_at(self.args.end_token_ids)

    def _end_completions_at(self, token_ids: list[int]) -> None:
        """Add end tokens to TRL's own (the model's generation config and the tokenizer's), which TRL reads from the
        model only: generation stops at them (transformers' eos_token_id, vLLM's stop_token_ids) and the completion
        mask ends at the first of them, as the suite's engines end a response at the first of model.eos_token."""
        ends = list(dict.fromkeys([*self.eos_token_ids, *(int(t) for t in token_ids)]))
        self.eos_token_ids = ends
        generation = getattr(self, "vllm_generation", None)
        if generation is not None:
            generation.generation_kwargs = {**generation.generation_kwargs, "stop_token_ids": ends}
        else:
            self.generation_config.eos_token_id = ends
            self.generation_kwargs["eos_token_id"] = ends

    # -----------------------------------------------------------------------------------------------------------
    # The step: TRL calls _generate_and_score_completions, which calls _generate, then _calculate_rewards.
    # -----------------------------------------------------------------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        if not self.model.training:
            return self._evaluation_batch(inputs)
        self._batch = inputs
        try:
            output = super()._generate_and_score_completions(inputs)
        finally:
            self._batch = None
        step, local, metrics = self._draw_record
        self._draw_record = None
        # SERA: MaxRL's advantage on the true groups times the multiplicity weight n0 / n_i, per row
        output["advantages"] = torch.as_tensor(local, dtype=torch.float32, device=self.accelerator.device)
        self._log_step(step, metrics)
        return output

    def _generate(self, prompts: list):
        if not self.model.training:
            return super()._generate(prompts)
        inputs = self._batch
        rank, world = self.accelerator.process_index, self.accelerator.num_processes
        n0 = self.num_generations
        rows = gather_object(list(inputs))  # the global generation batch: B prompts x n0 copies
        groups = rows[::n0]
        batch = len(groups)
        for i, first in enumerate(groups):
            if any(rows[i * n0 + j]["prompt"] != first["prompt"] for j in range(n0)):
                raise RuntimeError(
                    f"the generation batch does not hold each prompt {n0} times in a row (TRL's RepeatSampler "
                    f"layout); SERAGRPOTrainer relies on it (row {i * n0})"
                )
        base_generate, base_rewards = super()._generate, super()._calculate_rewards
        draws: list[_Draw] = []
        lengths_before = {key: len(self._metrics["train"][key]) for key in LENGTH_METRICS}

        def draw(counts: np.ndarray):  # counts (B,) more rollouts of each prompt, split evenly across processes
            jobs = np.repeat(np.arange(batch), counts)  # (J,) the prompt of each new rollout, grouped
            share, rest = divmod(jobs.size, world)
            if rest:  # check_supported makes every draw (B x m, B x (n0 - m), B x n0) a multiple of P
                raise RuntimeError(f"a draw of {jobs.size} completions does not split over {world} processes")
            if share == 0:
                return None, np.zeros(0)
            mine = [dict(groups[i]) for i in jobs[rank * share : (rank + 1) * share]]
            mine_prompts = [x["prompt"] for x in mine]
            with self._one_generation_per_row():  # vLLM server mode: every row its own request
                generated = base_generate(mine_prompts)
            per_func = base_rewards(mine, mine_prompts, generated[3], generated[1])  # (J, F), gathered
            draws.append(_Draw(share, mine, mine_prompts, generated, per_func))
            return None, self._binary(per_func)

        ids = self._history_ids(groups) if self._history_index is not None else None
        # TRL's sampler reads the dataset in epochs of len // B whole generation batches (a shorter last one is
        # dropped), so a batch's epoch is its index over that; the history freezes its estimates at each start
        epoch = self._generations // max(1, len(self.train_dataset) // batch)
        sink = self._sink.start(epoch) if self._sink is not None else {}
        if isinstance(self._history, BetaHistory):
            self._history.advance_to(epoch)
            p_hat_source = lambda: self._history.estimate(ids)  # noqa: E731
        elif self._history is not None:
            p_hat_source = lambda: self._history.estimate(ids) if self._history.has_data else None  # noqa: E731
        else:
            p_hat_source = None
        collected = collect(self.sera, batch, draw, p_hat_source)
        self._generations += 1
        if self._history is not None:
            # the groups trained on: the authors' active set leaves some prompts out, with no rollouts
            self._history.update(ids[collected.prompts], collected.successes, collected.counts)
        if self._sink is not None:  # the never-solved measures and the guard (sera.sink), watched from outside
            sink |= self._sink.observe(ids, collected.prompts, collected.counts, collected.successes)

        # The rows of the step in TRL's order: process r holds its share of every draw, draws in call order.
        offsets = np.cumsum([0] + [d.share * world for d in draws])
        final_jobs = np.concatenate(
            [offsets[k] + np.arange(r * d.share, (r + 1) * d.share) for r in range(world) for k, d in enumerate(draws)]
        )
        grouped_jobs = collected.order if collected.order is not None else np.arange(offsets[-1])
        # SERA: MaxRL's advantage on the true groups and the multiplicity weight n0 / n_i, as the suite computes them
        advantages, weights = advantages_and_weights(self.sera, collected)
        by_job = np.empty((4, offsets[-1]))  # group, reward, advantage, weight of each job (draw order)
        by_job[:, grouped_jobs] = np.stack([collected.rows, collected.rewards, advantages, weights])
        by_job = by_job[:, final_jobs]
        per_func = torch.cat([d.rewards_per_func for d in draws])[torch.as_tensor(final_jobs)]
        step = SeraStep(
            collected.counts, collected.p_hat, collected.tau, by_job[0].astype(np.int64), by_job[1], by_job[2],
            by_job[3], per_func,
        )  # fmt: skip
        local = slice(rank * len(inputs), (rank + 1) * len(inputs))
        self._draw_record = (step, step.coefficients[local], collection_metrics(self.sera, collected, batch) | sink)
        self.last_step = step

        # Relabel this process's rows in place: TRL's caller scores and logs these lists after _generate returns.
        inputs[:] = [x for d in draws for x in d.inputs]
        prompts[:] = [p for d in draws for p in d.prompts]
        merged = tuple(_concat([d.generated[k] for d in draws]) for k in range(len(draws[0].generated)))
        self._relog_lengths(lengths_before, merged[1])
        return merged

    def _calculate_rewards(self, inputs, prompts, completions, completion_ids_list):
        if not self.model.training:
            self._eval_rewards = super()._calculate_rewards(inputs, prompts, completions, completion_ids_list)
            return self._eval_rewards
        step = self._draw_record[0]  # scored draw by draw inside _generate; here in TRL's row order
        return step.rewards_per_func

    # -----------------------------------------------------------------------------------------------------------
    # Helpers
    # -----------------------------------------------------------------------------------------------------------
    def _binary(self, rewards_per_func: torch.Tensor) -> np.ndarray:
        """The weighted sum of the reward functions (N,), checked binary: MaxRL and p_hat count successes."""
        if torch.isnan(rewards_per_func).all(dim=1).any():
            raise ValueError("a completion got no reward (every reward function returned None); SERA needs 0 or 1")
        rewards = (rewards_per_func * self.reward_weights.to(rewards_per_func.device)).nansum(dim=1)
        rewards = rewards.double().cpu().numpy()
        bad = np.unique(rewards[(rewards != 0) & (rewards != 1)])
        if bad.size:
            raise ValueError(
                f"SERA and MaxRL need a binary reward (the weighted sum of the reward functions must be 0 or 1 for "
                f"every completion: MaxRL's advantage and p_hat count successes); got {bad[:5].tolist()}"
            )
        return rewards

    def _history_ids(self, groups: list) -> np.ndarray:
        column = self.args.prompt_id_column
        try:
            return np.array([self._history_index[g[column]] for g in groups], dtype=np.int64)
        except KeyError as err:
            raise KeyError(f"prompt id {err} (column {column!r}) is not in the training dataset") from None

    @contextlib.contextmanager
    def _one_generation_per_row(self):
        """num_generations = 1 while a draw generates: vLLM's server mode would otherwise take every n0-th row as
        a prompt and sample n0 of each; colocate mode and transformers ignore it. Prefix caching absorbs repeats."""
        n0 = self.num_generations
        self.num_generations = 1
        try:
            yield
        finally:
            self.num_generations = n0

    def _relog_lengths(self, before: dict, completion_ids: list) -> None:
        """Replace the per-draw completion-length metrics TRL appended by their values over the whole step."""
        for key, size in before.items():
            del self._metrics["train"][key][size:]
        device = self.accelerator.device
        lengths = gather(torch.tensor([len(ids) for ids in completion_ids], device=device)).float()
        ends = [*self.eos_token_ids, self._tokenizer.pad_token_id]
        truncated = gather(torch.tensor([ids[-1] not in ends for ids in completion_ids], device=device))
        ended = lengths[~truncated] if (~truncated).any() else torch.zeros(1, device=device)
        values = (lengths.mean(), lengths.min(), lengths.max(), truncated.float().mean(), ended.mean(), ended.min(),
                  ended.max())  # fmt: skip
        for key, value in zip(LENGTH_METRICS, values, strict=True):
            self._metrics["train"][key].append(value.item())

    def _log_step(self, step: SeraStep, collected: dict) -> None:
        """The suite's collection metrics (alloc/*: budget, counts' range, mixed groups, tau) and p_hat's range, and
        TRL's group statistics recomputed on the true groups."""
        metrics = self._metrics["train"]
        successes = np.bincount(step.group, weights=step.rewards, minlength=step.counts.size)
        all_equal = (successes == 0) | (successes == step.counts)  # zero reward std within the group
        metrics["frac_reward_zero_std"][-1] = float(all_equal[step.group].mean())
        logged = self._logs["advantages"]
        for _ in range(step.group.size):
            logged.pop()
        logged.extend(step.coefficients.tolist())
        extra = {}
        if step.p_hat is not None:
            extra = {"alloc/p_hat_mean": step.p_hat.mean(), "alloc/p_hat_min": step.p_hat.min(),
                     "alloc/p_hat_max": step.p_hat.max(),
                     "alloc/c_min_phat": scale_factor(step.p_hat, step.counts, self.sera.delta).min()}  # fmt: skip
        for key, value in (collected | extra).items():
            if key != "train/reward":  # TRL logs it as `reward`
                metrics[key].append(float(value))
        # `reward` as GRPOTrainer logs it for a uniform run: the mean over prompts of each prompt's success rate.
        # TRL's own value, the mean over rows, leans towards the prompts SERA gave more rollouts (the hard ones).
        # (N,) each prompt's rows weigh 1 / B together (B: the prompts with rows; the authors' rule leaves some out)
        per_row = 1.0 / (np.count_nonzero(step.counts) * step.counts[step.group])
        metrics["reward_allocated"].append(metrics["reward"][-1])
        metrics["reward"][-1] = float((per_row * step.rewards).sum())
        per_func = step.rewards_per_func.double().cpu().numpy()  # (N, F)
        for i, name in enumerate(self.reward_func_names):
            scored = ~np.isnan(per_func[:, i])
            if scored.any():
                weight = per_row[scored] / per_row[scored].sum()
                metrics[f"rewards/{name}/mean"][-1] = float((weight * per_func[scored, i]).sum())

    def _evaluation_batch(self, inputs):
        """Evaluation keeps TRL's uniform groups (num_generations_eval each); its loss uses MaxRL's advantage."""
        output = super()._generate_and_score_completions(inputs)
        rewards = self._binary(self._eval_rewards)
        size = self.num_generations_eval
        s = self.sera
        advantages = ADVANTAGES[s.method.advantage](rewards, np.full(rewards.size // size, size), **s.adv_kwargs)
        rank, local = self.accelerator.process_index, len(inputs)
        output["advantages"] = torch.as_tensor(
            advantages[rank * local : (rank + 1) * local], dtype=torch.float32, device=self.accelerator.device
        )
        logged = self._logs["advantages"]  # the completions table shows the advantages the loss used, not GRPO's
        for _ in range(min(advantages.size, len(logged))):  # the table keeps one generation batch: maybe fewer rows
            logged.pop()
        logged.extend(advantages.tolist())
        self._eval_rewards = None
        return output

    # -----------------------------------------------------------------------------------------------------------
    # The historical p_hat lives across steps: saved with each checkpoint and loaded on resume.
    # -----------------------------------------------------------------------------------------------------------
    def _save_checkpoint(self, model, trial):
        # the history goes in first: transformers ends its save by deleting the older checkpoints (save_total_limit),
        # so a history written after it would leave a moment when no checkpoint is whole
        if (self._history is not None or self._sink is not None) and self.args.should_save:
            from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

            folder = f"{self._get_output_dir(trial=trial)}/{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            os.makedirs(folder, exist_ok=True)
            if self._sink is not None:
                np.savez(f"{folder}/{SINK_FILE}", generations=self._generations, **self._sink.arrays())
        if self._history is not None and self.args.should_save:
            state = self._history.state_dict()
            if isinstance(self._history, BetaHistory):
                np.savez(f"{folder}/{HISTORY_FILE}", generations=self._generations, **state)
            else:
                np.savez(f"{folder}/{HISTORY_FILE}", last_rate=state["last_rate"], total=np.asarray(state["total"]))
        super()._save_checkpoint(model, trial)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if self._sink is not None and checkpoint is not None and os.path.exists(f"{checkpoint}/{SINK_FILE}"):
            with np.load(f"{checkpoint}/{SINK_FILE}") as saved:
                self._generations = int(saved["generations"])
                self._sink.load_arrays({k: saved[k] for k in saved.files if k != "generations"})
        if self._history is not None and checkpoint is not None:
            with np.load(f"{checkpoint}/{HISTORY_FILE}") as saved:
                if isinstance(self._history, BetaHistory):
                    self._generations = int(saved["generations"])
                    self._history.load_state_dict({k: saved[k] for k in saved.files if k != "generations"})
                    return
                successes, rollouts = saved["total"]
                self._history.load_state_dict({"last_rate": saved["last_rate"], "total": (successes, int(rollouts))})


HISTORY_FILE = "sera_history.npz"
SINK_FILE = "sera_sink.npz"  # the sink monitor's state (sera.sink)


def watches_sink(config, dataset) -> bool:
    """The sink monitor runs on a dataset whose prompts carry ids (config.prompt_id_column, kept by
    remove_unused_columns=False) and that holds at least one generation batch: a pool read in epochs."""
    prompts = config.generation_batch_size // config.num_generations
    columns = getattr(dataset, "column_names", None) or []
    return config.prompt_id_column in columns and not config.remove_unused_columns and len(dataset) >= prompts


class RecordsCallback(transformers.TrainerCallback):
    """Per-question evaluation records in the suite's format, written by a TRL run: at every `every`-th step and at
    the last one, each of `task`'s evaluation sets is sampled `samples` times a question with the suite's own
    evaluation (sera.lm_loop.evaluate: the unbiased Pass@K and a record {ids, n, correct} a set), and the record goes
    to out_dir/eval_step<N>_<set>.json, the file the suite's tables bootstrap over; the Pass@K go to TRL's log.

    `task` has eval_sets() {name: (ids, token lists)}, rewards(ids, responses, truncated), eos_id and pad_id (the
    math study's MathTask has them). Every process samples its share of the questions from the policy as it stands
    after the step (`policy_engine`): through TRL's colocated vLLM engine when the trainer has one, else with the
    suite's HFEngine on the whole model, gathered under ZeRO-3 and copied whole under FSDP2. SERAGRPOTrainer binds
    itself to this callback (`trainer`); without a trainer (another GRPOTrainer) DeepSpeed and FSDP are refused.
    """

    def __init__(self, out_dir, task, *, every: int, samples: int, ks, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float = 1.0, seed: int = 0, max_rollouts_per_call: int = 1024, folder=None):  # fmt: skip
        from pathlib import Path
        from types import SimpleNamespace

        if every < 1 or samples < 1:
            raise ValueError(f"RecordsCallback needs every >= 1 and samples >= 1, got {every}, {samples}")
        self.out_dir, self.task, self.every, self.seed = Path(out_dir), task, every, seed
        self.settings = SimpleNamespace(
            eval_samples=samples, eval_ks=tuple(int(k) for k in ks), eval_temperature=temperature, eval_top_p=top_p,
            eval_max_rollouts_per_call=max_rollouts_per_call, max_new_tokens=max_new_tokens,
        )  # fmt: skip
        self.written: list[int] = []
        self.folder = folder  # a RunFolderCallback: the Pass@K also go to the run folder's metrics
        self.trainer = None  # set by SERAGRPOTrainer
        self.engines: list[str] = []  # the engine each evaluation sampled with (its class name)

    def on_step_end(self, args, state, control, model=None, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        if self.trainer is None and (getattr(args, "deepspeed", None) or getattr(args, "fsdp", None)):
            raise ValueError(
                "RecordsCallback samples the whole policy on each process: under DeepSpeed or FSDP it needs "
                "SERAGRPOTrainer, which gathers the parameters first"
            )
        from sera.lm_loop import evaluate

        # each rank its own noise (the seed + step itself on rank 0 and in one process): with one seed on every rank,
        # the j-th question of each rank would share its samples' seeds, coupling questions the bootstrap treats as
        # independent
        generator = torch.Generator().manual_seed(rank_seed(self.seed + step))
        with policy_engine(self.trainer, model, self.task) as engine:
            metrics, records = evaluate(self.settings, self.task, engine, generator)
            self.engines.append(type(engine).__name__)
        if state.is_world_process_zero:
            import json

            from sera.runlog import eval_record_file

            self.out_dir.mkdir(parents=True, exist_ok=True)
            for name, record in records.items():
                (self.out_dir / eval_record_file(step, name)).write_text(json.dumps(record))
            self.written.append(step)
            state.log_history.append({"step": step, **metrics})
            if self.folder is not None:
                self.folder.log_evaluation(step, metrics)


@contextlib.contextmanager
def policy_engine(trainer, model, task):
    """An engine that samples the policy as it stands, whole on this process (every process calls it together):

    - TRL's colocated vLLM engine, after syncing it the trainer's weights (TRL syncs before its next generation
      anyway); one engine a process (vllm_tensor_parallel_size 1) and no sleep mode, else refused;
    - under DeepSpeed ZeRO-3 the parameters gathered on every process for the evaluation (TRL's
      unwrap_model_for_generation, as its own generation does);
    - under FSDP2 a whole copy of the model built on each process from the full state dict (a collective), its
      memory that of one unsharded model; FSDP1 is refused;
    - else (one process, DDP, ZeRO-1/2) the unwrapped model itself.
    Without a trainer: the model given, in eval mode."""
    from sera.rollout import HFEngine, VLLMEngine

    if trainer is None:
        with _eval_mode(model):
            yield HFEngine(model, task.eos_id, task.pad_id)
        return
    generation = getattr(trainer, "vllm_generation", None)
    if generation is not None and generation.mode == "colocate":
        if trainer.args.vllm_enable_sleep_mode or trainer.args.vllm_tensor_parallel_size != 1:
            raise ValueError(
                "the records sample TRL's colocated vLLM engine one process at a time: they need "
                "vllm_enable_sleep_mode=False and vllm_tensor_parallel_size=1"
            )
        generation.sync_weights()
        trainer._last_loaded_step = trainer.state.global_step  # TRL's own marker: these weights are loaded
        yield VLLMEngine.around(generation.llm, task.eos_id, task.pad_id)
        return
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.tensor import DTensor

    wrapped = trainer.model_wrapped
    if isinstance(wrapped, FullyShardedDataParallel):
        raise ValueError("the records need FSDP2 (fsdp_version: 2) or ZeRO-3 to gather a sharded policy, not FSDP1")
    if any(isinstance(p, DTensor) for p in wrapped.parameters()):  # FSDP2
        whole = whole_copy(trainer.accelerator.unwrap_model(wrapped))
        try:
            yield HFEngine(whole, task.eos_id, task.pad_id)
        finally:
            del whole
        return
    from trl.models import unwrap_model_for_generation

    with unwrap_model_for_generation(wrapped, trainer.accelerator) as unwrapped, _eval_mode(unwrapped):
        yield HFEngine(unwrapped, task.eos_id, task.pad_id)


@contextlib.contextmanager
def _eval_mode(model):
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def whole_copy(model) -> torch.nn.Module:
    """An unsharded copy of an FSDP2-sharded Hugging Face model on this process, in eval mode: the full state dict
    (every DTensor gathered: a collective, so every process calls it) loaded into a model built from its config."""
    state = gathered_state(model)
    first = next(iter(state.values()))
    whole = transformers.AutoModelForCausalLM.from_config(model.config, dtype=first.dtype).to(first.device)
    whole.load_state_dict(state)
    return whole.eval()


class RunFolderCallback(transformers.TrainerCallback):
    """A TRL run as one of the suite's run folders (sera.runlog), the kind the tables read: config.yaml (the study
    config the run follows, which says trainer: trl), base.json (the base model run it started from), metrics.jsonl
    (TRL's logs, and the Pass@K of the RecordsCallback given this folder, which writes its per-question records
    here too), and DONE with the last evaluation when training ends. The main process writes; the others do nothing.
    A run resumed from a TRL checkpoint drops the metrics logged after that checkpoint's step; a folder holding a
    finished run, or a run of another config, is refused (RunDir)."""

    def __init__(self, path, config: dict, base=None):
        from pathlib import Path

        self.path, self.config, self.base = Path(path), config, base
        self.run_dir = None
        self.last_evaluation: dict = {}

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        from sera.runlog import RunDir, record_base

        self.run_dir = RunDir(self.path, self.config)
        if self.base is not None:
            record_base(self.path, self.base)
        self.run_dir.rewind(state.global_step)  # 0 on a fresh run; a resumed run redoes what came after its checkpoint

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.run_dir is not None and logs:
            self.run_dir.log(state.global_step, logs)

    def log_evaluation(self, step: int, metrics: dict) -> None:
        self.last_evaluation = dict(metrics)
        if self.run_dir is not None:
            self.run_dir.log(step, metrics)

    def on_train_end(self, args, state, control, **kwargs):
        if self.run_dir is not None:
            self.run_dir.finish({"step": state.global_step, **self.last_evaluation})
            self.run_dir = None


def _vllm_on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def reload_colocated_weights(generation) -> None:
    """TRL's colocate weight sync, for vLLM's CPU backend. TRL loads each parameter with the model's `load_weights`,
    which fails there ("'Parameter' object has no attribute 'weight_loader'"): the CPU backend prepacks its matmul
    weights after loading, and the prepacked parameters have no loader. vLLM's `reload_weights` restores the
    checkpoint layout, loads the weights given and prepacks again (the suite's own VLLMEngine syncs the same way).
    GPUs keep TRL's own path. Every process walks the parameters: gathering them is a collective (ZeRO-3, FSDP).
    The reload unties what the checkpoint ties (a tied output embedding keeps its old values unless named), so every
    tied name is given too."""
    weights = {name: param.detach().clone() for name, param in generation._iter_named_params()}
    model = generation.accelerator.unwrap_model(generation.model)
    first_name = {}
    for name, tensor in model.state_dict(keep_vars=True).items():
        first = first_name.setdefault(id(tensor), name)
        if name not in weights and first in weights:  # e.g. lm_head.weight, tied to model.embed_tokens.weight
            weights[name] = weights[first]
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=iter(weights.items()))
    generation.llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights


def vllm_seed_note(config: GRPOConfig) -> str | None:
    """What a colocated vLLM engine's sampling seed is under TRL 1.16 (None without one): TRL builds it with
    seed=process index (trl/generation/vllm_generation.py, LLM(..., seed=accelerator.process_index // tensor
    parallel size)), so the run's seed does not reach the training samples' noise. Whether vLLM then draws from that
    seed alone or from torch's generator, which the trainer reseeds, only a GPU run can tell; a warning until then."""
    if not (config.use_vllm and config.vllm_mode == "colocate"):
        return None
    return (f"TRL {trl.__version__} seeds each colocated vLLM engine with its process index, not seed={config.seed}: "
            "runs that differ only in their seed may draw their training samples with the same noise (the data order "
            "still follows the seed)")  # fmt: skip


def check_supported(config: SERAGRPOConfig, settings: MethodSettings, given: dict) -> None:
    """Every reason the trainer cannot run this setup, raised before GRPOTrainer loads anything."""
    if not trl.__version__.startswith(TESTED_TRL):
        raise RuntimeError(
            f"SERAGRPOTrainer overrides private methods of GRPOTrainer as of trl {TESTED_TRL}x; found trl "
            f"{trl.__version__} (pin trl==1.16.0, or check sera/trl.py against the new version and its tests)"
        )
    if given["tools"] or given["environment_factory"] is not None or given["rollout_func"] is not None:
        raise ValueError(
            "SERAGRPOTrainer does not support tools, environment_factory or rollout_func: it generates each prompt's "
            "rollouts in two rounds through TRL's single-turn generation and needs one binary reward per completion"
        )
    funcs = given["reward_funcs"]
    for func in funcs if isinstance(funcs, list) else [funcs]:
        if isinstance(func, str | torch.nn.Module):
            raise ValueError(
                "SERAGRPOTrainer needs binary rewards from reward functions; a reward model gives a continuous score"
            )
    if config.multi_objective_aggregation != "sum_then_normalize":
        raise ValueError(
            "multi_objective_aggregation='normalize_then_sum' makes the reward non-binary; use the default"
        )
    if settings.multiplicity_correction and (
        config.beta != 0 or config.entropy_coef != 0 or config.use_adaptive_entropy
    ):
        raise ValueError(
            "beta (KL) and entropy bonuses are not supported with SERA's multiplicity correction: the weight n0 / n_i "
            "is folded into the advantage and would not reach them; set beta=0 and entropy_coef=0"
        )
    dataset = given["train_dataset"]
    columns = getattr(dataset, "column_names", None) or []
    if {"image", "images"} & set(columns):
        raise ValueError("SERAGRPOTrainer does not support image inputs")
    world = config.world_size
    prompts = config.generation_batch_size // config.num_generations  # B
    if settings.estimator == "pilot" and (prompts * settings.pilot_m) % world:
        raise ValueError(
            f"the pilot round of B x m = {prompts} x {settings.pilot_m} completions cannot be split evenly across "
            f"{world} processes (TRL's gathers need equal shares); choose B or pilot_m so that P divides B x m"
        )
    if settings.estimator in ("history", "beta"):
        if config.prompt_id_column not in columns:
            raise ValueError(
                f"estimator={settings.estimator} needs a dataset column {config.prompt_id_column!r} identifying each "
                f"prompt (prompt_id_column); the dataset has {columns}"
            )
        if config.remove_unused_columns:
            raise ValueError(
                f"estimator={settings.estimator} reads the prompt id column: set remove_unused_columns=False"
            )
    if settings.estimator == "beta" and len(dataset) < prompts:
        raise ValueError(
            f"the Beta history reads the dataset in epochs of B = {prompts} prompts; it has {len(dataset)}"
        )


def _concat(parts: list):
    """One draw-by-draw field of GRPOTrainer._generate's return value, concatenated over the step's draws."""
    first = parts[0]
    if first is None:
        return None
    if isinstance(first, dict):
        if any(parts):
            raise ValueError("extra fields from generation are not supported (rollout_func)")
        return {}
    if isinstance(first, list):
        return [x for part in parts for x in part]
    raise TypeError(f"unexpected generation output of type {type(first).__name__}")
