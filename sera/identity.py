"""Run identity, decided in one place: which settings change a run's results, how two configs differ, and the name
of a run's folder.

A run's folder is named from its config: a readable stem (method, p_hat source, aggregation for the language models,
n0, seed) and, for every other setting that changes results and differs from the study's default at the run's scale
and method, `key=value` (a short hash of them when they run long). So an ablation from the command line
(`method.p_lo=0.03125`) lands in a folder of its own, the loops refuse a different config in an existing folder
naming each differing key with both values, and the tables group runs by the same settings (paper_figures.runs).
"""

from __future__ import annotations

import copy
import functools
import hashlib

# Settings that never change what a run computes: how it runs (threads, progress, wandb, device, data loading), where
# its folder is (run.*) and where its data lives (data.root, task.data_dir). The seed changes results but is the
# stem's, and the tables' unit of repetition.
NOT_RESULTS = ("threads", "progress", "wandb", "device", "run", "data.workers", "task.data_dir", "data.root")
# The settings a stem spells out; every other differing setting goes into the name's suffix.
STEM_KEYS = ("seed", "n0", "method.name", "method.estimator", "method.pilot_m", "method.multiplicity_correction",
             "method.sequential")  # fmt: skip
LM_STEM_KEYS = (*STEM_KEYS, "method.aggregation")
MAX_SUFFIX = 60  # characters of key=value before the suffix is shortened with a hash


# Settings added after runs existed, with the value those runs had (their key path): a config holding one at this
# value is the same run as a config without it. SARA's prior: runs made before it existed used the flat prior (the
# fitted priors' window and decay did not exist either); eval.at_start and train.log_coverage add measurements only.
ADDED_DEFAULTS = {
    ("train", "parallel"): "ddp",
    ("train", "logprobs"): "repeated-cache",
    ("method", "sequential", "prior"): "flat",
    ("method", "sequential", "window"): 20,
    ("method", "sequential", "history_decay"): 0.7,
    ("eval", "at_start"): False,
    ("train", "log_coverage"): False,
    ("sft", "problems"): None,
    ("sft", "noise_p"): 0.0,
    ("sft", "noise_width"): 5,
    ("alloc", "threshold"): None,
    ("model", "zero_head"): False,
    ("task", "pool_order"): "step",
    ("optim", "warmup_epochs"): None,
    ("task", "train_set"): None,
    ("task", "eval_set"): None,
    ("train", "trim_responses"): False,
    ("train", "logprob_chunk"): None,
    ("alloc", "never_solved"): "keep",
    ("alloc", "uniform_epochs"): 1,
    ("alloc", "weight_cap"): None,
}


def _without(config: dict, path: tuple[str, ...], value) -> dict:
    """The config less the key at `path` when it holds `value` (the dicts along the path copied, never mutated)."""
    head, *rest = path
    node = config.get(head) if isinstance(config, dict) else None
    if not rest:
        return {k: v for k, v in config.items() if k != head} if head in config and node == value else config
    if not isinstance(node, dict):
        return config
    return {**config, head: _without(node, tuple(rest), value)}


def comparable_config(config: dict) -> dict:
    """The config less what its run does not read and less ADDED_DEFAULTS at their default, so a run made before such
    a setting existed is still the same run. Not read: the method options its advantage and allocator ignore (pkpo_k
    but for PKPO, keep_cv_on_zero but for MaxRL's advantage, the p_hat clip without p_hat); of method.sequential, all
    but the settings its allocator reads (none for the batch allocators); the vllm block unless engine=vllm; of
    optim.lr_by_method, all but the run's own rate, as optim.lr."""
    from sera.estimation import P_HI, P_LO
    from sera.methods import METHODS, current_names

    config = current_names(config)  # a config recorded under the earlier method names reads as today's
    if isinstance(config.get("method"), dict):  # which names it was written with changes no result
        config = {**config, "method": {k: v for k, v in config["method"].items() if k != "naming"}}
    if "vllm" in config and config.get("engine") != "vllm":
        config = {k: v for k, v in config.items() if k != "vllm"}
    method = config.get("method")
    entry = METHODS.get(method.get("name")) if isinstance(method, dict) else None
    if entry is not None:  # the method options its advantage and allocator do not read
        unread = {"pkpo_k"} if entry.advantage != "pkpo" else set()
        unread |= {"keep_cv_on_zero"} if entry.advantage != "maxrl" else set()
        unread |= {"p_lo", "p_hi"} if not entry.sampler.p_hat else set()
        method = {k: v for k, v in method.items() if k not in unread}
        # null means the default: the library's p_hat clip (sera.estimation), the registry's p_hat source, pilots and
        # correction (sera.methods), so `method.pilot_m=8` on SERA is the same run as SERA's default
        estimator, pilot_m = entry.p_hat_source(method.get("estimator") or None, method.get("pilot_m"))
        defaults = {"p_lo": P_LO, "p_hi": P_HI, "estimator": estimator, "pilot_m": pilot_m,
                    "multiplicity_correction": entry.multiplicity_correction}  # fmt: skip
        method = {k: defaults[k] if k in defaults and v is None else v for k, v in method.items()}
        config = {**config, "method": method}
    if isinstance(method, dict) and isinstance(method.get("sequential"), dict):
        reads = set(method["sequential"]) if entry is None else set(entry.sampler.reads)
        sequential = {k: v for k, v in method["sequential"].items() if k in reads}
        method = {k: v for k, v in method.items() if k != "sequential"} | ({"sequential": sequential} if reads else {})
        config = {**config, "method": method}
    optim = config.get("optim")
    if isinstance(optim, dict) and "lr_by_method" in optim:  # of the per-method rates, only the one the run trains with
        name = method.get("name") if isinstance(method, dict) else None
        lr = (optim["lr_by_method"] or {}).get(name, optim.get("lr"))
        config = {**config, "optim": {k: v for k, v in optim.items() if k != "lr_by_method"} | {"lr": lr}}
    for path, default in ADDED_DEFAULTS.items():
        config = _without(config, path, default)
    return config


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = tuple(v) if isinstance(v, list) else v
    return out


def _under(key: str, names) -> bool:
    return any(key == n or key.startswith(n + ".") for n in names)


def result_settings(config: dict) -> dict:
    """{dotted key: value} of everything in a config that changes its run's results (comparable_config, less
    NOT_RESULTS); lists as tuples."""
    return {k: v for k, v in _flatten(comparable_config(config)).items() if not _under(k, NOT_RESULTS)}


def differences(a: dict, b: dict) -> list[tuple[str, object, object]]:
    """(key, value in a, value in b) for every result-changing setting in which two configs differ, sorted by key;
    a key one of them lacks has None there."""
    x, y = result_settings(a), result_settings(b)
    return [(k, x.get(k), y.get(k)) for k in sorted(set(x) | set(y)) if x.get(k) != y.get(k)]


def describe(changes: list[tuple[str, object, object]]) -> str:
    """'method.p_lo: 0.05 there, 0.03125 here; ...' for a refusal message."""
    return "; ".join(f"{key}: {old!r} there, {new!r} here" for key, old, new in changes)


def _value(v) -> str:
    text = ",".join(map(str, v)) if isinstance(v, tuple) else str(v)
    return text.replace("/", "|").replace(" ", "")


def name_suffix(config: dict, default: dict | None, stem_keys=STEM_KEYS) -> str:
    """'_key=value,key=value' for each result-changing setting the stem does not spell out that differs from
    `default` (the study's config at the run's scale and method); '' without a default or a difference. A long
    suffix keeps its first keys and ends in a hash of all of them, so two different ablations never share a name."""
    if default is None:
        return ""
    parts = [f"{key}={_value(new)}" for key, _, new in differences(default, config) if not _under(key, stem_keys)]
    if not parts:
        return ""
    text = ",".join(parts)
    if len(text) > MAX_SUFFIX:
        digest = hashlib.sha1(text.encode()).hexdigest()[:8]
        text = f"{text[: MAX_SUFFIX - 10].rstrip(',')}..{digest}"
    return f"_{text}"


def run_name(stem: str, seed: int, config: dict, default: dict | None, stem_keys=STEM_KEYS) -> str:
    """A run's folder name: `<stem><suffix>_seed-<seed>` (name_suffix), the one both training loops use."""
    return f"{stem}{name_suffix(config, default, stem_keys)}_seed-{seed}"


def hydra_default() -> dict | None:
    """Inside a Hydra app: the config of the running study at the run's scale and method, with no other override
    (what name_suffix compares with); None outside one (a library caller names its runs itself)."""
    from hydra.core.hydra_config import HydraConfig

    try:
        hydra = HydraConfig.get()
    except ValueError:
        return None
    choices = hydra.runtime.choices
    overrides = tuple(f"{group}={choices[group]}" for group in ("scale", "method") if choices.get(group))
    sources = tuple(str(source.path) for source in hydra.runtime.config_sources)
    return copy.deepcopy(_composed(sources, hydra.job.config_name, overrides))


@functools.lru_cache(maxsize=16)
def _composed(sources: tuple[str, ...], config_name: str, overrides: tuple[str, ...]) -> dict:
    """A config composed once per process and config search path (a run names itself and its base run from the
    same default; a sweep's runs share it)."""
    from hydra import compose
    from omegaconf import OmegaConf

    return OmegaConf.to_container(compose(config_name=config_name, overrides=list(overrides)), resolve=True)
