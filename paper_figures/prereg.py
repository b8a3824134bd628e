"""The pre-registered test of the language-model claims (results/cpu/PREREGISTRATION.md), as code. No torch.

Run: python -m paper_figures.prereg --runs runs      (make tables runs it at SCALE=cpu; a build poorer than the
committed results/cpu/preregistered.md, with fewer seeds or numbers, leaves it alone unless --force)

Each claim is a difference of two rows paired by seed (SERA minus MaxRL; for the rows that had one seed, the method
against MaxRL or the base model), read at a K and at evaluation steps fixed in advance. For each claim the table gives
the primary endpoint (the final evaluation), the secondary one (the mean over the last evaluations) and, for the SERA
claims, the sensitivity check on the seeds that ran after the pre-registration; each with the seed-level 95%
t-interval, the three-way decision and how the interval stands to the paper's effect. A claim whose seeds are not all
in says how many are and decides nothing. The seeds of R1 and R2 whose base model was trained again read both sides
from runs/retrained/ (amendment 1), the others from the study's main folder.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from paper_figures import guard
from paper_figures.render import write_table
from paper_figures.runs import Run, load_runs, read_once
from sera.passk import pass_at_k
from sera.runlog import BASE_FILE, DONE_FILE, base_identity, eval_record_file
from sera.stats import seed_t_interval, seeds_for_power

BASE = "base"  # a claim against the base model of the same seed
# Seeds whose base model the archive holds as records only run, with every run their rows pair, in a folder of their
# own under this one (PREREGISTRATION.md, amendment 1): runs/retrained/<study>-<scale>.
RETRAINED = "retrained"
OUT = Path(__file__).parent / "out"
HEADER = ["claim", "endpoint", "seeds", "difference (pp) [seed 95% t]", "decision", "paper (pp)", "vs the paper",
          "per seed (pp)"]  # fmt: skip


@dataclass(frozen=True)
class Claim:
    """One pre-registered comparison: `tested` minus `against` (a method, or BASE), paired by seed."""

    name: str
    study: str  # maze | math
    eval_set: str
    tested: str
    against: str
    aggregation: str
    k: int
    final: int  # the step of the primary endpoint
    secondary: tuple[int, ...]  # the steps the secondary endpoint averages
    seeds: tuple[int, ...]
    new_seeds: tuple[int, ...] = ()  # run after the pre-registration: the sensitivity check
    paper: float | None = None  # the paper's effect at its matching K, pp
    retrained: tuple[int, ...] = ()  # seeds read from the RETRAINED folder (their base model trained again)
    claimed: int = +1  # the sign the claim states: +1 above zero (SERA above MaxRL), -1 below (a loss)
    scale: str | None = None  # the runs' folder is <study>-<scale>; None: the table's scale
    exploratory: bool = False  # labelled exploratory in the registration: its interval is shown, nothing decided
    underpowered: str = ""  # the registration ran it at its seed cap, short of 80% power for this effect


@dataclass(frozen=True)
class PowerPlan:
    """How many seeds a claim gets (PREREGISTRATION_AUTHORS.md, fixed before its exploratory seeds ran): enough for
    80% power of the seed-level t-test at the effect the pilot rule's decided claim (`reference`) measured, with the
    larger of the two SDs (the exploratory seeds' differences, the reference claim's), never fewer than `minimum`
    and never more than `cap` (then the claim is run at the cap and said to be underpowered)."""

    claim: Claim  # the claim sized, its seeds the exploratory ones
    reference: str  # the name of the decided claim whose effect and SD are read
    minimum: int
    cap: int


MAZE = {"study": "maze", "eval_set": "heldout", "final": 800, "secondary": (600, 700, 800)}
MATH = {"study": "math", "eval_set": "chain-sum", "final": 800, "secondary": (600, 800)}
CLAIMS = (
    Claim("C1 maze token-mean", **MAZE, tested="sera_pilot", against="maxrl", aggregation="token-mean", k=32,
          seeds=tuple(range(12)), new_seeds=tuple(range(5, 12)), paper=3.70),
    Claim("C2 maze seqnorm", **MAZE, tested="sera_pilot", against="maxrl", aggregation="seqnorm", k=32,
          seeds=tuple(range(6)), new_seeds=(3, 4, 5), paper=3.03),
    Claim("C3 math token-mean", **MATH, tested="sera_pilot", against="maxrl", aggregation="token-mean", k=16,
          seeds=tuple(range(20)), new_seeds=tuple(range(5, 20)), paper=5.54),
    Claim("C4 math seqnorm", **MATH, tested="sera_pilot", against="maxrl", aggregation="seqnorm", k=16,
          seeds=(0, 1, 2), paper=5.54),
    Claim("R1 maze GRPO minus base", **MAZE, tested="grpo", against=BASE, aggregation="token-mean", k=64,
          seeds=(0, 1, 2), retrained=(1, 2), claimed=-1),
    Claim("R2 math GRPO minus base", **MATH, tested="grpo", against=BASE, aggregation="token-mean", k=128,
          seeds=(0, 1, 2), retrained=(1, 2), paper=-27.04, claimed=-1),
    Claim("R2 math PKPO minus MaxRL, Pass@1", **MATH, tested="pkpo", against="maxrl", aggregation="token-mean", k=1,
          seeds=(0, 1, 2), retrained=(1, 2), paper=-12.67, claimed=-1),
    Claim("R2 math PKPO minus MaxRL, Pass@128", **MATH, tested="pkpo", against="maxrl", aggregation="token-mean",
          k=128, seeds=(0, 1, 2), retrained=(1, 2), paper=16.48),
    Claim("R2 math DARS-HW minus MaxRL, Pass@1", **MATH, tested="dars_hw", against="maxrl", aggregation="token-mean",
          k=1, seeds=(0, 1, 2), retrained=(1, 2), paper=1.65),
    Claim("R2 math DARS-HW minus MaxRL, Pass@128", **MATH, tested="dars_hw", against="maxrl",
          aggregation="token-mean", k=128, seeds=(0, 1, 2), retrained=(1, 2), paper=-11.13, claimed=-1),
    # the authors' rule (PREREGISTRATION_AUTHORS.md)
    Claim("C5 maze token-mean, the authors' SERA", **MAZE, tested="sera", against="maxrl", aggregation="token-mean",
          k=32, seeds=tuple(range(24)), new_seeds=tuple(range(3, 24)), paper=3.70, scale="cpu_pool",
          underpowered="C1's effect (+4.43 pp)"),
    Claim("C6 math token-mean, the authors' SERA", **MATH, tested="sera", against="maxrl", aggregation="token-mean",
          k=16, seeds=tuple(range(5, 25)), new_seeds=tuple(range(8, 25)), paper=5.54),
    Claim("E1 math token-mean, the authors' SERA minus SERA with pilots", **MATH, tested="sera", against="sera_pilot",
          aggregation="token-mean", k=16, seeds=tuple(range(5, 20)), exploratory=True),
)  # fmt: skip

# The authors' rule (PREREGISTRATION_AUTHORS.md): each claim's exploratory seeds and how they size it. Its seeds are
# the first `seeds` from the exploratory ones on (their number from `python -m paper_figures.prereg power C5|C6`).
POWER_PLANS = {
    "C5": PowerPlan(Claim("C5 maze token-mean, the authors' SERA", **MAZE, tested="sera", against="maxrl",
                          aggregation="token-mean", k=32, seeds=(0, 1, 2), paper=3.70, scale="cpu_pool"),
                    reference="C1 maze token-mean", minimum=12, cap=24),
    "C6": PowerPlan(Claim("C6 math token-mean, the authors' SERA", **MATH, tested="sera", against="maxrl",
                          aggregation="token-mean", k=16, seeds=(5, 6, 7), paper=5.54),
                    reference="C3 math token-mean", minimum=20, cap=40),
}  # fmt: skip


def power_plan(runs: list[Run], plan: PowerPlan, reference_runs: list[Run]) -> dict:
    """The seed count `plan` asks for, with every number behind it."""
    reference = next(c for c in CLAIMS if c.name == plan.reference)
    explored = differences(runs, plan.claim, (plan.claim.final,))
    decided = differences(reference_runs, reference, (reference.final,))
    if len(explored) < len(plan.claim.seeds) or len(decided) < len(reference.seeds):
        raise ValueError(f"{plan.claim.name}: {len(explored)} of the exploratory seeds {plan.claim.seeds} and "
                         f"{len(decided)} of {reference.name}'s {len(reference.seeds)} seeds are in")  # fmt: skip
    effect = float(np.mean(list(decided.values())))
    sd_explored, sd_reference = (float(np.std(list(d.values()), ddof=1)) for d in (explored, decided))
    sd = max(sd_explored, sd_reference)
    needed = seeds_for_power(effect, sd, cap=plan.cap)
    return {"claim": plan.claim.name, "exploratory": explored, "sd_exploratory": sd_explored,
            "reference": reference.name, "effect": effect, "sd_reference": sd_reference, "sd": sd,
            "needed": needed, "seeds": plan.cap if needed is None else max(plan.minimum, needed),
            "underpowered": needed is None}  # fmt: skip


def record_passk(run: Run, eval_set: str, step: int | None, k: int) -> float | None:
    """Pass@k in % of one run on one evaluation set: the record at `step` (None: the newest), averaged over its
    questions; None when the run has no such record."""
    if step is None:
        record = run.eval_records.get(eval_set)
    else:
        path = run.path / eval_record_file(step, eval_set)
        record = json.loads(path.read_text()) if path.exists() else None
    if record is None or k > record["n"]:
        return None
    return 100 * float(pass_at_k(record["n"], np.asarray(record["correct"], dtype=np.int64), [k]).mean())


def runs_of(runs: list[Run], claim: Claim, method: str) -> dict[int, Run]:
    """The finished runs of one side of a claim by seed: the method's RL runs at the claim's aggregation (and the CPU
    scale's other settings), or the base models."""
    if method == BASE:
        chosen = [r for r in runs if r.get("experiment") == f"{claim.study}-base"]
    else:
        chosen = [r for r in runs if r.get("experiment") == claim.study and r.get("method.name") == method
                  and r.get("method.aggregation") == claim.aggregation]  # fmt: skip
    by_seed = {}
    for run in (r for r in chosen if r.finished):  # two runs of one seed (an ablation in the folder): no silent pick
        if run.get("seed") in by_seed:
            raise ValueError(f"{claim.name}: two finished {method} runs of seed {run.get('seed')} "
                             f"({by_seed[run.get('seed')].path.name}, {run.path.name}); a claim reads one per seed: "
                             "keep ablations and interventions in a folder of their own (run.root=)")  # fmt: skip
        by_seed[run.get("seed")] = run
    return by_seed


def base_of(run: Run) -> dict | None:
    """The base model an RL run started from: its own record (sera.runlog.BASE_FILE), or, for a run made before the
    record existed, the base model its folder holds for its seed (the one it was trained from: amendment 3); None
    where neither is there."""
    recorded = run.path / BASE_FILE
    if recorded.exists():
        return json.loads(recorded.read_text())
    folder_base = run.path.parent / f"base_seed-{run.get('seed')}"
    return base_identity(folder_base) if (folder_base / DONE_FILE).exists() else None


def check_same_base(a: Run, b: Run) -> None:
    """Refuse to pair two RL runs that started from different base models (`base_of`): a new run, trained from a base
    model trained again on another machine, against an archived run of the same seed is refused unless the retrained
    base reproduced the archived one's evaluation records."""
    first, second = base_of(a), base_of(b)
    if first is not None and second is not None and first != second:
        raise ValueError(f"refusing to pair {a.path} and {b.path}: they started from different base models "
                         f"({first} and {second})")  # fmt: skip


def differences(
    runs: list[Run], claim: Claim, steps: tuple[int, ...], retrained: Sequence[Run] = ()
) -> dict[int, float]:
    """Per seed of the claim that both sides finished: tested minus against, each side's Pass@k averaged over
    `steps` (the base model, evaluated once, at its own final step). Both sides of a seed come from one folder:
    `retrained` for the claim's retrained seeds, `runs` for the others."""
    main = runs_of(runs, claim, claim.tested), runs_of(runs, claim, claim.against)
    again = runs_of(retrained, claim, claim.tested), runs_of(retrained, claim, claim.against)
    out = {}
    for seed in claim.seeds:
        tested, against = again if seed in claim.retrained else main
        if seed not in tested or seed not in against:
            continue
        check_same_base(tested[seed], against[seed])
        a = [record_passk(tested[seed], claim.eval_set, s, claim.k) for s in steps]
        b = [record_passk(against[seed], claim.eval_set, None if claim.against == BASE else s, claim.k) for s in steps]
        if None not in a and None not in b:
            out[seed] = float(np.mean(a) - np.mean(b))
    return out


def side_of_zero(low: float, high: float, claimed: int) -> int:
    """Where an interval [low, high] lies for a claim of sign `claimed` (+1 above zero, -1 below): +1 entirely on the
    claimed side of zero, -1 entirely on the other, 0 across zero."""
    low, high = sorted((claimed * low, claimed * high))
    return 1 if low > 0 else -1 if high < 0 else 0


def verdict_of_interval(low: float, high: float, claimed: int = +1) -> str:
    """The three-way decision for a seed-level interval: supported, contradicted or not decided at this power."""
    return {1: "supported", -1: "contradicted", 0: "not decided at this power"}[side_of_zero(low, high, claimed)]


def size_against(low: float, high: float, claimed: int, effect: float) -> str:
    """How an interval stands to a claimed effect, sizes compared in the claimed direction: 'smaller than', 'larger
    than' or 'consistent with'."""
    low, high = sorted((claimed * low, claimed * high))
    return "smaller than" if high < claimed * effect else "larger than" if low > claimed * effect else "consistent with"


def decide(diffs: list[float], planned: int, paper: float | None, claimed: int = +1) -> tuple[str, str, str]:
    """(interval cell, decision, against the paper) by the pre-registered rule, read in the direction the claim states
    (`claimed`: +1 above zero, -1 below; amendment 2): supported when the interval lies entirely on the claimed side of
    zero, contradicted when entirely on the other; smaller or larger than the paper's effect in that direction."""
    if not diffs:
        return "not run", "no decision", ""
    ci = seed_t_interval(np.asarray(diffs))
    cell = f"{ci.delta:+.2f} [{ci.low:+.2f}, {ci.high:+.2f}]" if len(diffs) > 1 else f"{ci.delta:+.2f}"
    if len(diffs) < planned:
        return cell, f"in progress ({len(diffs)} of {planned} seeds): no decision", ""
    if len(diffs) < 2:
        return cell, "one seed: no interval", ""
    decision = verdict_of_interval(ci.low, ci.high, claimed)
    if paper is None:
        return cell, decision, ""
    return cell, decision, f"{size_against(ci.low, ci.high, claimed, paper)} the paper's"


def claim_rows(runs: list[Run], claim: Claim, retrained: Sequence[Run] = ()) -> list[list[str]]:
    """The claim's primary row, its secondary row and (SERA claims with new seeds) its sensitivity row, each with its
    seeds' differences; `retrained`: the runs of the RETRAINED folder."""
    paper = "" if claim.paper is None else f"{claim.paper:+.2f}"
    out = []
    steps = ", ".join(str(s) for s in claim.secondary)
    endpoints = [
        (f"primary: Pass@{claim.k} at step {claim.final}", (claim.final,), claim.seeds),
        (f"secondary: Pass@{claim.k}, mean of steps {steps}", claim.secondary, claim.seeds),
    ]
    if claim.new_seeds:
        endpoints.append(("sensitivity: primary, new seeds only", (claim.final,), claim.new_seeds))
    for endpoint, steps_read, seeds in endpoints:
        diffs = differences(runs, claim, steps_read, retrained)
        values = [diffs[s] for s in seeds if s in diffs]
        cell, decision, versus = decide(values, len(seeds), claim.paper, claim.claimed)
        if claim.exploratory and not decision.startswith("in progress"):
            decision, versus = "exploratory: decides nothing", ""
        label = f"{min(seeds)}-{max(seeds)}" if len(seeds) > 1 else str(seeds[0])
        each = ", ".join(f"{seed}: {diffs[seed]:+.2f}" for seed in seeds if seed in diffs)
        count = f"{len(values)} of {len(seeds)} ({label})"
        if claim.underpowered and endpoint.startswith("primary"):
            count += f", the cap: underpowered for {claim.underpowered}"
        out.append([claim.name, endpoint, count, cell, decision, paper, versus, each])
    return out


def prereg_table(runs_root: Path, scale: str = "cpu") -> tuple[list[str], list[list[str]]]:
    rows = []
    for claim in CLAIMS:
        folder = f"{claim.study}-{claim.scale or scale}"
        rows += claim_rows(load_runs(runs_root / folder), claim, load_runs(runs_root / RETRAINED / folder))
    return HEADER, rows


def power(argv) -> None:
    parser = argparse.ArgumentParser(description="the seed count a claim's power plan asks for")
    parser.add_argument("claim", choices=sorted(POWER_PLANS))
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    args = parser.parse_args(argv)
    plan = POWER_PLANS[args.claim]
    reference = next(c for c in CLAIMS if c.name == plan.reference)
    folder = lambda c: args.runs / f"{c.study}-{c.scale or 'cpu'}"  # noqa: E731
    out = power_plan(load_runs(folder(plan.claim)), plan, load_runs(folder(reference)))
    print(json.dumps(out, indent=1))


def main(argv=None) -> None:
    import sys

    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["power"]:
        return power(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=Path, default=Path("runs"))
    parser.add_argument("--out", type=Path, default=OUT, help="where the table is built")
    parser.add_argument("--results", type=Path, default=Path("results/cpu"), help="where the committed one is")
    parser.add_argument("--scale", default="cpu")
    parser.add_argument("--force", action="store_true", help="write over the committed table even if poorer")
    args = parser.parse_args(argv)
    with read_once():  # the claims share their runs: each run directory is read once
        header, rows = prereg_table(args.runs, args.scale)
    md = write_table(args.out / "preregistered", header, rows)
    print(md)
    print(guard.publish_table("preregistered", args.out, args.results, args.force))


if __name__ == "__main__":
    main()
