"""`randkv demo` (what `make demo` runs): a short iso-memory comparison of plain vLLM and
vLLM + RandKV served over HTTP, then a picture of which positions each KV head kept.

On the embedded tiny checkpoint it takes a few minutes on 2 CPU cores; `--model` runs the
same on a real checkpoint (a local path or a hub id vLLM can load).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from randkv.bench.serve import ServeBench, format_table
from randkv.bench.workload import WorkloadSpec
from randkv.config import RandKVConfig

# The demo's tiny model has 8 KV heads, so the retention picture shows 8 independent rows.
DEMO_MODEL_PARAMS = {"num_heads": 8, "num_kv_heads": 8, "head_dim": 32}
DEMO_CONFIG = RandKVConfig(budget=128, buffer_size=64, seed=0)
RETENTION_KEY = "randkv-demo"


def demo_bench(model: str | None, results: Path) -> ServeBench:
    """16 long generations; the pool holds 8 RandKV requests (8 x 16 blocks) but only about
    two plain ones at full length."""
    return ServeBench(
        model=model,
        workload=WorkloadSpec(requests=16, prompt_tokens=(16, 48), output_tokens=(512, 1024)),
        randkv=DEMO_CONFIG,
        pool_blocks=140,
        block_size=16,
        max_num_seqs=8,
        results_dir=results,
    )


def retention(model: str, results: Path, new_tokens: int = 600) -> dict[str, Any]:
    """Generate one request with the offline engine, read back which absolute positions each
    KV head of layer 0 holds, check them against `randkv.spec`, and draw them."""
    # The worker process (vLLM's default multi-process layout) keeps slot -> position maps.
    os.environ["RANDKV_TRACK_POSITIONS"] = "1"
    from vllm import SamplingParams

    from randkv.bench.plots import plot_retention
    from randkv.spec import request_key_from_text, retained_positions
    from randkv.vllm import LLM

    llm = LLM(
        model=model,
        randkv=DEMO_CONFIG,
        dtype="float32",
        block_size=16,
        max_model_len=2048,
        gpu_memory_utilization=0.2,
        num_gpu_blocks_override=64,
        enforce_eager=True,
    )
    params = SamplingParams(
        temperature=0,
        max_tokens=new_tokens,
        ignore_eos=True,
        extra_args={"randkv_key": RETENTION_KEY},
    )
    output = llm.generate(["Think step by step, and keep the question in mind."], params)[0]
    prompt = len(output.prompt_token_ids)
    tokens_seen = prompt + len(output.outputs[0].token_ids) - 1  # the last one is not cached
    heads = llm.randkv_slot_positions(output.request_id)[0]  # layer 0: [head][slot]
    retained = [sorted(positions) for positions in heads]
    expected = [
        list(
            retained_positions(
                DEMO_CONFIG,
                prompt_length=prompt,
                tokens_seen=tokens_seen,
                request_key=request_key_from_text(RETENTION_KEY),
                layer=0,
                kv_head=head,
            )
        )
        for head in range(len(retained))
    ]
    plot_retention(
        retained,
        tokens_seen=tokens_seen,
        prompt_length=prompt,
        layer=0,
        budget=DEMO_CONFIG.budget,
        buffer_size=DEMO_CONFIG.buffer_size,
        path=results / "retention.png",
    )
    summary = {
        "tokens_seen": tokens_seen,
        "prompt_length": prompt,
        "kv_heads": len(retained),
        "kept_per_head": [len(r) for r in retained],
        "matches_spec": retained == expected,
        "retained_positions_layer0": retained,
    }
    (results / "retention.json").write_text(json.dumps(summary))
    del llm
    return summary


def run(model: str | None = None, results_dir: str = "results/demo") -> None:
    from randkv.bench import serve

    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    if model is None:
        from randkv.models import build_tiny_checkpoint

        model = str(build_tiny_checkpoint(**DEMO_MODEL_PARAMS))
    bench = demo_bench(model, results)
    workload = bench.workload
    print(
        f"RandKV demo: results go to {results.resolve()}\n"
        f"Serving {workload.requests} requests ({workload.prompt_tokens[0]}-"
        f"{workload.prompt_tokens[1]} prompt tokens, {workload.output_tokens[0]}-"
        f"{workload.output_tokens[1]} output tokens) with the same {bench.pool_blocks}-block "
        f"KV pool, max_num_seqs={bench.max_num_seqs}, RandKV K={DEMO_CONFIG.budget} "
        f"r={DEMO_CONFIG.buffer_size}; each arm starts its own `randkv serve`."
    )
    result = serve.run(bench)
    print()
    # A short run with a long tail of few requests: the 2x target belongs to the full
    # benchmark, `randkv bench serve`.
    print(format_table(result, with_target=False))
    print("(the full iso-memory comparison and its targets: `randkv bench serve`)")
    summary = retention(model, results)
    print(
        f"\nRetention: after {summary['tokens_seen']} tokens each of the "
        f"{summary['kv_heads']} KV heads of layer 0 keeps {summary['kept_per_head'][0]} "
        f"positions (the {summary['prompt_length']}-token prompt, the newest ones and its own "
        f"random sample); engine slot maps equal randkv.spec: {summary['matches_spec']}"
    )
    print(
        f"\nWrote {results / 'result.json'}, {results / 'timeline.png'}, "
        f"{results / 'retention.png'}"
    )
