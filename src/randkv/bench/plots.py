"""PNG figures: the serving timeline of both arms, and one request's retained positions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from randkv.spec import num_rounds, physical_length
from randkv.spec.config import RandKVConfig

if TYPE_CHECKING:
    from randkv.bench.serve_result import ServeResult

_ARM_STYLE = {
    "plain": {"label": "plain vLLM", "color": "tab:gray"},
    "randkv": {"label": "vLLM + RandKV", "color": "tab:blue"},
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display here
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(result: ServeResult, path: Path) -> None:
    """Running requests and KV blocks in use over time, both arms on shared axes."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for arm, style in (
        (result.arms.plain, _ARM_STYLE["plain"]),
        (result.arms.randkv, _ARM_STYLE["randkv"]),
    ):
        timeline = arm.timeline
        top.step(timeline.t_s, timeline.running_requests, where="post", **style)
        bottom.step(timeline.t_s, timeline.kv_blocks, where="post", **style)
    engine = result.engine
    bottom.axhline(engine.pool_blocks - 1, color="black", lw=0.8, ls="--", label="KV pool")
    top.axhline(engine.max_num_seqs, color="black", lw=0.8, ls=":", label="max_num_seqs")
    top.set_ylabel("running requests")
    bottom.set_ylabel("KV blocks in use")
    bottom.set_xlabel("seconds since the first request")
    top.legend(loc="upper right")
    bottom.legend(loc="upper right")
    ratio = result.ratios.output_tokens_per_s
    repeats = result.repeats
    which = f" (repeat {result.representative_repeat} of {repeats})" if repeats > 1 else ""
    top.set_title(
        f"{result.workload.requests} requests, {engine.pool_blocks} blocks of "
        f"{engine.block_size} tokens: RandKV {ratio:.2f}x output tokens/s{which}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def kept_tail_start(config: RandKVConfig, *, prompt_length: int, tokens_seen: int) -> int | None:
    """First position of the tail every KV head keeps, or None before the first round.

    After the latest round a request holds K + r + (tokens since that round) slots
    (`randkv.spec.physical_length`): the prompt and the random sample fill K of them, and the
    rest is the tail: the r newest tokens when the round fired plus every token since.
    """
    if num_rounds(config, prompt_length=prompt_length, tokens_seen=tokens_seen) == 0:
        return None
    physical = physical_length(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    return tokens_seen - (physical - config.budget)


# Pixel classes of the retention picture, with their colour and legend label.
_RETENTION_CLASSES = (
    ("white", "evicted"),
    ("tab:orange", "prompt (always kept)"),
    ("tab:blue", "kept by the random sample"),
    ("tab:green", "newest tokens (always kept)"),
)


def plot_retention(
    retained: Sequence[Sequence[int]],
    *,
    config: RandKVConfig,
    tokens_seen: int,
    prompt_length: int,
    layer: int,
    path: Path,
) -> list[str]:
    """One row per KV head of one layer: which absolute positions are still in its cache.

    Returns the legend's labels."""
    import numpy as np
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch

    plt = _pyplot()
    tail = kept_tail_start(config, prompt_length=prompt_length, tokens_seen=tokens_seen)
    classes = np.zeros(tokens_seen, dtype=np.uint8)
    classes[:prompt_length] = 1
    classes[prompt_length:] = 2
    if tail is not None:
        classes[tail:] = 3
    image = np.zeros((len(retained), tokens_seen), dtype=np.uint8)
    for head, positions in enumerate(retained):
        kept = np.asarray(list(positions), dtype=np.int64)
        image[head, kept] = classes[kept]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(retained) + 2.0))
    colours = ListedColormap([colour for colour, _ in _RETENTION_CLASSES])
    ax.imshow(
        image,
        aspect="auto",
        interpolation="nearest",
        cmap=colours,
        vmin=0,
        vmax=len(_RETENTION_CLASSES) - 1,
    )
    handles: list[Any] = [
        Patch(facecolor=colour, edgecolor="0.6", label=label)
        for colour, label in _RETENTION_CLASSES
    ]
    handles.append(
        ax.axvline(prompt_length - 0.5, color="black", lw=0.8, ls=":", label="end of prompt")
    )
    if tail is not None:
        line = ax.axvline(tail - 0.5, color="black", lw=0.8, ls="--")
        line.set_label(
            f"newest {tokens_seen - tail} = r + {tokens_seen - tail - config.buffer_size} "
            "since the last round"
        )
        handles.append(line)
    ax.set_xlabel("absolute position")
    ax.set_ylabel("KV head")
    ax.set_yticks(range(len(retained)))
    ax.set_title(
        f"Layer {layer}: positions kept after {tokens_seen} tokens "
        f"(K={config.budget}, r={config.buffer_size})"
    )
    ax.legend(
        handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=3, frameon=False
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return [handle.get_label() for handle in handles]
