"""Speed of SARA's step (sera.sequential.sara_step): the vectorised version against the per-group loop it replaced.
Run: `make bench` (or python -m bench.bench_sequential).

Prints, from one run, the time of 20 fill-mode steps (B = 256 groups of n = 8, the flat prior with a first probe of
4, the wave cap of 16) on a simulated classifier-like population where about 90% of fresh groups of 8 are all-equal,
so most steps probe several thousand prompts: the loop version, read from git at commit LOOP_COMMIT (the last with
it), against the shipped one; both get the same rewards, and the bench checks that every step's result is the same.
Also the default population prior (k0 = 2) on the same population, for scale. The loop version needs the repository's
git history; without it only the shipped version is timed.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from sera.sequential import SaraPrior, SequentialSettings, sara_step

LOOP_COMMIT = "740d221"  # sera/sequential.py with the per-group loop (before the vectorised sara_step)
STEPS, N, BATCH, PROMPTS = 20, 8, 256, 50_000


def loop_module():
    """sera/sequential.py at LOOP_COMMIT as a module, or None without the git history."""
    root = Path(__file__).resolve().parents[1]
    try:
        source = subprocess.run(["git", "show", f"{LOOP_COMMIT}:sera/sequential.py"], cwd=root, check=True,
                                capture_output=True, text=True).stdout  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return None
    path = Path(tempfile.mkdtemp()) / "sequential_loop.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sequential_loop", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def population(seed: int = 0) -> np.ndarray:
    """p per prompt: 80% near 1, 8% near 0, 12% spread (a warm-started classifier's shape)."""
    rng = np.random.default_rng(seed)
    kind = rng.choice(3, PROMPTS, p=[0.8, 0.08, 0.12])
    return np.select([kind == 0, kind == 1], [rng.beta(30, 0.3, PROMPTS), rng.beta(0.3, 30, PROMPTS)],
                     rng.uniform(size=PROMPTS))  # fmt: skip


def run(step_fn, settings, p, prior=None) -> tuple[float, list]:
    """STEPS steps of step_fn over a stream that cycles through the prompts; (seconds, results)."""
    rng = np.random.default_rng(1)
    cursor = [0]

    def draw(ids, counts):
        return (rng.random(int(np.sum(counts))) < np.repeat(p[ids], counts)).astype(np.float64)

    def next_prompts(k):
        ids = np.arange(cursor[0], cursor[0] + k) % PROMPTS
        cursor[0] += k
        return ids

    results, start = [], time.perf_counter()
    for _ in range(STEPS):
        kwargs = {} if prior is None else {"prior": prior}
        result = step_fn(settings, N, BATCH, None, draw, next_prompts, **kwargs)
        if prior is not None:
            prior.observe(result.drawn_ids, result.drawn_successes, result.drawn_failures, result.probe_successes)
        results.append(result)
    return time.perf_counter() - start, results


SHARED = ("prompt_ids", "counts", "rewards", "rollouts_generated", "rollouts_trained", "groups_committed",
          "groups_abandoned", "groups_discarded", "prompts_drawn", "waves", "hit_wave_cap", "shortfall",
          "abandoned_ids", "abandoned_successes", "abandoned_failures")  # fmt: skip


def main() -> None:
    p = population()
    flat = SequentialSettings(prior="flat", k0=4)
    t_new, new = run(sara_step, flat, p)
    groups = np.mean([r.prompts_drawn for r in new])
    print(f"SARA step, B={BATCH}, n={N}, flat prior, k0=4, {STEPS} steps ({groups:.0f} groups a step on average):")
    old = loop_module()
    if old is None:
        print(f"  vectorised: {t_new / STEPS * 1e3:.1f} ms a step (the loop version needs git history)")
    else:
        old_settings = old.SequentialSettings(**{f.name: getattr(flat, f.name) for f in dataclasses.fields(
            old.SequentialSettings)})  # fmt: skip
        t_old, previous = run(old.sara_step, old_settings, p)
        same = all(np.array_equal(getattr(a, k), getattr(b, k)) for a, b in zip(new, previous, strict=True)
                   for k in SHARED)  # fmt: skip
        print(f"  loop ({LOOP_COMMIT}): {t_old / STEPS * 1e3:.1f} ms a step; vectorised: {t_new / STEPS * 1e3:.1f} ms; "
              f"speed-up {t_old / t_new:.1f}x; same results: {same}")  # fmt: skip
        if not same:
            raise SystemExit("the vectorised sara_step differs from the loop version")
    default = SequentialSettings()
    t_pop, results = run(sara_step, default, p, prior=SaraPrior(default))
    groups = np.mean([r.prompts_drawn for r in results])
    print(f"  default (population prior, k0=2): {t_pop / STEPS * 1e3:.1f} ms a step ({groups:.0f} groups a step)")


if __name__ == "__main__":
    main()
