"""Prompt templates of the math study (docs/design.md section 5), looked up by name in TEMPLATES.

- "chat": an instruct model (SmolLM2-Instruct) through its tokenizer's own chat template, the question followed by
  INSTRUCT_SUFFIX as the user turn, with the assistant turn opened.
- "qwen_math": base models (Qwen2.5-Math, Qwen3-Base), the Qwen-math template: a fixed system turn QWEN_MATH_SYSTEM, the
  question as the user turn, the assistant turn opened. Written from the Qwen2.5-Math chat template's default system
  prompt; it matches the `apply_qwen_math_template` of public RL code (understand-r1-zero and others) character for
  character. It needs no tokenizer: the special tokens are text that Qwen's tokenizers map to their ids.
- "plain": the tiny from-scratch model (character tokenizer): the question, a newline, then PLAIN_ANSWER_PREFIX; the
  model's answer ("\\boxed{N}") follows.
"""

from __future__ import annotations

from collections.abc import Callable

INSTRUCT_SUFFIX = "Let's think step by step and output the final answer within \\boxed{}."
QWEN_MATH_SYSTEM = "Please reason step by step, and put your final answer within \\boxed{}."
PLAIN_ANSWER_PREFIX = "Answer: "


def render_chat(question: str, tokenizer=None) -> str:
    """The instruct prompt: tokenizer.apply_chat_template on one user turn "<question> <INSTRUCT_SUFFIX>"."""
    if tokenizer is None or getattr(tokenizer, "chat_template", None) is None:
        raise ValueError("the 'chat' template needs a tokenizer that has a chat_template")
    messages = [{"role": "user", "content": f"{question.strip()} {INSTRUCT_SUFFIX}"}]
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def render_qwen_math(question: str, tokenizer=None) -> str:
    """The Qwen-math prompt for base models (the tokenizer is not used)."""
    return (
        f"<|im_start|>system\n{QWEN_MATH_SYSTEM}<|im_end|>\n"
        f"<|im_start|>user\n{question.strip()}<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def render_plain(question: str, tokenizer=None) -> str:
    """The from-scratch model's prompt: "<question>\\nAnswer: " (the tokenizer is not used)."""
    return f"{question.strip()}\n{PLAIN_ANSWER_PREFIX}"


TEMPLATES: dict[str, Callable[..., str]] = {"chat": render_chat, "qwen_math": render_qwen_math, "plain": render_plain}


def render(template: str, question: str, tokenizer=None) -> str:
    """The prompt text of `question` under TEMPLATES[template]; ValueError naming the known templates otherwise."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown prompt template {template!r}; expected one of {sorted(TEMPLATES)}")
    return TEMPLATES[template](question, tokenizer)
