"""Offline math problems, generated and seeded (docs/design.md section 5; docs/history/calibration.md, "Math CPU
default").

Two families, each giving problems in data.py's schema (plus a "solution" for a supervised warm start):
- chain_sum, the CPU default for a tiny from-scratch model: "Compute 57 - 38." (the first term added, each later one
  added or subtracted), solution "\\boxed{19}" alone. The CPU default (configs/math.yaml) uses two terms from 1 to 99,
  answers -98..198; the function's default, four terms, stayed near chance for the tiny model (why:
  docs/history/calibration.md). The width is that page's fix: with three terms to 30, guessing an answer without
  reading the question scored 52% Pass@64.
- gsm_symbolic: reasoning-gym's GSM8K-style word problems (templates of GSM8K test questions with fresh numbers),
  for a quick check with a small real model such as SmolLM2-135M-Instruct; solution = the worked steps, then \\boxed{}.
make_splits draws the held-out set from a fixed pool (the first HELDOUT_POOL distinct questions of HELDOUT_SEED,
whatever the training seed), and a training set from TRAIN_SEED + seed that skips every question in that pool, so the
two never share a question text and the training set does not depend on how many held-out problems are used.
guessing_baseline scores answer-only strategies on the held-out set, the floor the README reports beside the table.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import numpy as np

HELDOUT_SEED = 10_000
TRAIN_SEED = 1_000_000
HELDOUT_POOL = 1024  # held-out questions kept out of every training set; the held-out set is a prefix of it


def chain_sum(num: int, seed: int, terms: int = 4, max_value: int = 99) -> list[dict]:
    """`num` chain sums "Compute a + b - c + d." (terms from 1 to max_value, later signs uniform); no ids yet.

    Deterministic in `seed`, and the first k problems do not depend on `num`.
    """
    if terms < 2 or max_value < 1:
        raise ValueError(f"need terms >= 2 and max_value >= 1, got terms={terms}, max_value={max_value}")
    u = np.random.default_rng(seed).random((num, 2 * terms - 1))  # one row a problem: values, then signs
    values = 1 + np.floor(u[:, :terms] * max_value).astype(np.int64)  # (num, terms)
    signs = np.where(u[:, terms:] < 0.5, -1, 1)  # (num, terms - 1)
    problems = []
    for row, sign in zip(values.tolist(), signs.tolist(), strict=True):
        text = str(row[0]) + "".join(f" {'+' if s > 0 else '-'} {v}" for v, s in zip(row[1:], sign, strict=True))
        total = row[0] + sum(v * s for v, s in zip(row[1:], sign, strict=True))
        problems.append({"question": f"Compute {text}.", "answer": str(total), "solution": f"\\boxed{{{total}}}"})
    return problems


def gsm_symbolic(num: int, seed: int, difficulty: float = 1.0) -> list[dict]:
    """`num` reasoning-gym "gsm_symbolic" word problems, made offline, no ids yet; deterministic and prefix-stable."""
    import reasoning_gym  # imported here: it takes ~2 s and only this family needs it

    problems = []
    for item in reasoning_gym.create_dataset("gsm_symbolic", size=num, seed=seed, difficulty=difficulty):
        steps = item["metadata"]["answer_cot"].rsplit("####", 1)[0].strip()
        answer = str(item["answer"]).strip()
        problems.append(
            {"question": item["question"], "answer": answer, "solution": f"{steps}\nThe answer is \\boxed{{{answer}}}."}
        )
    return problems


FAMILIES: dict[str, Callable[..., list[dict]]] = {"chain_sum": chain_sum, "gsm_symbolic": gsm_symbolic}


def _distinct(generate: Callable[[int, int], list[dict]], num: int, seed: int, exclude: set[str]) -> list[dict]:
    # The first `num` problems of the seed's stream whose question is new; the stream is prefix-stable, so drawing a
    # longer one when duplicates fall out changes nothing before the cut.
    if num == 0:
        return []
    size = num
    while True:
        out, seen = [], set(exclude)
        for p in generate(size, seed):
            if p["question"] not in seen:
                seen.add(p["question"])
                out.append(p)
                if len(out) == num:
                    return out
        if size > 20 * num + 1000:
            raise ValueError(f"could not draw {num} distinct problems (got {len(out)} from {size})")
        size = 2 * size + 64


def make_splits(family: str, num_train: int, num_heldout: int, seed: int = 0, **options) -> tuple[list, list]:
    """(training problems, held-out problems) of `family` (FAMILIES), ids "<family>-train-s<seed>-<i>" and
    "<family>-heldout-<i>". Held-out: the first num_heldout of the fixed pool; training: seeded by `seed`, disjoint
    from the whole pool by question text, questions distinct within each set. `options` go to the generator."""
    if family not in FAMILIES:
        raise ValueError(f"unknown problem family {family!r}; expected one of {sorted(FAMILIES)}")
    if not 0 <= num_heldout <= HELDOUT_POOL or num_train < 0:
        raise ValueError(f"need 0 <= num_heldout <= {HELDOUT_POOL} and num_train >= 0, got {num_heldout}, {num_train}")

    def generate(size: int, s: int) -> list[dict]:
        return FAMILIES[family](size, s, **options)

    pool = _distinct(generate, HELDOUT_POOL, HELDOUT_SEED, set())
    train = _distinct(generate, num_train, TRAIN_SEED + seed, {p["question"] for p in pool})
    heldout = [{"id": f"{family}-heldout-{i:05d}", **p} for i, p in enumerate(pool[:num_heldout])]
    train = [{"id": f"{family}-train-s{seed}-{i:06d}", **p} for i, p in enumerate(train)]
    return train, heldout


def guessing_baseline(train: list[dict], heldout: list[dict], ks=(1, 64)) -> dict[str, dict[int, float]]:
    """Held-out Pass@k of strategies that never read the question, from the training answers' frequencies q(a):

    "sample": draw k answers i.i.d. from q (a model at chance): mean over held-out problems of 1 - (1 - q(a_i))^k;
    "top": answer with the k most frequent training answers (the best answer-only strategy for Pass@k): the fraction
    of held-out answers among them. Answers compare as strings (the generated answers are canonical integers).
    """
    if not train or not heldout:
        raise ValueError("need at least one training and one held-out problem")
    counts = Counter(p["answer"] for p in train)
    q = np.array([counts.get(p["answer"], 0) / len(train) for p in heldout])  # (H,)
    rank = {a: r for r, (a, _) in enumerate(counts.most_common())}  # 0 = the commonest training answer
    ranks = np.array([rank.get(p["answer"], np.inf) for p in heldout])  # (H,); an unseen answer is never guessed
    return {
        "sample": {k: float(np.mean(1.0 - (1.0 - q) ** k)) for k in ks},
        "top": {k: float(np.mean(ranks < k)) for k in ks},
    }
