"""One request's answer from each arm of the demo, side by side: where they first differ,
where RandKV could first change the answer, and how many rounds the request went through."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from randkv.spec import num_rounds
from randkv.spec.config import RandKVConfig

MARK = "[*]"


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first index where two token lists differ (the shorter one's length when it is a
    prefix of the other); None when they are equal."""
    for index, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return index
    return None if len(a) == len(b) else min(len(a), len(b))


def first_affected_token(config: RandKVConfig, prompt_length: int) -> int:
    """The first answer token RandKV can change.

    Answer token i comes from the query at position P + i - 1. The query at K + 2r - 1 still
    sees every token; the first round fires before position K + 2r is written, so answer
    token K + 2r - P + 1 is the first computed from a compacted cache.
    """
    return config.max_physical_length - prompt_length + 1


def rounds_of(config: RandKVConfig, prompt_length: int, answer_tokens: int) -> int:
    """Rounds a request of P prompt and N answer tokens goes through: its last token comes
    from the query at P + N - 2, written after the rounds due at up to that many tokens."""
    tokens_seen = max(prompt_length + answer_tokens - 2, 0)
    return num_rounds(config, prompt_length=prompt_length, tokens_seen=tokens_seen)


@dataclass(frozen=True)
class AnswerPair:
    """One request, answered greedily by plain vLLM and by vLLM + RandKV."""

    question: str
    prompt_length: int
    plain: list[int]
    randkv: list[int]
    config: RandKVConfig

    @property
    def first_difference(self) -> int | None:
        return first_difference(self.plain, self.randkv)

    @property
    def first_affected(self) -> int:
        return first_affected_token(self.config, self.prompt_length)

    @property
    def rounds(self) -> int:
        return rounds_of(self.config, self.prompt_length, len(self.randkv))

    def summary(self) -> str:
        differ = self.first_difference
        config = self.config
        rounds = (
            f"RandKV (K={config.budget}, r={config.buffer_size}) ran {self.rounds} rounds on "
            f"this request; the first can change the answer from token {self.first_affected} on."
        )
        if differ is None:
            return f"The two answers are identical ({len(self.plain)} tokens). {rounds}"
        agree = f"The answers agree on their first {differ} tokens and differ from token {differ}"
        if differ < self.first_affected:
            # Different batch shapes round differently; greedy decoding amplifies a near tie.
            return f"{agree}, before RandKV's first round (float rounding of a near tie). {rounds}"
        return f"{agree} on. {rounds}"


def marked_text(tokenizer: Any, token_ids: Sequence[int], mark_at: int | None) -> str:
    """The decoded answer, with MARK inserted before token `mark_at`."""
    decode = tokenizer.decode
    if mark_at is None or mark_at >= len(token_ids):
        return decode(list(token_ids), skip_special_tokens=True)
    head = decode(list(token_ids[:mark_at]), skip_special_tokens=True)
    tail = decode(list(token_ids[mark_at:]), skip_special_tokens=True)
    return head + MARK + tail


def wrap(text: str, width: int = 92, indent: str = "  ") -> str:
    """Wrapped line by line, so the answer's own line breaks stay; words are never split."""
    lines = []
    for line in text.splitlines() or [""]:
        wrapped = textwrap.wrap(
            line, width - len(indent), break_long_words=False, break_on_hyphens=False
        ) or [""]
        lines += [indent + part for part in wrapped]
    return "\n".join(lines)


def format_pair(pair: AnswerPair, tokenizer: Any, width: int = 92) -> str:
    differ = pair.first_difference
    parts = [
        f"One request, answered greedily by both arms: {pair.question!r} "
        f"({pair.prompt_length} prompt tokens)",
        textwrap.fill(pair.summary(), width),
    ]
    if differ is not None:
        parts.append(f"{MARK} marks token {differ} in both answers.")
    for label, ids in (("plain vLLM", pair.plain), ("vLLM + RandKV", pair.randkv)):
        parts.append(f"--- {label} ({len(ids)} tokens) ".ljust(width, "-"))
        parts.append(wrap(marked_text(tokenizer, ids, differ), width))
    return "\n".join(parts)
