"""The method registry: one entry per row name of the paper's tables (STYLE.md: one name everywhere).

Pure data. A method is an advantage estimator (sera.advantages.ADVANTAGES), a rollout allocator, and whether
SERA's multiplicity correction applies. Experiments look methods up here; nothing branches on method strings.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Method:
    """One row of the paper's tables."""

    name: str  # registry key = config file = run directory = table row id
    label: str  # the paper's display name
    advantage: str | None  # key of sera.advantages.ADVANTAGES; None = exact likelihood (Direct CE, no rollouts)
    allocator: str = "uniform"  # uniform | waterline | dars_hw
    multiplicity_correction: bool = False  # SERA: weight each rollout by n0 / n_i


METHODS = {
    m.name: m
    for m in [
        Method("direct_ce", "Direct CE", advantage=None, allocator="none"),
        Method("grpo", "GRPO", "grpo"),
        Method("maxrl", "MaxRL", "maxrl"),
        Method("sera", "SERA", "maxrl", allocator="waterline", multiplicity_correction=True),
        Method("pkpo", "PKPO (T=16)", "pkpo"),
        Method("dars_hw", "DARS-HW", "grpo", allocator="dars_hw"),
    ]
}


def get_method(name: str) -> Method:
    """Look a method up by name, with a clear error for an unknown one."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}")
    return METHODS[name]


def allocation_bounds(cfg) -> tuple[int, int, int]:
    """(n_min, n_max, delta) of a run config, DESIGN defaults filled in (section 2): n_min = max(2, m) with m pilots,
    n_max = 8 n0, delta = 0 when MaxRL keeps its control variate on all-fail groups, else 1."""
    m = cfg.method.pilot_m if cfg.method.estimator == "pilot" else 0
    n_min = cfg.alloc.n_min if cfg.alloc.n_min is not None else max(2, m)
    n_max = cfg.alloc.n_max if cfg.alloc.n_max is not None else 8 * cfg.n0
    delta = cfg.alloc.delta if cfg.alloc.delta is not None else (0 if cfg.method.keep_cv_on_zero else 1)
    return n_min, n_max, delta


def advantage_kwargs(method: Method, method_cfg) -> dict:
    """Keyword arguments of the method's advantage function taken from its config (MaxRL's variant, PKPO's k)."""
    if method.advantage == "maxrl":
        return {"keep_cv_on_zero": method_cfg.keep_cv_on_zero}
    if method.advantage == "pkpo":
        return {"k": method_cfg.pkpo_k}
    return {}
