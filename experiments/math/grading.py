"""The math reward (docs/design.md section 5): math-verify on the last \\boxed{...} of a response against the gold
answer.

A response scores 1.0 iff its last \\boxed{...} (braces balanced, nested ones included) parses and math-verify finds it
equal to the gold answer; no box, an unclosed or empty last box, a response cut at the length limit, a non-string
input, or anything math-verify cannot parse scores 0.0. `score` never raises. Both sides are parsed the same way,
wrapped as \\boxed{...}, so a plain gold "0.5" and a LaTeX "\\frac{1}{2}" compare equal. math-verify bounds its parse
and comparison with SIGALRM timeouts (TIMEOUT_S each), which only the main thread may set: called from another thread,
grading runs without them, and the only bound there is MAX_ANSWER_CHARS on the boxed text.
"""

from __future__ import annotations

import threading
from functools import lru_cache

import numpy as np
from math_verify import parse, verify
from math_verify.errors import TimeoutException

BOXED = "\\boxed"
MAX_ANSWER_CHARS = 1000  # a longer boxed answer is not an answer; also bounds work where no timeout can be set
TIMEOUT_S = 5  # math-verify's parsing_timeout and timeout_seconds (whole seconds: signal.alarm)


def last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} in `text`, or None if there is none or it never closes.

    Braces are counted with escapes skipped, so \\boxed{\\frac{1}{2}} gives \\frac{1}{2} and \\boxed{\\{1,2\\}} gives
    \\{1,2\\}. Only the last \\boxed counts: if it is unclosed (or its content exceeds MAX_ANSWER_CHARS) the answer is
    None even when an earlier box is complete. Linear in the length of the tail after the last \\boxed.
    """
    start = text.rfind(BOXED)
    if start < 0:
        return None
    i = start + len(BOXED)
    while i < len(text) and text[i] == " ":
        i += 1
    if i >= len(text) or text[i] != "{":
        return None
    begin, depth, i = i + 1, 1, i + 1
    end = min(len(text), begin + MAX_ANSWER_CHARS + 1)
    while i < end:
        ch = text[i]
        if ch == "\\":
            i += 2  # an escaped character (\{, \}, \\) never opens or closes the box
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return text[begin:i]
        i += 1
    return None


def _timeout() -> int | None:
    # math-verify's timeouts install a SIGALRM handler, which raises ValueError outside the main thread.
    return TIMEOUT_S if threading.current_thread() is threading.main_thread() else None


@lru_cache(maxsize=4096)
def _parse_gold(gold: str) -> list:
    return parse(f"{BOXED}{{{gold}}}", parsing_timeout=_timeout())


@lru_cache(maxsize=65536)
def _matches(answer: str, gold: str) -> bool:
    # Cached: the rollouts of one prompt often repeat the same boxed answer.
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        return False
    timeout = _timeout()
    pred = parse(f"{BOXED}{{{answer}}}", parsing_timeout=timeout)
    return bool(pred) and bool(verify(gold_parsed, pred, timeout_seconds=timeout))


def score(response: str, gold: str, truncated: bool = False) -> float:
    """1.0 iff `response` is complete (not `truncated`) and its last \\boxed{...} equals `gold` under math-verify.

    Never raises: every failure (no box, unparsable text, a timeout, a non-string argument) scores 0.0.
    """
    try:
        if truncated or not isinstance(response, str) or not isinstance(gold, str):
            return 0.0
        answer = last_boxed(response)
        if answer is None or not answer.strip() or not gold.strip():
            return 0.0
        return float(_matches(answer.strip(), gold.strip()))
    except (Exception, TimeoutException):  # TimeoutException derives from BaseException
        return 0.0


def score_batch(responses, golds, truncated=None) -> np.ndarray:
    """Rewards of one step's rollouts: score(responses[i], golds[i], truncated[i]) for each i, as a float64 (N,) array.

    `truncated` is None (nothing cut) or N flags. Raises ValueError only when the three lengths differ.
    """
    responses, golds = list(responses), list(golds)
    flags = [False] * len(responses) if truncated is None else [bool(t) for t in truncated]
    if not len(responses) == len(golds) == len(flags):
        raise ValueError(f"need as many golds and flags as responses, got {len(responses)}, {len(golds)}, {len(flags)}")
    return np.array([score(r, g, t) for r, g, t in zip(responses, golds, flags, strict=True)], dtype=np.float64)
