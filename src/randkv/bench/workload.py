"""The seeded request mix of `randkv bench serve` and the demo: short prompts, long
generations.

Two kinds of prompt, both real text in the model's own tokenizer:

- `words`: seeded words cut to an exact token count drawn from `prompt_tokens`;
- `chat`: a user message asking for a long answer (a story, a step-by-step explanation, a
  guide), rendered with the model's chat template; its length is the template's, and must
  lie within `prompt_tokens`.

Every request is decoded greedily and generates exactly its `max_tokens`. A chat answer may
not end its turn before that (its end-of-turn token is masked), so it goes on as an answer;
word prompts ignore EOS. With `answers_end`, chat answers end where the model ends them:
`max_tokens` is then only an upper bound (requests that stop early). `repetition_penalty`
> 1 (the same for both arms) keeps a small model's greedy answer from looping over one
sentence.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass
from typing import Any

_TEXT = (
    "reason step carefully about the problem then check every intermediate result and "
    "keep track of what was assumed before writing the final answer with a justification"
)
_WORDS = tuple(_TEXT.split())

#: Requests that invite long answers, each with the subjects it is asked about.
CHAT_TASKS: dict[str, tuple[str, ...]] = {
    "Write a long story about {}.": (
        "a lighthouse keeper who finds a message in a bottle",
        "a dragon who is afraid of fire",
        "a robot learning to paint",
        "two friends crossing a desert",
        "a village where nobody can sleep",
        "a cat who becomes the mayor of a town",
    ),
    "Explain step by step how {}.": (
        "bread rises in the oven",
        "the heart pumps blood through the body",
        "a computer adds two numbers",
        "rain forms in the clouds",
        "a seed grows into a tree",
        "a bill becomes a law",
    ),
    "Describe in detail a day in the life of {}.": (
        "a medieval blacksmith",
        "an astronaut on the space station",
        "a beekeeper",
        "a ship's cook on a long voyage",
    ),
    "Write a detailed guide to {}, explaining every step.": (
        "planting a vegetable garden",
        "planning a long bicycle trip",
        "baking bread at home",
        "learning to play the guitar",
    ),
}
CHAT_QUESTIONS: tuple[str, ...] = tuple(
    task.format(subject) for task, subjects in CHAT_TASKS.items() for subject in subjects
)
PROMPT_KINDS = ("words", "chat")


@dataclass(frozen=True)
class WorkloadSpec:
    """What both arms of the benchmark receive, identically."""

    requests: int = 32
    prompt_tokens: tuple[int, int] = (16, 48)  # inclusive range, uniform
    output_tokens: tuple[int, int] = (768, 1536)  # inclusive range, uniform
    seed: int = 0
    prompts: str = "words"  # one of PROMPT_KINDS
    repetition_penalty: float = 1.0  # vLLM's; 1.0 is off
    answers_end: bool = False  # chat answers may end before max_tokens (an upper bound)

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"WorkloadSpec.{name} must be 1 <= low <= high, got {low, high}")
        if self.requests < 1:
            raise ValueError("WorkloadSpec.requests must be at least 1")
        if self.prompts not in PROMPT_KINDS:
            raise ValueError(f"WorkloadSpec.prompts must be one of {PROMPT_KINDS}")
        if self.answers_end and self.prompts != "chat":
            raise ValueError("WorkloadSpec.answers_end needs chat prompts (words ignore EOS)")
        if not self.repetition_penalty > 0:
            raise ValueError("WorkloadSpec.repetition_penalty must be positive")


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_token_ids: list[int]
    max_tokens: int
    question: str | None = None  # a chat request's user message
    repetition_penalty: float = 1.0
    may_end: bool = False  # the answer may end before max_tokens

    def sampling_fields(self) -> dict[str, int | float | bool]:
        """The completion request's sampling fields: greedy, exactly `max_tokens`."""
        fields: dict[str, int | float | bool] = {"max_tokens": self.max_tokens, "temperature": 0}
        if self.question is None:
            fields["ignore_eos"] = True
        elif not self.may_end:
            fields["min_tokens"] = self.max_tokens
        if self.repetition_penalty != 1.0:
            fields["repetition_penalty"] = self.repetition_penalty
        return fields


def build_requests(spec: WorkloadSpec, tokenizer: Any) -> list[BenchRequest]:
    """The seeded mix, tokenized with the model's own tokenizer."""
    if spec.prompts == "chat":
        return _chat_requests(spec, tokenizer)
    rng = random.Random(spec.seed)
    out = []
    for index in range(spec.requests):
        length = rng.randint(*spec.prompt_tokens)
        ids: list[int] = []
        while len(ids) < length:
            text = " ".join(rng.choice(_WORDS) for _ in range(length))
            ids = tokenizer(f"Task {index}: {text}", add_special_tokens=False)["input_ids"]
        max_tokens = rng.randint(*spec.output_tokens)
        out.append(
            BenchRequest(index, list(ids[:length]), max_tokens, None, spec.repetition_penalty)
        )
    return out


def chat_prompt_ids(tokenizer: Any, question: str) -> list[int]:
    """One user message in the model's chat template, ready for the assistant's answer."""
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template; use word prompts")
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": question}], add_generation_prompt=True, tokenize=False
    )
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def _chat_requests(spec: WorkloadSpec, tokenizer: Any) -> list[BenchRequest]:
    """Every question once in a seeded order before any repeats; a repeat is numbered, so
    no two requests share a prompt."""
    rng = random.Random(spec.seed)
    order = list(CHAT_QUESTIONS)
    rng.shuffle(order)
    out = []
    for index, question in zip(range(spec.requests), itertools.cycle(order)):
        lap = index // len(order)
        if lap:
            question = f"{question} (Version {lap + 1}.)"
        ids = chat_prompt_ids(tokenizer, question)
        max_tokens = rng.randint(*spec.output_tokens)
        out.append(
            BenchRequest(
                index, ids, max_tokens, question, spec.repetition_penalty, spec.answers_end
            )
        )
    lengths = sorted(len(r.prompt_token_ids) for r in out)
    low, high = spec.prompt_tokens
    if lengths[0] < low or lengths[-1] > high:
        raise ValueError(
            f"the chat prompts are {lengths[0]}-{lengths[-1]} tokens in this model's chat "
            f"template, outside --prompt-tokens {low}-{high}"
        )
    return out
