"""The method registry and a run's method settings: one place for every method decision (docs/architecture.md).

`METHODS` has one entry per row name of the paper's tables: an advantage estimator (sera.advantages.ADVANTAGES), a
rollout allocator (an entry of sera.allocators.SAMPLERS), whether SERA's multiplicity correction applies, and the
method's default p_hat source. `MethodSettings.from_config` reads a run config's `method`, `n0` and `alloc` groups
once, fills the defaults from the registry and docs/design.md, applies every cross-field rule, and is what the library
takes; nothing below the entry points reads the Hydra config or branches on method strings.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sera.allocators import SAMPLERS, Sampler
from sera.estimation import P_HI, P_LO
from sera.sequential import SequentialSettings

# how p_hat is obtained (docs/design.md section 3); beta: the authors' epoch-frozen Beta history (sera, LMs)
ESTIMATORS = ("none", "pilot", "history", "oracle", "beta")
AGGREGATIONS = ("token-mean", "seqnorm", "seq-mean-token-mean")  # loss normalisation (docs/design.md section 6)


@dataclass(frozen=True)
class Method:
    """One row of the paper's tables."""

    name: str  # registry key = config file = table row id
    label: str  # the paper's display name
    advantage: str | None  # key of sera.advantages.ADVANTAGES; None = exact likelihood (Direct CE, no rollouts)
    allocator: str = "uniform"  # key of sera.allocators.SAMPLERS, which says what the allocator needs
    multiplicity_correction: bool = False  # SERA: weight each rollout by n0 / n_i
    estimator: str = "none"  # default p_hat source
    pilot_m: int = 0  # default pilot rollouts per prompt
    baseline: str | None = None  # the method this one is tested against in the tables (SERA: MaxRL, uniform counts)
    folder: str | None = None  # the run folders' prefix when it is not the name (the name the method had before)

    @property
    def folder_name(self) -> str:
        return self.folder or self.name

    @property
    def sampler(self) -> Sampler:
        return SAMPLERS[self.allocator]

    def p_hat_source(self, estimator: str | None, pilot_m: int | None) -> tuple[str, int]:
        """(estimator, pilot_m) with a null one filled in from this entry: SERA without pilots (pilot_m=0) is SERA
        with the historical p_hat, and only the pilot source takes pilots."""
        if estimator is None:
            estimator = "history" if pilot_m == 0 and self.estimator == "pilot" else self.estimator
        return estimator, pilot_m if pilot_m is not None else (self.pilot_m if estimator == "pilot" else 0)


METHODS = {
    m.name: m
    for m in [
        Method("direct_ce", "Direct CE", advantage=None, allocator="none"),
        Method("grpo", "GRPO", "grpo"),
        Method("maxrl", "MaxRL", "maxrl"),
        # the suite's first rule: every prompt, 8 pilots reused in the group (docs/design.md section 2); its runs'
        # folders keep the name `sera` it had until 2026-12-06
        Method(
            "sera_pilot",
            "SERA with pilots",
            "maxrl",
            "waterline",
            True,
            "pilot",
            pilot_m=8,
            baseline="maxrl",
            folder="sera",
        ),
        # SERA as its authors run it (docs/design.md section 2.7): the exact p on the classifier, their Beta history
        # on the language models, their active set; its runs' folders keep the name `sera_authors` it had before
        Method("sera", "SERA", "maxrl", "active", True, "oracle", baseline="maxrl", folder="sera_authors"),
        Method("pkpo", "PKPO (T=16)", "pkpo"),
        Method("dars_hw", "DARS-HW", "grpo", allocator="dars_hw"),
        # Sequential allocation and prompt selection (the SARA seed and its baselines; docs/design.md section 4)
        Method("ds", "DS (DAPO)", "grpo", allocator="ds"),
        Method("dps", "DPS", "grpo", allocator="dps"),
        Method("sara", "SARA", "grpo", allocator="sara"),
        Method("sara+dps", "SARA+DPS", "grpo", allocator="sara+dps"),
        Method("sara+sera", "SARA+SERA", "maxrl", allocator="sara+sera", multiplicity_correction=True),
        # SARA's allocation with MaxRL's advantage and no SERA: separates SARA+SERA's advantage from its allocation
        Method("sara+maxrl", "SARA+MaxRL", "maxrl", allocator="sara"),
    ]
}


# method.naming of the configs written since `sera` names the authors' rule (configs/method/common.yaml). A config
# without it was written under the earlier names: `sera` was the pilot rule and `sera_authors` the authors' rule.
NAMING = 2
EARLIER_NAMES = {"sera": "sera_pilot", "sera_authors": "sera"}


def current_names(config: dict) -> dict:
    """A run config (a dict) with its method named as today: a config recorded before method.naming existed has its
    earlier name translated (EARLIER_NAMES) and is marked with today's naming, so translating twice changes nothing."""
    method = config.get("method") if isinstance(config, dict) else None
    if not isinstance(method, dict) or method.get("naming") == NAMING:
        return config
    name = method.get("name")
    return {**config, "method": {**method, "name": EARLIER_NAMES.get(name, name), "naming": NAMING}}


def get_method(name) -> Method:
    """Look a method up by name, with a clear error for an unknown one."""
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; known methods: {', '.join(METHODS)}")
    return METHODS[name]


@dataclass(frozen=True)
class Study:
    """What a study can run: which p_hat sources it has and whether it has an exact-likelihood reference."""

    name: str
    estimators: tuple[str, ...] = ("none", "pilot", "history", "beta")
    exact_likelihood: bool = False  # Direct CE is possible (the classifier)
    repeated_prompts: bool = True  # prompts recur, so a historical p_hat exists
    sequential: bool = True  # the step can draw more prompts (DS, DPS, SARA); DPS also needs repeated prompts


@dataclass(frozen=True)
class MethodSettings:
    """A run's method settings, defaults filled in and every cross-field rule checked (docs/design.md sections 1-4
    and 6)."""

    method: Method
    n0: int  # nominal rollouts per prompt; a step's budget is B * n0
    estimator: str  # p_hat source: none | pilot | history | oracle
    pilot_m: int  # pilots per prompt, reused as the first m rollouts of the group
    p_lo: float  # p_hat clipping range
    p_hi: float
    n_min: int  # allocation bounds: n_min <= n_i <= n_max (a prompt outside the authors' active set gets 0)
    n_max: int
    delta: int  # exponent offset of c(p, n) = 1 - (1 - p)^(n - delta): 1, or 0 with keep_cv_on_zero
    multiplicity_correction: bool  # SERA: every rollout of prompt i weighted by n0 / n_i
    aggregation: str  # token-mean | seqnorm | seq-mean-token-mean
    adv_kwargs: dict = field(default_factory=dict)  # the advantage function's options (MaxRL variant, PKPO's k)
    sequential: SequentialSettings = field(default_factory=SequentialSettings)  # DS, DPS, SARA
    threshold: float | None = None  # the authors' rule: P(mixed group) a prompt needs to be active (0: all active)

    @property
    def sampler(self) -> Sampler:
        """The allocator's registry entry: its collection step and what it needs."""
        return self.method.sampler

    @property
    def is_rl(self) -> bool:
        return self.method.advantage is not None

    def budget(self, batch: int) -> int:
        """R = B * n0 rollouts a step (DARS-HW adds to it; report its actual count)."""
        return batch * self.n0

    @classmethod
    def from_config(cls, cfg, study: Study) -> MethodSettings:
        """Build and validate from a run config's `method`, `n0` and `alloc` groups; ValueError on any bad value."""
        mc = cfg.method
        name = mc.get("name") if hasattr(mc, "get") else None
        if hasattr(mc, "get") and mc.get("naming") is None and name in EARLIER_NAMES:  # a config recorded before
            name = EARLIER_NAMES[name]
        if name is None or str(name) == "???":
            raise ValueError(
                f"method=common is the shared base of the method files, not a method; choose from {', '.join(METHODS)}"
            )
        return cls.build(
            study, str(name), int(cfg.n0), estimator=mc.estimator, pilot_m=mc.pilot_m,
            p_lo=P_LO if mc.p_lo is None else mc.p_lo, p_hi=P_HI if mc.p_hi is None else mc.p_hi,
            aggregation=mc.aggregation, multiplicity_correction=mc.multiplicity_correction,
            keep_cv_on_zero=bool(mc.keep_cv_on_zero), pkpo_k=int(mc.pkpo_k), n_min=cfg.alloc.n_min,
            n_max=cfg.alloc.n_max, delta=cfg.alloc.delta, sequential=mc.get("sequential"),
            threshold=cfg.alloc.get("threshold"),
        )  # fmt: skip

    @classmethod
    def build(
        cls, study: Study, name: str, n0: int, *, estimator: str | None = None, pilot_m: int | None = None,
        p_lo: float = P_LO, p_hi: float = P_HI, aggregation: str = "token-mean",
        multiplicity_correction: bool | None = None, keep_cv_on_zero: bool = False, pkpo_k: int = 16,
        n_min: int | None = None, n_max: int | None = None, delta: int | None = None, sequential=None,
        threshold: float | None = None,
    ) -> MethodSettings:  # fmt: skip
        """The typed constructor (what from_config and the TRL trainer call): the registry's defaults where a setting
        is None, every cross-field rule checked; ValueError on any bad value. The checks go in the order of a step:
        p_hat's source, the advantage's options, the allocation's bounds, the sequential allocator's settings."""
        method = get_method(name)
        if method.advantage is None and not study.exact_likelihood:
            raise ValueError(f"{name} has no rollouts; the {study.name} study needs an RL method")
        estimator, pilot_m = _p_hat_source(method, study, estimator, pilot_m)
        if not 0 < p_lo <= p_hi < 1:
            raise ValueError(f"need 0 < method.p_lo <= method.p_hi < 1, got {p_lo}, {p_hi}")
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"unknown method.aggregation {aggregation!r}; choose from {AGGREGATIONS}")
        correction = _correction(method, multiplicity_correction)
        implied_delta = 0 if keep_cv_on_zero else 1
        if delta is not None and delta != implied_delta:
            raise ValueError(
                f"alloc.delta={delta} does not match the estimator: method.keep_cv_on_zero={keep_cv_on_zero} "
                f"gives c(p, n) = 1 - (1 - p)^(n - {implied_delta}); leave alloc.delta=null"
            )
        threshold = _threshold(method, estimator, keep_cv_on_zero, threshold)
        n_min, n_max = _bounds(method, n0, estimator, pilot_m, n_min, n_max, pkpo_k)
        sequential = _sequential(method, study, n0, sequential)
        adv_kwargs = {}
        if method.advantage == "maxrl":
            adv_kwargs = {"keep_cv_on_zero": bool(keep_cv_on_zero)}
        elif method.advantage == "pkpo":
            adv_kwargs = {"k": int(pkpo_k)}
        return cls(
            method, int(n0), estimator, int(pilot_m), float(p_lo), float(p_hi), int(n_min), int(n_max),
            implied_delta, bool(correction), str(aggregation), adv_kwargs, sequential, threshold,
        )  # fmt: skip

    def variant(self, name_default_source: bool = True) -> str:
        """Run-name suffix of the p_hat source ('-m8', '-history', '-oracle'; with name_default_source=False only
        when it is not the registry's default), '-mc'/'-nomc' when the correction is not the registry's, and each
        sequential setting the allocator reads that is not SequentialSettings' default ('-k0=4-prior=flat')."""
        tag = {"none": "", "pilot": f"-m{self.pilot_m}", "history": "-history", "oracle": "-oracle", "beta": "-beta"}[
            self.estimator
        ]
        if not name_default_source and (self.estimator, self.pilot_m) == (self.method.estimator, self.method.pilot_m):
            tag = ""
        if self.multiplicity_correction != self.method.multiplicity_correction:
            tag += "-mc" if self.multiplicity_correction else "-nomc"
        return tag + "".join(f"-{key}={value}" for key, value in self.sequential_changes().items())

    def sequential_changes(self) -> dict:
        """{setting: value} of the method.sequential settings the allocator reads that differ from the defaults."""
        return self.sequential.changes(self.sampler.reads)


def _p_hat_source(method: Method, study: Study, estimator: str | None, pilot_m: int | None) -> tuple[str, int]:
    """(estimator, pilot_m) of a run: the registry's where None (the authors' rule: the exact p where the study has
    it, else their Beta history), checked against the study and the method's allocator. docs/design.md section 3."""
    name, sampler = method.name, method.sampler
    if method.allocator == "active" and estimator is None:
        estimator = "oracle" if "oracle" in study.estimators else "beta"
    estimator, pilot_m = method.p_hat_source(estimator, pilot_m)
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown method.estimator {estimator!r}; choose from {ESTIMATORS}")
    if estimator not in study.estimators:
        raise ValueError(f"method.estimator={estimator} is unavailable in {study.name}: {study.estimators}")
    if estimator == "history" and not study.repeated_prompts:
        raise ValueError("method.estimator=history needs repeated prompts; this task draws fresh ones (use pilot)")
    if estimator == "beta" and not study.repeated_prompts:
        raise ValueError(
            f"{name}'s Beta history needs prompts that recur in epochs; with fresh prompts every step it would "
            "allocate uniformly for ever, which is MaxRL under SERA's name (the maze: set task.pool_size and "
            "task.pool_order=epoch)"
        )
    if estimator == "beta" and method.allocator != "active":
        raise ValueError(f"method.estimator=beta is the authors' estimator of method=sera, not of {name}")
    if sampler.p_hat and estimator == "none":
        raise ValueError(f"{name} needs a p_hat estimator: method.estimator={'|'.join(study.estimators[1:])}")
    if sampler.stream and not study.sequential:
        raise ValueError(f"{name} draws extra prompts during a step, which the {study.name} study does not support")
    if sampler.predictor and not study.repeated_prompts:
        raise ValueError(f"{name} predicts from each prompt's history: it needs prompts that recur (a finite pool)")
    if not sampler.p_hat and estimator != "none":
        raise ValueError(f"{name} allocates without p_hat: set method.estimator=none")
    if estimator == "pilot" and pilot_m < 1:
        raise ValueError("method.estimator=pilot needs method.pilot_m >= 1 (use estimator=history for m = 0)")
    if estimator != "pilot" and pilot_m != 0:
        raise ValueError(f"method.estimator={estimator} takes no pilots: set method.pilot_m=0")
    return estimator, pilot_m


def _correction(method: Method, multiplicity_correction: bool | None) -> bool:
    """SERA's multiplicity correction: the registry's where None; refused where every n_i = n0. docs/design.md 2.5."""
    if multiplicity_correction is None:
        return method.multiplicity_correction
    if multiplicity_correction and not method.sampler.unequal_counts:
        raise ValueError(f"method.multiplicity_correction=true has no effect on {method.name}: every n_i = n0")
    return multiplicity_correction


def _threshold(method: Method, estimator: str, keep_cv_on_zero: bool, threshold: float | None) -> float | None:
    """The authors' active-set threshold (0.05 where None) for their rule, which reads the exact p or the Beta history
    and equalises 1 - (1 - p)^(n - 1); None for every other method, which must not set one. docs/design.md 2.7."""
    name = method.name
    if method.allocator != "active":
        if threshold is not None:
            raise ValueError(f"alloc.threshold is the authors' active-set rule (method=sera); {name} has none")
        return None
    if estimator not in ("oracle", "beta"):
        raise ValueError(
            f"{name} allocates from the exact p (method.estimator=oracle, the classifier) or from the "
            "authors' epoch-frozen Beta history (method.estimator=beta, the language models), not "
            f"method.estimator={estimator} (docs/design.md section 2.7)"
        )
    if keep_cv_on_zero:
        raise ValueError(f"{name} equalises 1 - (1 - p)^(n - 1): method.keep_cv_on_zero must be false")
    threshold = 0.05 if threshold is None else threshold
    if not (isinstance(threshold, (int, float)) and 0.0 <= float(threshold) <= 1.0):
        raise ValueError(f"alloc.threshold must lie in [0, 1] (0: every prompt active), got {threshold!r}")
    return float(threshold)


def _bounds(
    method: Method, n0: int, estimator: str, pilot_m: int, n_min: int | None, n_max: int | None, pkpo_k: int
) -> tuple[int, int]:
    """(n_min, n_max) of a prompt's rollouts: the authors' 2 and 4 n0 for their rule, else max(2, m) and 8 n0, where
    None; for an RL method checked to hold the pilots and the budget B n0 (and PKPO's k). docs/design.md 2.4."""
    active = method.allocator == "active"
    n_min = n_min if n_min is not None else (2 if active else max(2, pilot_m))
    n_max = n_max if n_max is not None else (4 if active else 8) * n0
    if method.advantage is None:
        return n_min, n_max
    if n_min < 2:
        raise ValueError(f"alloc.n_min must be >= 2 (with n = 1 the MaxRL estimator is zero), got {n_min}")
    if estimator == "pilot" and n_min < pilot_m:
        raise ValueError(f"alloc.n_min={n_min} is below method.pilot_m={pilot_m}: pilots are in every group")
    if not n_min <= n0 <= n_max:
        raise ValueError(
            f"infeasible budget: B x n0={n0} rollouts cannot be split with {n_min} <= n_i <= {n_max} "
            "(need n_min <= n0 <= n_max; pilots count toward the budget)"
        )
    if method.advantage == "pkpo" and n0 < pkpo_k:
        raise ValueError(f"pkpo needs n0 >= method.pkpo_k ({n0} < {pkpo_k})")
    return n_min, n_max


def _sequential(method: Method, study: Study, n0: int, sequential) -> SequentialSettings:
    """The sequential allocators' settings (a dict or None: the defaults), checked against the method and study.
    docs/design.md section 4.3."""
    try:
        settings = SequentialSettings(**(sequential or {}))
    except (TypeError, ValueError) as err:
        raise ValueError(f"method.sequential: {err}") from None
    if method.sampler.prior and not settings.k0 <= n0:  # SARA's first probe (DS and DPS draw whole groups)
        raise ValueError(f"method.sequential: the first probe k0={settings.k0} must be <= n0={n0}")
    if method.sampler.prior and settings.prior == "history" and not study.repeated_prompts:
        raise ValueError("method.sequential.prior=history keeps each prompt's past outcomes: it needs prompts that "
                         "recur (a finite pool); use prior=population")  # fmt: skip
    return settings
