"""HFEngine's two decode paths: the preallocated shared-prompt loop (decode="static", SharedPromptDecoder) draws the
same tokens as transformers' DynamicCache loop (decode="dynamic") from the same generator, with the same counts,
masks and log-probs; its log-probs match a plain forward pass; unsupported models fall back with the reason."""

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import sera.rollout
from sera.rollout import HFEngine, response_logprobs, shared_prompt_logprobs
from tests.test_lm import EOS, PAD
from tests.test_lm import tiny_model as llama

PROMPTS = [[1, 2, 3], [1, 4], [1, 5, 6, 7, 2], [3, 3, 8, 1]]  # different lengths: left padding is exercised


# the maze/math shape (multi-head), and SmolLM2's (grouped-query attention: 2 query heads per key/value head), with
# biases and an explicit head size
MODELS = {
    "mha": lambda: llama(),
    "gqa-bias": lambda: llama(1, num_attention_heads=4, num_key_value_heads=2, head_dim=16, attention_bias=True),
}


def both_paths(model, eos, counts, max_new_tokens, seed, **kwargs):
    return [
        HFEngine(model, eos, PAD, decode=path).generate(
            PROMPTS, counts, max_new_tokens, torch.Generator().manual_seed(seed), **kwargs
        )
        for path in ("dynamic", "static")
    ]


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize(
    "eos, kwargs",
    [(EOS, {}), ([EOS, 4], {}), (EOS, {"temperature": 0.6}), ([EOS, 4], {"temperature": 1.7, "top_p": 0.8})],
)
def test_static_path_draws_the_same_tokens_as_the_dynamic_path(name, eos, kwargs, monkeypatch):
    compactions = []
    keep = sera.rollout.SharedPromptDecoder.keep
    monkeypatch.setattr(
        sera.rollout.SharedPromptDecoder, "keep", lambda self, k: compactions.append(1) or keep(self, k)
    )
    model = MODELS[name]()
    for seed in range(4):
        old, new = both_paths(model, eos, [7, 0, 12, 3], 10, seed, **kwargs)
        assert new.counts.tolist() == [7, 0, 12, 3]
        assert torch.equal(new.prompt_index, old.prompt_index)
        assert torch.equal(new.tokens, old.tokens)
        assert torch.equal(new.mask, old.mask)
        torch.testing.assert_close(new.logprobs, old.logprobs, atol=1e-5, rtol=0)
    assert compactions  # rows finished at different steps and the batch was compacted


def test_static_path_masks_end_tokens_and_padding():
    out = HFEngine(MODELS["gqa-bias"](), [EOS, 4], PAD, decode="static").generate(
        PROMPTS, [20, 20, 0, 20], 8, torch.Generator().manual_seed(3)
    )
    ended = 0
    for r in range(60):
        length = int(out.mask[r].sum())
        assert out.mask[r, :length].all() and not out.mask[r, length:].any()  # one contiguous response
        ends = [i for i, t in enumerate(out.tokens[r, :length].tolist()) if t in (EOS, 4)]
        assert ends == [] and length == 8 or ends == [length - 1]  # stops right after the first end token
        assert (out.tokens[r, length:] == PAD).all()
        assert (out.logprobs[r, length:] == 0).all() and (out.logprobs[r, :length] < 0).all()
        ended += bool(ends)
    assert 0 < ended < 60  # both ends and truncations occurred


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_static_path_logprobs_match_a_plain_forward_pass(name, temperature):
    model = MODELS[name]()
    out = HFEngine(model, EOS, PAD, temperature, decode="static").generate(
        PROMPTS, [3, 2, 3, 2], 9, torch.Generator().manual_seed(1)
    )
    torch.testing.assert_close(
        response_logprobs(model, PROMPTS, out, PAD, temperature) * out.mask, out.logprobs, atol=1e-5, rtol=0
    )
    for r in range(10):  # one un-cached forward over prompt + response, at the sampling temperature
        prompt = PROMPTS[int(out.prompt_index[r])]
        response = out.tokens[r][out.mask[r].bool()]
        logits = model(torch.tensor([prompt + response.tolist()])).logits[0, len(prompt) - 1 : -1]
        logp = torch.log_softmax(logits / temperature, -1).gather(1, response[:, None])[:, 0]
        torch.testing.assert_close(out.logprobs[r, : len(response)], logp, atol=1e-5, rtol=0)


def test_static_path_edge_cases():
    model = llama()
    engine = HFEngine(model, EOS, PAD, decode="static")
    empty = engine.generate(PROMPTS, [0, 0, 0, 0], 5, torch.Generator())
    assert empty.tokens.shape == (0, 5)
    old, new = both_paths(model, EOS, [1, 2, 0, 1], 1, 0)  # one token: no decode step
    assert torch.equal(new.tokens, old.tokens) and torch.equal(new.mask, old.mask)
    model.train()
    engine.generate(PROMPTS, [2, 2, 2, 2], 4, torch.Generator())
    assert model.training  # the caller's mode is restored


def test_unsupported_models_fall_back_with_the_reason():
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    with pytest.warns(UserWarning, match="GPT2LMHeadModel is not a LlamaForCausalLM"):
        assert HFEngine(gpt2, EOS, PAD).decode == "dynamic"
    with pytest.raises(ValueError, match="GPT2LMHeadModel is not a LlamaForCausalLM"):
        HFEngine(gpt2, EOS, PAD, decode="static")
    dynamic_rope = llama(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0})
    with pytest.warns(UserWarning, match="RoPE type 'dynamic'"):
        assert HFEngine(dynamic_rope, EOS, PAD).decode == "dynamic"
    assert HFEngine(llama(), EOS, PAD).decode == "static"
    assert HFEngine(llama(), EOS, PAD, decode="dynamic").decode == "dynamic"
    with pytest.raises(ValueError, match="decode must be one of"):
        HFEngine(llama(), EOS, PAD, decode="fast")


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("buckets", [1, 3, 64])
def test_shared_prompt_logprobs_equal_the_repeated_cache(name, buckets):
    """shared_prompt_logprobs (the loss's train.logprobs=shared-prompt): the log-probs and the gradient of a weighted
    sum of them equal response_logprobs' (left-padded prompts, a prompt with no rollout, two end tokens, a temperature),
    with the rows in the rollouts' order and zeros past the longest response."""
    model = MODELS[name]()
    for seed in range(3):
        out = HFEngine(model, [EOS, 4], PAD).generate(PROMPTS, [5, 0, 7, 3], 10, torch.Generator().manual_seed(seed))
        weight = torch.randn(out.mask.shape, generator=torch.Generator().manual_seed(seed)) * out.mask
        repeated = response_logprobs(model, PROMPTS, out, PAD, 0.8)
        shared = shared_prompt_logprobs(model, PROMPTS, out, PAD, 0.8, buckets=buckets)
        assert shared.shape == repeated.shape and (shared[:, int(out.mask.sum(1).max()) :] == 0).all()
        torch.testing.assert_close(shared * out.mask, repeated * out.mask, atol=1e-5, rtol=0)
        params = list(model.parameters())
        expected = torch.autograd.grad((repeated * weight).sum(), params)
        for got, want in zip(torch.autograd.grad((shared * weight).sum(), params), expected, strict=True):
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
    lengths = out.mask.sum(1)
    assert lengths.min() < lengths.max()  # the buckets cut different widths


def test_shared_prompt_logprobs_refuse_other_models():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=10, n_embd=16, n_layer=1, n_head=2, n_positions=32))
    out = HFEngine(model, EOS, PAD, decode="dynamic").generate(PROMPTS, [1, 1, 1, 1], 4, torch.Generator())
    with pytest.raises(ValueError, match="not a LlamaForCausalLM"):
        shared_prompt_logprobs(model, PROMPTS, out, PAD)
