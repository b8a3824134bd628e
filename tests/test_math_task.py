"""The math task pieces: the math-verify reward (last box, truncation, bad input, timeouts, threads), the loaders
(schema and native hub layouts in jsonl and parquet, GSM8K's "####" answers, nothing fetched unless asked), the prompt
templates, and the generated problem families (seeded, held-out disjoint from training, the guessing baseline)."""

import json
import re
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from experiments.math import data, generated, grading
from experiments.math.data import REGISTRY, load_dataset_spec, local_path, write_jsonl
from experiments.math.generated import HELDOUT_POOL, chain_sum, guessing_baseline, make_splits
from experiments.math.grading import last_boxed, score, score_batch
from experiments.math.prompts import INSTRUCT_SUFFIX, TEMPLATES, render

# ---------------------------------------------------------------- grading


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("So the answer is \\boxed{72}.", "72"),
        ("\\boxed{0.5}", "\\frac{1}{2}"),
        ("\\boxed{\\frac{1}{2}}", "0.5"),
        ("\\boxed{3/4}", "\\frac{3}{4}"),
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{-3}", "-3"),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("\\boxed{1,000}", "1000"),
        ("\\boxed {72}", "72"),
        ("\\boxed{\\{1,2\\}}", "\\{1,2\\}"),
    ],
)
def test_equal_answers_score_one(response, gold):
    assert score(response, gold) == 1.0


@pytest.mark.parametrize(
    ("response", "gold"),
    [
        ("\\boxed{73}", "72"),
        ("\\boxed{1.4142}", "\\sqrt{2}"),
        ("\\boxed{\\frac{1}{3}}", "0.5"),
        ("The answer is 72.", "72"),  # no box
        ("\\boxed{}", "72"),
        ("\\boxed{72", "72"),  # unclosed
        ("\\boxed 72", "72"),
        ("\\boxed{72} wait, no: \\boxed{\\frac{1}{2}", "72"),  # the last box is unclosed: no answer
        ("\\boxed{abc}", "72"),
    ],
)
def test_wrong_missing_or_malformed_answers_score_zero(response, gold):
    assert score(response, gold) == 0.0


def test_the_last_box_counts():
    response = "First \\boxed{3}, then on reflection \\boxed{4}."
    assert score(response, "4") == 1.0
    assert score(response, "3") == 0.0


def test_truncated_response_scores_zero():
    assert score("\\boxed{72}", "72") == 1.0
    assert score("\\boxed{72}", "72", truncated=True) == 0.0


def test_last_boxed_extraction():
    assert last_boxed("a \\boxed{\\frac{1}{2}} b") == "\\frac{1}{2}"
    assert last_boxed("\\boxed{1} \\boxed{x^{2}}") == "x^{2}"
    assert last_boxed("\\boxed{\\{1\\}}") == "\\{1\\}"
    assert last_boxed("\\boxed{\\}}") == "\\}"
    assert last_boxed("no box") is None
    assert last_boxed("\\boxed{{}") is None
    assert last_boxed("\\boxed{" + "1" * (grading.MAX_ANSWER_CHARS + 1) + "}") is None


@pytest.mark.parametrize("bad", [None, 72, 7.2, b"\\boxed{72}", ["\\boxed{72}"], {"a": 1}])
def test_non_string_input_scores_zero(bad):
    assert score(bad, "72") == 0.0
    assert score("\\boxed{72}", bad) == 0.0


def test_truncated_flag_that_has_no_truth_value_scores_zero():
    assert score("\\boxed{72}", "72", truncated=np.array([1, 2])) == 0.0


def test_very_long_responses_do_not_raise():
    filler = "Let me think. " * 15_000  # ~210k characters
    assert score(filler + "\\boxed{72}", "72") == 1.0
    assert score(filler, "72") == 0.0
    assert score("\\boxed{" + "(" * 200_000, "72") == 0.0
    assert score("\\boxed{" + "{" * 200_000 + "}" * 200_000 + "}", "72") == 0.0


def test_pathological_answer_scores_zero(monkeypatch):
    monkeypatch.setattr(grading, "TIMEOUT_S", 1)
    assert score("\\boxed{9^{9^{9^{9}}}}", "4") == 0.0


@pytest.fixture
def fresh_grading_caches():
    """Grading results are cached by (answer, gold); a test that patches math-verify must not leave its results."""
    grading._matches.cache_clear()
    grading._parse_gold.cache_clear()
    yield
    grading._matches.cache_clear()
    grading._parse_gold.cache_clear()


@pytest.mark.parametrize("stage", ["parse", "verify"])
def test_a_slow_grading_stage_is_stopped_by_the_timeout(monkeypatch, fresh_grading_caches, stage):
    """math-verify's parsing of the answer, or its symbolic comparison, made to take 3 s before giving the right
    result: with a 1 s timeout the alarm stops it and the answer scores 0; without the timeout it would score 1."""
    import time

    import math_verify.grader
    import math_verify.parser

    extract, compare = math_verify.parser.extract_target_from_pred, math_verify.grader.sympy_expr_eq
    calls, armed = [], []

    def slow(function):
        def run(*args, **kwargs):
            calls.append(function.__name__)
            time.sleep(3)
            return function(*args, **kwargs)

        return run

    def symbolic_only(pred, *args, **kwargs):  # no string fallback: every comparison goes through sympy_expr_eq
        found = [x for x in extract(pred, *args, **kwargs) if not isinstance(x, str)]
        return slow(lambda: found)() if stage == "parse" and armed and "2469134/2" in pred else found  # the answer

    monkeypatch.setattr(math_verify.parser, "extract_target_from_pred", symbolic_only)
    assert score("\\boxed{2469134/2}", "1234567") == 1.0 and calls == []  # the pair grades as correct
    grading._matches.cache_clear()
    armed.append(True)
    if stage == "verify":
        monkeypatch.setattr(math_verify.grader, "sympy_expr_eq", slow(compare))
    monkeypatch.setattr(grading, "TIMEOUT_S", 1)
    assert score("\\boxed{2469134/2}", "1234567") == 0.0
    assert calls, f"the slow {stage} stage was never reached"


def test_grading_from_another_thread():
    results, errors = [], []

    def work():
        try:
            results.append((score("\\boxed{0.75}", "3/4"), score("\\boxed{0.7}", "3/4"), score(None, "1")))
        except BaseException as err:  # the test fails below on any escape
            errors.append(err)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert errors == []
    assert results == [(1.0, 0.0, 0.0)]


def test_score_batch():
    rewards = score_batch(["\\boxed{1}", "\\boxed{2}", "\\boxed{2}", "2"], ["1", "2", "2", "2"], [0, 0, 1, 0])
    assert rewards.dtype == np.float64
    np.testing.assert_array_equal(rewards, [1.0, 1.0, 0.0, 0.0])
    np.testing.assert_array_equal(score_batch(["\\boxed{5}"], ["5"]), [1.0])
    assert score_batch([], []).shape == (0,)
    with pytest.raises(ValueError, match="as many"):
        score_batch(["\\boxed{1}"], ["1", "2"])


# ---------------------------------------------------------------- data


def write_rows(path, rows):
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


GSM8K_ROWS = [
    {"question": "Tom has 70 apples and buys 2. How many?", "answer": "70 + 2 = 72\n#### 72"},
    {"question": "What is 1000 + 234?", "answer": "It is 1,234.\n#### 1,234"},
]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_schema_file(tmp_path, suffix):
    rows = [{"id": "a", "question": "1 + 1?", "answer": "2"}, {"id": "b", "question": "Half?", "answer": "\\frac12"}]
    path = write_rows(tmp_path / f"mine{suffix}", rows)
    assert load_dataset_spec(path) == rows
    assert load_dataset_spec(str(path)) == rows


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_gsm8k_native_layout_from_the_registry_path(tmp_path, suffix):
    write_rows(local_path("gsm8k", "train", tmp_path).with_suffix(suffix), GSM8K_ROWS)
    problems = load_dataset_spec("gsm8k", data_dir=tmp_path)
    assert [p["answer"] for p in problems] == ["72", "1234"]
    assert [p["id"] for p in problems] == ["gsm8k-train-00000", "gsm8k-train-00001"]
    assert problems[0]["question"] == GSM8K_ROWS[0]["question"]
    assert load_dataset_spec("openai/gsm8k", data_dir=tmp_path) == problems  # the hub name resolves too


def test_native_layouts_through_fields(tmp_path):
    math500 = [{"problem": "Find x.", "answer": "\\frac{3}{4}", "unique_id": "test/algebra/1.json"}]
    assert load_dataset_spec(write_rows(tmp_path / "m.jsonl", math500), fields="math500") == [
        {"id": "test/algebra/1.json", "question": "Find x.", "answer": "\\frac{3}{4}"}
    ]
    olympiad = [
        {"id": 7, "question": "Find n.", "final_answer": ["$5$"], "context": "Let n be odd."},
        {"id": 8, "question": "Find a, b.", "final_answer": ["1", "2"], "context": None},
    ]
    problems = load_dataset_spec(write_rows(tmp_path / "o.parquet", olympiad), fields="olympiadbench")
    assert problems[0] == {"id": "7", "question": "Let n be odd.\nFind n.", "answer": "$5$"}
    assert problems[1]["answer"] == "1, 2"
    aime = [{"problem": "AIME 1", "answer": 204}]  # integer answers become strings; no id field: row index
    assert load_dataset_spec(write_rows(tmp_path / "a.jsonl", aime), fields="beyondaime") == [
        {"id": "a-00000", "question": "AIME 1", "answer": "204"}
    ]


def test_platinum_drops_rejected_rows(tmp_path):
    rows = [dict(GSM8K_ROWS[0], cleaning_status="consensus"), dict(GSM8K_ROWS[1], cleaning_status="rejected")]
    write_rows(local_path("gsm8k-platinum", "test", tmp_path), rows)
    assert [p["answer"] for p in load_dataset_spec("gsm8k-platinum", data_dir=tmp_path)] == ["72"]


def test_missing_registry_file_names_the_path_and_the_hub_dataset(tmp_path, monkeypatch):
    monkeypatch.setattr(data, "_download", lambda *a: pytest.fail("nothing may be downloaded unless asked"))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset_spec("math500", data_dir=tmp_path)
    assert str(local_path("math500", "test", tmp_path)) in str(err.value)
    assert "HuggingFaceH4/MATH-500" in str(err.value)
    with pytest.raises(FileNotFoundError, match="openai/gsm8k"):
        load_dataset_spec("gsm8k", split="test", data_dir=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_missing_file_path(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
        load_dataset_spec(tmp_path / "nowhere.jsonl")


def test_download_only_when_asked_then_offline(tmp_path, monkeypatch):
    calls = []

    def fake_download(spec, split):
        calls.append((spec.hub, split))
        return [{"problem": "P", "answer": "3", "unique_id": "u1"}]

    monkeypatch.setattr(data, "_download", fake_download)
    first = load_dataset_spec("math500", data_dir=tmp_path, allow_download=True)
    assert calls == [("HuggingFaceH4/MATH-500", "test")]
    assert local_path("math500", "test", tmp_path).exists()
    assert load_dataset_spec("math500", data_dir=tmp_path) == first == [{"id": "u1", "question": "P", "answer": "3"}]
    assert len(calls) == 1


def test_the_authors_math_level_3_to_5_set_keeps_the_first_8192_of_its_file(tmp_path, monkeypatch):
    """simplerl-math35 (the SERA authors' Qwen2.5-Math training set): one file of SimpleRL-Zoo's hub repository, its
    first 8,192 rows, question and gt_answer; offline without a local copy it names the hub dataset."""
    monkeypatch.setattr(data, "_download", lambda *a: pytest.fail("nothing may be downloaded unless asked"))
    with pytest.raises(FileNotFoundError, match="hkust-nlp/SimpleRL-Zoo-Data"):
        load_dataset_spec("simplerl-math35", data_dir=tmp_path)
    calls = []

    def fake_download(spec, split):
        calls.append((spec.hub, spec.data_files, split))
        return [{"question": f"Q{i}", "gt_answer": str(i)} for i in range(8500)]

    monkeypatch.setattr(data, "_download", fake_download)
    problems = load_dataset_spec("simplerl-math35", data_dir=tmp_path, allow_download=True)
    assert calls == [("hkust-nlp/SimpleRL-Zoo-Data", "simplelr_qwen_level3to5/train.parquet", "train")]
    assert len(problems) == 8192 and problems[-1]["question"] == "Q8191" and problems[-1]["answer"] == "8191"
    assert len(load_dataset_spec("simplerl-math35", data_dir=tmp_path)) == 8192  # the local copy, offline


def test_bad_files_are_clear_errors(tmp_path):
    with pytest.raises(ValueError, match="'answer'"):
        load_dataset_spec(write_rows(tmp_path / "a.jsonl", [{"question": "q"}]))
    with pytest.raises(ValueError, match="duplicate"):
        load_dataset_spec(write_rows(tmp_path / "b.jsonl", [{"id": 1, "question": "q", "answer": "1"}] * 2))
    bad = tmp_path / "c.jsonl"
    bad.write_text('{"id": "1", "question": "q", "answer": "1"}\n{oops\n')
    with pytest.raises(ValueError, match="c.jsonl:2"):
        load_dataset_spec(bad)
    with pytest.raises(ValueError, match="split"):
        load_dataset_spec(bad, split="test")
    with pytest.raises(ValueError, match="fields"):
        load_dataset_spec(bad, fields="nope")


def test_write_jsonl_round_trip(tmp_path):
    problems = [{"id": "x-1", "question": "Q?", "answer": "\\sqrt{2}"}]
    write_jsonl(problems, tmp_path / "sub" / "p.jsonl")
    assert load_dataset_spec(tmp_path / "sub" / "p.jsonl") == problems


def test_registry_covers_the_paper_tables_datasets():
    from paper_figures.math import DATASETS

    assert set(DATASETS) - {"chain-sum"} <= set(REGISTRY)  # chain-sum is generated, not a hub dataset
    assert {"gsm8k", "polaris"} <= set(REGISTRY)


# ---------------------------------------------------------------- prompts


def test_qwen_math_template():
    assert render("qwen_math", "What is 1 + 1?") == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nWhat is 1 + 1?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_plain_template():
    assert render("plain", "Compute 1 + 2.") == "Compute 1 + 2.\nAnswer: "


def test_chat_template_through_a_tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    template = (
        "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>{% endif %}"
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel({"<unk>": 0}, unk_token="<unk>")), chat_template=template
    )
    prompt = render("chat", "What is 1 + 1?", tokenizer)
    assert prompt == f"<|user|>What is 1 + 1? {INSTRUCT_SUFFIX}\n<|assistant|>"
    assert INSTRUCT_SUFFIX == "Let's think step by step and output the final answer within \\boxed{}."
    with pytest.raises(ValueError, match="chat_template"):
        render("chat", "What is 1 + 1?")


def test_unknown_template():
    assert set(TEMPLATES) == {"chat", "qwen_math", "plain"}
    with pytest.raises(ValueError, match="qwen_math"):
        render("qwen", "x")


# ---------------------------------------------------------------- generated problems


def test_chain_sums_are_correct_and_in_range():
    problems = chain_sum(500, seed=3)
    for p in problems:
        expression = re.fullmatch(r"Compute (.*)\.", p["question"]).group(1)
        numbers = [int(t) for t in expression.split() if t not in "+-"]
        assert len(numbers) == 4 and all(1 <= n <= 99 for n in numbers)
        assert p["answer"] == str(eval(expression))  # the arithmetic, from the question text
        assert score(p["solution"], p["answer"]) == 1.0
    assert chain_sum(100, seed=3) == problems[:100]  # prefix-stable in the count
    assert chain_sum(100, seed=4) != problems[:100]
    assert {p["question"].count("-") for p in problems} == {0, 1, 2, 3}


@pytest.mark.parametrize(("family", "num_train", "num_heldout"), [("chain_sum", 2000, 64), ("gsm_symbolic", 40, 12)])
def test_splits_are_seeded_and_disjoint(family, num_train, num_heldout):
    train, heldout = make_splits(family, num_train, num_heldout, seed=0)
    assert (train, heldout) == make_splits(family, num_train, num_heldout, seed=0)
    assert len(train) == num_train and len(heldout) == num_heldout
    for split in (train, heldout):
        assert all(set(p) == {"id", "question", "answer", "solution"} for p in split)
        assert len({p["question"] for p in split}) == len(split)
        assert len({p["id"] for p in split}) == len(split)
    assert not {p["question"] for p in train} & {p["question"] for p in heldout}
    assert all(score(p["solution"], p["answer"]) == 1.0 for p in train[:20] + heldout)

    other_train, other_heldout = make_splits(family, num_train, num_heldout, seed=1)
    assert other_heldout == heldout  # the held-out set is fixed
    assert [p["question"] for p in other_train] != [p["question"] for p in train]
    _, fewer = make_splits(family, num_train, num_heldout // 2, seed=0)
    assert fewer == heldout[: num_heldout // 2]
    assert make_splits(family, 0, num_heldout, seed=0) == ([], heldout)  # an evaluation-only split


def test_training_set_avoids_the_whole_heldout_pool():
    train, pool = make_splits("chain_sum", 20_000, HELDOUT_POOL)
    assert not {p["question"] for p in train} & {p["question"] for p in pool}
    assert make_splits("chain_sum", 20_000, 8)[0] == train  # training does not depend on the held-out size
    with pytest.raises(ValueError, match="num_heldout"):
        make_splits("chain_sum", 10, HELDOUT_POOL + 1)
    with pytest.raises(ValueError, match="chain_sum"):
        make_splits("chain_sums", 10, 10)


def test_exclusion_holds_where_collisions_are_likely(monkeypatch):
    # Two terms to 9 give only 162 distinct questions, so a training draw would hit the pool without the exclusion.
    monkeypatch.setattr(generated, "HELDOUT_POOL", 50)
    train, pool = make_splits("chain_sum", 100, 50, terms=2, max_value=9)
    assert len({p["question"] for p in train + pool}) == 150
    with pytest.raises(ValueError, match="distinct"):
        make_splits("chain_sum", 113, 50, terms=2, max_value=9)


def test_guessing_baseline_closed_form():
    train = [{"answer": a} for a in ["1", "1", "2", "3"]]
    heldout = [{"answer": a} for a in ["1", "2", "4"]]
    baseline = guessing_baseline(train, heldout, ks=(1, 2, 10))
    q = np.array([0.5, 0.25, 0.0])
    for k in (1, 2, 10):
        assert baseline["sample"][k] == pytest.approx(np.mean(1 - (1 - q) ** k))
    assert baseline["top"] == {1: pytest.approx(1 / 3), 2: pytest.approx(2 / 3), 10: pytest.approx(2 / 3)}


def test_chain_sum_default_is_hard_to_guess():
    # docs/history/calibration.md: three terms to 30 let answer-only guessing reach 52% Pass@64; four terms to 99
    # must not.
    train, heldout = make_splits("chain_sum", 5000, 256)
    baseline = guessing_baseline(train, heldout, ks=(1, 64))
    assert baseline["sample"][1] < 0.01 and baseline["sample"][64] < 0.25
    assert baseline["top"][64] < 0.35
