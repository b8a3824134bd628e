"""The math study's task for the shared LM loop (sera.lm_loop.Task): a finite training set drawn in seeded epochs,
named evaluation sets, math-verify rewards (experiments/math/grading.py)."""

from __future__ import annotations

import functools

import numpy as np

from experiments.math.grading import score_batch
from experiments.math.prompts import render
from sera.estimation import epoch_stream_ids

EVAL_ID_BASE = 10_000_000  # question i of evaluation set j has id (j + 1) * EVAL_ID_BASE + i; training ids 0..N-1
ORDER_SEED = 20_260_000  # salt of the per-epoch permutations of the training set


class MathTask:
    """A finite training set (ids 0..N-1) drawn in seeded epochs, named evaluation sets, math-verify rewards.

    The training stream is the concatenation of per-epoch permutations of the training set, each seeded by (run seed,
    epoch); step t's prompts start at position t*B (B = the configured batch), so the B-prompt batches of successive
    steps tile it and every problem is seen once an epoch (a sampler that takes more than B in a step reads on into
    the next step's, at most N a step). A resumed run draws the same problems. Evaluation questions have ids
    EVAL_ID_BASE * (set position + 1) + row, so one `rewards` serves both.
    """

    epoch_order = True  # the training set is read in epochs (the authors' Beta history needs them)

    def __init__(self, tokenizer, template: str, problems, batch_size: int, seed: int, eos_id: int, pad_id: int):
        train, evals, _ = problems  # load_problems' (training problems, {set: problems}, SFT problems)
        self.tokenizer, self.batch_size, self.seed = tokenizer, batch_size, seed
        self.eos_id, self.pad_id, self.num_prompts = eos_id, pad_id, len(train)

        def encode(problems):
            texts = [render(template, p["question"], tokenizer) for p in problems]
            return [tokenizer(text, add_special_tokens=False).input_ids for text in texts]

        self.train = encode(train)
        self.evals = {}
        self.golds = {i: p["answer"] for i, p in enumerate(train)}
        for j, (name, problems) in enumerate(evals.items()):
            ids = EVAL_ID_BASE * (j + 1) + np.arange(len(problems))
            self.evals[name] = (ids, encode(problems))
            self.golds.update({int(i): p["answer"] for i, p in zip(ids, problems, strict=True)})

    @functools.lru_cache(maxsize=4)  # noqa: B019 - one task per run; a step touches at most two epochs
    def permutation(self, epoch: int) -> np.ndarray:
        return np.random.default_rng((ORDER_SEED, self.seed, epoch)).permutation(self.num_prompts)

    def train_prompts(self, step: int, batch: int, start: int = 0):
        """Prompts start .. start + batch - 1 of step `step`'s stream (fewer past N): (ids, token lists)."""
        ids = epoch_stream_ids(step, self.batch_size, start, batch, self.num_prompts, self.permutation)
        return ids, [self.train[i] for i in ids]

    def eval_sets(self):
        return self.evals

    def rewards(self, ids, responses, truncated):
        """math-verify of each decoded response (special tokens skipped) against its gold answer; cut ones score 0."""
        texts = self.tokenizer.batch_decode(responses, skip_special_tokens=True)
        return score_batch(texts, [self.golds[int(i)] for i in ids], truncated)
