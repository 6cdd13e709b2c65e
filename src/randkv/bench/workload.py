"""The seeded request mix of `randkv bench serve`: short prompts, long generations."""

from __future__ import annotations

import random
from dataclasses import asdict, dataclass
from typing import Any

_TEXT = (
    "reason step carefully about the problem then check every intermediate result and "
    "keep track of what was assumed before writing the final answer with a justification"
)
_WORDS = tuple(_TEXT.split())


@dataclass(frozen=True)
class WorkloadSpec:
    """What both arms of the benchmark receive, identically."""

    requests: int = 32
    prompt_tokens: tuple[int, int] = (16, 48)  # inclusive range, uniform
    output_tokens: tuple[int, int] = (768, 1536)  # inclusive range, uniform
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("prompt_tokens", "output_tokens"):
            low, high = getattr(self, name)
            if not 1 <= low <= high:
                raise ValueError(f"WorkloadSpec.{name} must be 1 <= low <= high, got {low, high}")
        if self.requests < 1:
            raise ValueError("WorkloadSpec.requests must be at least 1")

    def to_json(self) -> dict[str, Any]:
        return {key: list(v) if isinstance(v, tuple) else v for key, v in asdict(self).items()}


@dataclass(frozen=True)
class BenchRequest:
    index: int
    prompt_token_ids: list[int]
    max_tokens: int


def build_requests(spec: WorkloadSpec, tokenizer: Any) -> list[BenchRequest]:
    """Seeded prompts cut to exact token counts with the model's own tokenizer."""
    rng = random.Random(spec.seed)
    out = []
    for index in range(spec.requests):
        length = rng.randint(*spec.prompt_tokens)
        ids: list[int] = []
        while len(ids) < length:
            text = " ".join(rng.choice(_WORDS) for _ in range(length))
            ids = tokenizer(f"Task {index}: {text}", add_special_tokens=False)["input_ids"]
        out.append(BenchRequest(index, list(ids[:length]), rng.randint(*spec.output_tokens)))
    return out
