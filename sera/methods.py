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
