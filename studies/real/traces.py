"""What the real-model study feeds: corpus windows, and the dense model's own answers with
two planted facts.

- `text_windows`: `length`-token windows from the middle of distinct plays; the first
  `prompt` tokens are the request's prompt (never evicted by prompt-keeping policies).
- `own_generations`: the dense model answers chat prompts that ask for long texts (half
  greedy, half sampled; EOS suppressed so that every answer has `new_tokens` tokens). Each
  answer then carries two facts spliced in at sentence ends: a passcode stated once, early
  (the paper's passcode test), and a room number restated four times; a question about each
  is appended at the end with its answer, whose digits are the recall targets.

Every sequence of a batch has the same length (the scorer feeds equal rows); answers are cut
at the end to make up for prompts of different lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from studies.real.corpus import Document

__all__ = ["INSTRUCTIONS", "Trace", "own_generations", "text_windows"]

#: Chat prompts that make long answers (stories, explanations, letters).
INSTRUCTIONS: tuple[str, ...] = (
    "Write a long story about a lighthouse keeper who finds a message in a bottle.",
    "Explain in detail how a bicycle works, part by part.",
    "Write a long letter from a sailor to his family describing a voyage around the world.",
    "Describe, step by step, how to plan and plant a vegetable garden.",
    "Tell a long fairy tale about a clever fox and a kingdom of birds.",
    "Explain the water cycle to a curious student, with many examples.",
    "Write a detailed diary of a week spent living in a mountain village.",
    "Describe the history of the printing press and how it changed the world.",
    "Write a long adventure story about two friends who get lost in a desert.",
    "Explain in detail how bread is made, from the wheat field to the bakery.",
    "Write a long letter from a grandmother to her grandson about her childhood.",
    "Describe, step by step, how to build a small wooden boat.",
    "Tell a long story about a robot who learns to paint.",
    "Explain how a city gets its drinking water, with many details.",
    "Write a detailed travel guide to an imaginary island.",
    "Describe the life of a honeybee colony through one whole year.",
    "Write a long mystery story about a missing painting in a small museum.",
    "Explain in detail how trains work and how a railway is run.",
    "Write a long speech a teacher gives on the last day of school.",
    "Describe, step by step, how to cook a large family dinner for a holiday.",
    "Tell a long legend about a mountain that could sing.",
    "Explain the seasons of the year to a child, with many examples.",
    "Write a detailed diary of a scientist spending a winter in Antarctica.",
    "Describe how a small town changed over one hundred years.",
)


@dataclass(frozen=True)
class Trace:
    """One sequence to score: its tokens, prompt length, and what is measured where."""

    name: str
    ids: list[int]
    prompt: int
    #: Positions whose token the dense model wrote (the own-generation metrics use these).
    generated: list[int] = field(default_factory=list)
    #: fact name -> positions of its answer digits in the final question's answer.
    recall: dict[str, list[int]] = field(default_factory=dict)
    #: fact name -> positions of the first token of each statement of it.
    stated_at: dict[str, list[int]] = field(default_factory=dict)
    sampled: bool = False
    #: Where the answer ends and the questions begin (own generations only).
    body_end: int = 0
    #: fact name -> tokens of one statement of it.
    statement_tokens: dict[str, int] = field(default_factory=dict)


def text_windows(
    tokenizer: Any, documents: Sequence[Document], count: int, length: int, prompt: int
) -> list[Trace]:
    """`count` windows of `length` tokens from the middles of the longest-enough documents,
    spread evenly over them (sorted by name), one window per document."""
    usable = []
    for doc in documents:
        ids = tokenizer.encode(doc.text, add_special_tokens=False)
        if len(ids) >= 2 * length:
            usable.append((doc.name, ids))
    if len(usable) < count:
        raise ValueError(f"only {len(usable)} documents have {2 * length} tokens; asked {count}")
    picks = [usable[(i * len(usable)) // count] for i in range(count)]
    traces = []
    for name, ids in picks:
        middle = len(ids) // 2
        traces.append(Trace(name, ids[middle : middle + length], prompt))
    return traces


def _chat_prompt(tokenizer: Any, instruction: str) -> list[int]:
    """The instruction in the model's chat template; a base model without one (Gemma 3 270M)
    gets it as plain text, its BOS token first, followed by an answer cue."""
    if not getattr(tokenizer, "chat_template", None):
        return list(tokenizer.encode(f"{instruction}\n\nAnswer:", add_special_tokens=True))
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": instruction}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


def _generate(
    model: Any, tokenizer: Any, prompts: list[list[int]], new_tokens: int, sampled: bool, seed: int
) -> list[list[int]]:
    """Dense answers of exactly `new_tokens` tokens to left-padded prompts."""
    width = max(map(len, prompts))
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    options: dict[str, Any] = {"do_sample": sampled}
    if sampled:
        options.update(temperature=0.8, top_p=0.95, top_k=0)
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,  # no EOS: every answer is as long
            pad_token_id=pad,
            **options,
        )
    return [row[width:].tolist() for row in out]


def _sentence_ends(tokenizer: Any, answer: list[int]) -> list[int]:
    """Indices just after tokens that end a sentence or a line."""
    ends = []
    for i, token in enumerate(answer):
        text = tokenizer.decode([token])
        if text.rstrip(" ").endswith((".", "!", "?", "\n")):
            ends.append(i + 1)
    return ends


def _nearest(ends: list[int], target: int, low: int, high: int) -> int:
    """The sentence end in [low, high) nearest to `target` (`target` when there is none)."""
    candidates = [e for e in ends if low <= e < high] or [target]
    return min(candidates, key=lambda e: abs(e - target))


def _facts(index: int) -> dict[str, tuple[str, str, str]]:
    """fact -> (statement, question, answer prefix); the digits follow the prefix."""
    passcode = f"{(48213 + 7919 * index) % 90000 + 10000}"
    room = f"{(417 + 131 * index) % 900 + 100}"
    return {
        "passcode": (
            f" (The passcode is {passcode}.)",
            "Question: What is the passcode? Answer: The passcode is",
            passcode,
        ),
        "room": (
            f" (Remember: the key is in room {room}.)",
            "Question: Which room is the key in? Answer: The key is in room",
            room,
        ),
    }


def _splice(
    tokenizer: Any, name: str, prompt: list[int], answer: list[int], index: int, sampled: bool
) -> Trace:
    """The answer with the passcode stated once near its start, the room four times, and
    both questions with their answers at the end."""

    def enc(text: str) -> list[int]:
        return list(tokenizer.encode(text, add_special_tokens=False))

    facts = _facts(index)
    ends = _sentence_ends(tokenizer, answer)
    n = len(answer)
    inserts = {_nearest(ends, 24, 8, n): ["passcode"]}
    for share in (0.2, 0.4, 0.6, 0.8):
        inserts.setdefault(_nearest(ends, int(share * n), 32, n), []).append("room")
    ids = list(prompt)
    generated: list[int] = []
    stated: dict[str, list[int]] = {fact: [] for fact in facts}
    for i, token in enumerate(answer):
        for fact in inserts.get(i, []):
            stated[fact].append(len(ids))
            ids += enc(facts[fact][0])
        generated.append(len(ids))
        ids.append(token)
    body_end = len(ids)
    recall: dict[str, list[int]] = {}
    for fact, (_, question, digits) in facts.items():
        ids += enc("\n\n" + question + " ")
        recall[fact] = list(range(len(ids), len(ids) + len(digits)))
        ids += enc(digits)  # one token per digit (SmolLM2 splits numbers into digits)
        ids += enc(".")
    sizes = {fact: len(enc(text)) for fact, (text, _, _) in facts.items()}
    return Trace(name, ids, len(prompt), generated, recall, stated, sampled, body_end, sizes)


def own_generations(
    model: Any, tokenizer: Any, count: int, new_tokens: int, seed: int = 0
) -> list[Trace]:
    """`count` dense answers (the first half greedy, the rest sampled), facts spliced in,
    cut to one length."""
    if count > len(INSTRUCTIONS):
        raise ValueError(f"at most {len(INSTRUCTIONS)} instructions; asked {count}")
    prompts = [_chat_prompt(tokenizer, text) for text in INSTRUCTIONS[:count]]
    greedy = count // 2
    answers = _generate(model, tokenizer, prompts[:greedy], new_tokens, False, seed)
    if count > greedy:
        answers += _generate(model, tokenizer, prompts[greedy:], new_tokens, True, seed)
    traces = [
        _splice(tokenizer, f"instruction-{i}", prompts[i], answers[i], i, i >= greedy)
        for i in range(count)
    ]
    return _same_length(traces)


def _same_length(traces: list[Trace]) -> list[Trace]:
    """Drop the answer's last own tokens (never a statement or a question) so that every
    trace is as long as the shortest (prompts differ by a few tokens)."""
    length = min(len(t.ids) for t in traces)
    out = []
    for t in traces:
        cut = len(t.ids) - length
        dropped = set(t.generated[len(t.generated) - cut :])  # the answer's last own tokens
        keep = [i for i in range(len(t.ids)) if i not in dropped]
        new = {old: i for i, old in enumerate(keep)}
        out.append(
            Trace(
                t.name,
                [t.ids[i] for i in keep],
                t.prompt,
                [new[p] for p in t.generated if p in new],
                {fact: [new[p] for p in at] for fact, at in t.recall.items()},
                {fact: [new[p] for p in at if p in new] for fact, at in t.stated_at.items()},
                t.sampled,
                t.body_end - cut,
                t.statement_tokens,
            )
        )
    return out
