"""`randkv.vllm.LLM.randkv_stats()` as users run it: the engine core and the worker in their
own processes (vLLM's default), so the statistics cross vLLM's RPC and the scheduler's
counters come through vLLM's engine-core utility channel (the other tests run the engine in
their process). The oracle is `randkv.spec` and what the requests were: every round the spec
gives, one over-budget prompt refused by the scheduler."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm]

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from vllm import SamplingParams
    from randkv import RandKVConfig
    from randkv.vllm import LLM

    if __name__ == "__main__":
        llm = LLM(model=sys.argv[1], randkv=RandKVConfig(budget=40, buffer_size=8, seed=2),
                  dtype="float32", max_model_len=1024, block_size=32,
                  gpu_memory_utilization=0.2, num_gpu_blocks_override=64,
                  enforce_eager=True, max_num_seqs=4, seed=0)
        params = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        long_prompt = " ".join(str(i) for i in range(60))  # over K = 40 tokens
        outputs = llm.generate(["Statistics across processes.", long_prompt], params)
        stats = llm.randkv_stats()
        record = llm.randkv_request_stats(outputs[0].request_id)
        print("RESULT " + json.dumps({
            "prompt": len(outputs[0].prompt_token_ids),
            "generated": len(outputs[0].outputs[0].token_ids),
            "refused": outputs[1].outputs[0].finish_reason,
            "rounds": stats.counters["rounds"],
            "scheduler": stats.scheduler,
            "ranks": stats.ranks,
            "record": [record.rounds, record.tokens_seen, record.finished],
            "record_type": type(record).__name__,
        }))
    """
)


def test_stats_cross_vllms_processes_typed(tiny_model_path):
    from randkv import RandKVConfig, num_rounds

    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="1", OMP_NUM_THREADS="1")
    for name in ("VLLM_USE_V2_MODEL_RUNNER", "TRITON_INTERPRET"):
        env.pop(name, None)  # vLLM's default runner: the V2 interpreter backend is test-only
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, tiny_model_path],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    config = RandKVConfig(budget=40, buffer_size=8, seed=2)
    seen = result["prompt"] + result["generated"] - 1
    rounds = num_rounds(config, prompt_length=result["prompt"], tokens_seen=seen)
    assert result["refused"] == "error"
    assert rounds >= 5 and result["rounds"] == rounds  # only the first request ran rounds
    assert result["scheduler"]["rejected_prompts"] == 1  # counted by the scheduler alone
    assert result["ranks"] == 1 and result["record_type"] == "RequestRecord"
    assert result["record"] == [rounds, seen, True]
