"""Math problems (docs/design.md section 5): one schema, loaded from local files or, only when asked, from the hub.

A problem is a dict {"id": str, "question": str, "answer": str}; the generated families (generated.py) add an optional
"solution" (a worked solution ending in \\boxed{answer}) for a supervised warm start. `answer` is the gold answer alone,
as grading.score takes it: a GSM8K-style worked answer "... #### 72" is reduced to "72" (thousands commas dropped), and
a list-valued answer (OlympiadBench's final_answer) is joined with ", ". REGISTRY maps each short slug to its hub
dataset, split and native field names. `load_dataset_spec("math500")` reads data/math/math500-test.jsonl (or .parquet)
under the repository; if the file is missing it raises FileNotFoundError naming that path and the hub dataset, unless
allow_download=True, which fetches it with datasets.load_dataset and writes that file, so later runs are offline.
Ids are stable strings: the dataset's own id field where it has one, else "<slug>-<split>-<row index>" (for a file
read by its path, "<file stem>-<row index>"); the written files keep them.

Fetch one set (on a machine with hub access):
    python -c "from experiments.math.data import load_dataset_spec as l; l('gsm8k', allow_download=True)"
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from sera.datafiles import load_named, local_path, read_rows, write_jsonl

__all__ = ["load_dataset_spec", "local_path", "read_rows", "write_jsonl"]  # the last three: sera.datafiles'

FIELDS = ("id", "question", "answer")
DATA_DIR = Path(__file__).resolve().parents[2] / "data" / "math"


@dataclass(frozen=True)
class HubSpec:
    """Where one dataset lives on the hub and how its native fields map onto the schema."""

    hub: str
    """The hub dataset name, passed to datasets.load_dataset."""
    split: str
    """The split used by default (the paper's train or evaluation split)."""
    config: str | None = None
    """The dataset's configuration name, if it has several."""
    question: str = "question"
    """Native field holding the question."""
    answer: str = "answer"
    """Native field holding the gold answer (reduced as the module docstring says)."""
    id: str | None = None
    """Native field holding a stable id; None: ids are "<slug>-<split>-<row index>"."""
    context: str | None = None
    """Native field whose non-empty text is put before the question (OlympiadBench's shared problem context)."""
    keep: Callable[[dict], bool] | None = None
    """Rows for which this is False are dropped (before ids are assigned)."""
    data_files: str | None = None
    """A file inside the hub repository that holds the split (passed to datasets.load_dataset), when it has several."""
    first: int | None = None
    """Only the first this many rows are kept (after `keep`)."""


# Hub ids and field names follow public loaders of these sets; the ones marked "unverified" were not checked against
# the hub here (no hub access on this machine) and may need an edit once someone fetches them.
REGISTRY: dict[str, HubSpec] = {
    "gsm8k": HubSpec("openai/gsm8k", "train", config="main"),  # answer: worked solution ending "#### 72"
    # GSM8K-Platinum: the GSM8K test set relabelled; same fields. Dropping rows marked "rejected" is a no-op if the
    # hub copy already excludes them (unverified which it does).
    "gsm8k-platinum": HubSpec(
        "madrylab/gsm8k-platinum", "test", config="main", keep=lambda row: row.get("cleaning_status") != "rejected"
    ),
    "math500": HubSpec("HuggingFaceH4/MATH-500", "test", question="problem", id="unique_id"),
    "aime2025": HubSpec("math-ai/aime25", "test", question="problem", id="id"),  # id field: unverified
    "beyondaime": HubSpec("ByteDance-Seed/BeyondAIME", "test", question="problem"),
    "minerva": HubSpec("math-ai/minervamath", "test"),
    # OlympiadBench: the 675-problem text-only English maths subset as math-ai hosts it (final_answer is a list);
    # the original is Hothan/OlympiadBench, config OE_TO_maths_en_COMP, split train. Context field: unverified.
    "olympiadbench": HubSpec("math-ai/olympiadbench", "test", answer="final_answer", id="id", context="context"),
    "polaris": HubSpec("POLARIS-Project/Polaris-Dataset-53K", "train", question="problem"),
    # The SERA authors' Qwen2.5-Math-1.5B training set: 8,192 MATH level 3-5 problems from SimpleRL-Zoo's data. Their
    # repository does not say which 8,192 of the file's rows; the suite keeps the first 8,192. File and field names:
    # unverified (SimpleRL-Zoo's level-3-to-5 file, its question and gt_answer fields).
    "simplerl-math35": HubSpec(
        "hkust-nlp/SimpleRL-Zoo-Data",
        "train",
        answer="gt_answer",
        data_files="simplelr_qwen_level3to5/train.parquet",
        first=8192,
    ),
}
_BY_HUB = {spec.hub: slug for slug, spec in REGISTRY.items()}


def clean_answer(value) -> str:
    """The gold answer as a string: after the last "####" if present (commas dropped), lists joined with ", "."""
    if isinstance(value, list | tuple):
        return ", ".join(clean_answer(v) for v in value)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = str(value).strip()
    if "####" in text:
        text = text.rsplit("####", 1)[1].strip().replace(",", "")
    return text


def to_problems(rows: Iterable[dict], spec: HubSpec | None, id_prefix: str) -> list[dict]:
    """Rows in a native layout (`spec`; None: the schema's own field names) -> problems in the schema.

    Raises ValueError naming the missing field and the fields present, or a duplicated id.
    """
    q_field, a_field = (spec.question, spec.answer) if spec else ("question", "answer")
    id_field = spec.id if spec else "id"
    problems, seen = [], set()
    kept = (r for r in rows if spec is None or spec.keep is None or spec.keep(r))
    for index, row in enumerate(itertools.islice(kept, spec.first if spec else None)):
        for field in (q_field, a_field):
            if field not in row:
                raise ValueError(f"row {index} has no {field!r} field (fields: {sorted(row)}); pass fields=<slug>")
        question = str(row[q_field]).strip()
        if spec and spec.context and row.get(spec.context):
            question = f"{str(row[spec.context]).strip()}\n{question}"
        has_id = id_field is not None and row.get(id_field) is not None
        pid = str(row[id_field]) if has_id else f"{id_prefix}-{index:05d}"
        if pid in seen:
            raise ValueError(f"duplicate problem id {pid!r}")
        seen.add(pid)
        problems.append({"id": pid, "question": question, "answer": clean_answer(row[a_field])})
    return problems


def load_dataset_spec(
    name_or_path: str | Path,
    split: str | None = None,
    *,
    fields: str | None = None,
    data_dir: Path = DATA_DIR,
    allow_download: bool = False,
) -> list[dict]:
    """Problems in the schema from a registry slug or hub name (REGISTRY) or a local .jsonl/.parquet file.

    A slug reads local_path(slug, split or its default split); missing, it is fetched from the hub only with
    `allow_download` (then written there), else FileNotFoundError names the path and the hub dataset. A file path is
    read as the schema's fields, or in the native layout of registry dataset `fields` (e.g. fields="math500" for
    MATH-500's problem/answer/unique_id); `split` applies only to registry names. Any file whose first record has
    all of FIELDS is read in the schema's own layout (the files this function writes are).
    """
    name = str(name_or_path)
    slug = _BY_HUB.get(name, name)
    if fields is not None and fields not in REGISTRY:
        raise ValueError(f"fields={fields!r}: expected one of {sorted(REGISTRY)} or None for the schema's own fields")
    if slug in REGISTRY:
        if fields is not None:
            raise ValueError(f"fields= applies to a file path; {slug!r} already names its layout")
        split = split or REGISTRY[slug].split

    def read(path: Path, spec: HubSpec | None) -> list[dict]:
        return _from_file(path, spec, f"{slug}-{split}") if spec else _from_file(path, REGISTRY.get(fields), path.stem)

    def fetch(spec: HubSpec, split: str, path: Path) -> list[dict]:
        problems = to_problems(_download(spec, split), spec, f"{slug}-{split}")
        write_jsonl(problems, path)
        return problems

    return load_named(slug, split, REGISTRY, data_dir, read=read, fetch=fetch, allow_download=allow_download,
                      loader="load_dataset_spec", kind="registry datasets")  # fmt: skip


def _from_file(path: Path, spec: HubSpec | None, id_prefix: str) -> list[dict]:
    # A file that already has the schema's fields (as write_jsonl leaves it) is read as is, whatever `spec` says.
    rows = read_rows(path)
    native = spec is not None and not (rows and all(f in rows[0] for f in FIELDS))
    return to_problems(rows, spec if native else None, id_prefix)


def _download(spec: HubSpec, split: str) -> list[dict]:
    import datasets

    if spec.data_files is not None:
        return list(datasets.load_dataset(spec.hub, data_files={split: spec.data_files}, split=split))
    return list(datasets.load_dataset(spec.hub, spec.config, split=split))
