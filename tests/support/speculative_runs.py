"""What the speculative-decoding tests run and compare, in this process or another one.

`run()` generates with a RandKV `LLM` and reads back tokens, rounds, the target's slot maps
(cut to the verified tokens) and vLLM's acceptance counters. Run as a script, it builds the
engine from the JSON on its command line and prints one `RESULT {...}` line: the ngram test
runs there, because vLLM's kernel registry breaks every later engine start in a process that
has imported numba (vLLM's ngram proposer does; vllm/triton_utils/dispatcher.py trips over
llvmlite's library object).
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from randkv import RandKVConfig
from randkv.spec import physical_length

RESULT_PREFIX = "RESULT "


def acceptance(llm: Any) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) so far, from vLLM's own counters."""
    counts = {m.name: m.value for m in llm.get_metrics() if hasattr(m, "value")}
    return (
        int(counts.get("vllm:spec_decode_num_draft_tokens", 0)),
        int(counts.get("vllm:spec_decode_num_accepted_tokens", 0)),
    )


def run(llm: Any, config: RandKVConfig, prompts: list[str], params: Any) -> dict[str, Any]:
    """Tokens, rounds, target-layer slot maps (cut to the verified tokens) and acceptance."""
    before = acceptance(llm)
    outputs = llm.generate(prompts, params)
    after = acceptance(llm)
    result: dict[str, Any] = {"tokens": [], "rounds": [], "maps": [], "lengths": []}
    for output in outputs:
        tokens = list(output.outputs[0].token_ids)
        prompt = len(output.prompt_token_ids)
        seen = prompt + len(tokens) - 1
        length = physical_length(config, prompt_length=prompt, tokens_seen=seen)
        slots = llm.randkv_slot_positions(output.request_id)
        result["tokens"].append(tokens)
        result["rounds"].append(llm.randkv_request_stats(output.request_id).rounds)
        # A finished request's map may still hold its last step's drafts past its verified
        # tokens: the target's layers are the first two, and only `length` slots count.
        result["maps"].append([[heads[:length] for heads in layer] for layer in slots[:2]])
        result["lengths"].append([prompt, seen])
    result["drafted"], result["accepted"] = (after[0] - before[0], after[1] - before[1])
    return result


def main(spec: dict[str, Any]) -> None:
    """Build the engine `spec` describes, run each of its sampling settings, print them."""
    from vllm import SamplingParams

    from randkv.vllm import LLM

    config = RandKVConfig(**spec["randkv"])
    llm = LLM(
        model=spec["model"],
        randkv=config,
        speculative_config=spec["speculative_config"],
        **spec["engine"],
    )
    results = [
        run(llm, config, spec["prompts"], SamplingParams(**params)) for params in spec["params"]
    ]
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    print(RESULT_PREFIX + json.dumps({"runs": results, "counters": scheduler.counters}))


def run_in_subprocess(spec: dict[str, Any]) -> dict[str, Any]:
    """`main(spec)` in a fresh Python process; its printed result."""
    import subprocess

    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0", RANDKV_TRACK_POSITIONS="1")
    out = subprocess.run(
        [sys.executable, __file__, json.dumps(spec)],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    (line,) = [line for line in out.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    return json.loads(line[len(RESULT_PREFIX) :])


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
