"""PNG figures: the serving timeline of both arms, and one request's retained positions."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

_ARM_STYLE = {
    "plain": {"label": "plain vLLM", "color": "tab:gray"},
    "randkv": {"label": "vLLM + RandKV", "color": "tab:blue"},
}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only; no display here
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(result: dict[str, Any], path: Path) -> None:
    """Running requests and KV blocks in use over time, both arms on shared axes."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    for arm, style in _ARM_STYLE.items():
        timeline = result["arms"][arm]["timeline"]
        top.step(timeline["t_s"], timeline["running_requests"], where="post", **style)
        bottom.step(timeline["t_s"], timeline["kv_blocks"], where="post", **style)
    engine = result["engine"]
    bottom.axhline(engine["pool_blocks"] - 1, color="black", lw=0.8, ls="--", label="KV pool")
    top.axhline(engine["max_num_seqs"], color="black", lw=0.8, ls=":", label="max_num_seqs")
    top.set_ylabel("running requests")
    bottom.set_ylabel("KV blocks in use")
    bottom.set_xlabel("seconds since the first request")
    top.legend(loc="upper right")
    bottom.legend(loc="upper right")
    workload = result["workload"]
    ratio = result["ratios"]["output_tokens_per_s"]
    top.set_title(
        f"{workload['requests']} requests, {engine['pool_blocks']} blocks of "
        f"{engine['block_size']} tokens: RandKV {ratio:.2f}x output tokens/s"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_retention(
    retained: Sequence[Sequence[int]],
    *,
    tokens_seen: int,
    prompt_length: int,
    layer: int,
    budget: int,
    buffer_size: int,
    path: Path,
) -> None:
    """One row per KV head of one layer: which absolute positions are still in its cache."""
    import numpy as np

    plt = _pyplot()
    image = np.zeros((len(retained), tokens_seen), dtype=np.uint8)
    for head, positions in enumerate(retained):
        image[head, list(positions)] = 1
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(retained) + 1.6))
    ax.imshow(image, aspect="auto", interpolation="nearest", cmap="Blues", vmin=0, vmax=1)
    ax.axvline(prompt_length - 0.5, color="tab:orange", lw=1, label="end of prompt")
    ax.axvline(tokens_seen - buffer_size - 0.5, color="tab:green", lw=1, label="newest r")
    ax.set_xlabel("absolute position")
    ax.set_ylabel("KV head")
    ax.set_yticks(range(len(retained)))
    ax.set_title(
        f"Layer {layer}: positions kept after {tokens_seen} tokens (K={budget}, r={buffer_size})"
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.35), ncol=2, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
