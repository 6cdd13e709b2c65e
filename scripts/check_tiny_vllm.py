"""Check that vLLM and Transformers give the same greedy output on the tiny checkpoint.

Builds the tiny random Qwen3 checkpoint, runs greedy decoding for a few prompts in
Transformers (float32, CPU) and in ``vllm.LLM`` and compares the generated token ids.

Usage::

    python scripts/check_tiny_vllm.py [--dtype float32|bfloat16] [--tokens 32] [--path DIR]

Exit status is 0 when every prompt matches token for token (only required for float32).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

PROMPTS = (
    "The quick brown fox jumps over the lazy dog.",
    "Once upon a time, in a land far, far away, there lived a wörld-weary dragon 🐉.",
)


def hf_greedy(path: str, prompts: list[list[int]], n: int) -> list[list[int]]:
    """Greedy-decode ``n`` tokens per prompt with Transformers in float32."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    outs = []
    with torch.no_grad():
        for ids in prompts:
            out = model.generate(
                torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False
            )
            outs.append(out[0, len(ids) :].tolist())
    return outs


def vllm_greedy(
    path: str, prompts: list[str], n: int, dtype: str
) -> tuple[list[list[int]], list[list[int]], list[str]]:
    """Greedy-decode ``n`` tokens per prompt with ``vllm.LLM``; return (prompt ids, ids, text)."""
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=path,
        dtype=dtype,
        max_model_len=4096,
        max_num_seqs=8,
        max_num_batched_tokens=4096,
        enforce_eager=True,
        seed=0,
    )
    params = SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True)
    results = llm.generate(list(prompts), params)
    chat = llm.chat([{"role": "user", "content": "hi"}], params)[0]
    ok = list(chat.prompt_token_ids) == [259, *b"user\nhi", 260, 10, 259, *b"assistant\n"]
    print(f"chat template ok={ok}: {chat.prompt!r} -> {chat.outputs[0].text!r}")
    return (
        [list(r.prompt_token_ids) for r in results],
        [list(r.outputs[0].token_ids) for r in results],
        [r.outputs[0].text for r in results],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--path", default=None, help="checkpoint folder (default: cache)")
    args = parser.parse_args(argv)

    # Small KV cache for a CPU run (GiB); vLLM's CPU default reserves much more.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from randkv.models.tiny import build_tiny_checkpoint

    path = str(build_tiny_checkpoint(args.path))
    print(f"checkpoint: {path}")

    t0 = time.perf_counter()
    v_prompt_ids, v_out, v_text = vllm_greedy(path, list(PROMPTS), args.tokens, args.dtype)
    t1 = time.perf_counter()
    hf_out = hf_greedy(path, v_prompt_ids, args.tokens)
    t2 = time.perf_counter()
    print(f"vLLM ({args.dtype}) {t1 - t0:.1f}s, Transformers (float32) {t2 - t1:.1f}s")

    all_match = True
    for prompt, pids, v, h, text in zip(PROMPTS, v_prompt_ids, v_out, hf_out, v_text, strict=True):
        tokens_ok = pids == list(prompt.encode("utf-8"))
        match = v == h
        all_match &= match
        first = next((i for i, (a, b) in enumerate(zip(v, h, strict=True)) if a != b), None)
        print(f"prompt {prompt!r}: byte-tokenised={tokens_ok} match={match} first_diff={first}")
        print(f"  vllm: {v}")
        print(f"  hf:   {h}")
        print(f"  vllm text: {text!r}")
    print("ALL MATCH" if all_match else "MISMATCH")
    return 0 if all_match or args.dtype != "float32" else 1


if __name__ == "__main__":
    sys.exit(main())
