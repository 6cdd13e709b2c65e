"""`randkv demo` (what `make demo` runs): a short iso-memory comparison of plain vLLM and
vLLM + RandKV served over HTTP, then a picture of which positions each KV head kept.

On the embedded tiny checkpoint it takes a few minutes on 2 CPU cores; `--model` runs the
same on a real checkpoint (a local path or a hub id vLLM can load).

The terminal gets the demo's own lines and progress bars only. vLLM's logs go to files in
the results folder: each server's to `server-<arm>.log`, the offline engine of the retention
picture (run in a child process, with its engine processes) to `retention.log`, and this
process's own to `demo.log`.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from randkv.config import RandKVConfig

if TYPE_CHECKING:
    from randkv.bench.serve import ServeBench

# The demo's tiny model has 8 KV heads, so the retention picture shows 8 independent rows.
DEMO_MODEL_PARAMS = {"num_heads": 8, "num_kv_heads": 8, "head_dim": 32}
DEMO_CONFIG = RandKVConfig(budget=128, buffer_size=64, seed=0)
RETENTION_KEY = "randkv-demo"


def demo_bench(model: str | None, results: Path) -> ServeBench:
    """16 long generations; the pool holds 8 RandKV requests (8 x 16 blocks) but only about
    two plain ones at full length."""
    from randkv.bench.serve import ServeBench
    from randkv.bench.workload import WorkloadSpec

    return ServeBench(
        model=model,
        workload=WorkloadSpec(requests=16, prompt_tokens=(16, 48), output_tokens=(512, 1024)),
        randkv=DEMO_CONFIG,
        pool_blocks=140,
        block_size=16,
        max_num_seqs=8,
        results_dir=results,
    )


def send_vllm_logs_to(log_path: Path) -> None:
    """Write this process's vLLM log records to `log_path` instead of the terminal.

    vLLM configures its logger when first imported (and logs while importing), from the file
    named by VLLM_LOGGING_CONFIG_PATH if set; the variable is removed again so the servers
    this process starts keep logging to their own files.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    config = {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(levelname)s %(asctime)s %(name)s: %(message)s"}},
        "handlers": {
            "file": {
                "class": "logging.FileHandler",
                "filename": str(log_path.resolve()),
                "formatter": "plain",
            }
        },
        "loggers": {"vllm": {"handlers": ["file"], "level": "INFO", "propagate": False}},
    }
    previous = os.environ.get("VLLM_LOGGING_CONFIG_PATH")
    with tempfile.TemporaryDirectory(prefix="randkv-demo-") as folder:
        config_path = Path(folder) / "vllm-logging.json"
        config_path.write_text(json.dumps(config))
        os.environ["VLLM_LOGGING_CONFIG_PATH"] = str(config_path)
        try:
            import vllm.logger  # noqa: F401 - configures the "vllm" logger on first import
        finally:
            if previous is None:
                os.environ.pop("VLLM_LOGGING_CONFIG_PATH")
            else:
                os.environ["VLLM_LOGGING_CONFIG_PATH"] = previous
    # If vLLM was imported before, its terminal handler is still there: replace it.
    logger = logging.getLogger("vllm")
    target = str(log_path.resolve())
    for handler in list(logger.handlers):
        if getattr(handler, "baseFilename", None) != target:
            logger.removeHandler(handler)
    if not logger.handlers:
        file_handler = logging.FileHandler(target)
        file_handler.setFormatter(logging.Formatter(config["formatters"]["plain"]["format"]))
        logger.addHandler(file_handler)
    logger.propagate = False


def retention(model: str, results: Path, new_tokens: int = 600) -> dict[str, Any]:
    """`retention_in_process` in a child process whose output (vLLM's logs, from its engine
    processes too) goes to `retention.log`; returns its summary."""
    log_path = results / "retention.log"
    argv = [sys.executable, "-m", "randkv.demo", "retention", model, str(results), str(new_tokens)]
    with open(log_path, "wb") as log:
        child = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, check=False)
    if child.returncode != 0:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(
            f"the retention run failed (exit {child.returncode}); {log_path}:\n{tail}"
        )
    return json.loads((results / "retention.json").read_text())


def retention_in_process(model: str, results: Path, new_tokens: int = 600) -> dict[str, Any]:
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
        config=DEMO_CONFIG,
        tokens_seen=tokens_seen,
        prompt_length=prompt,
        layer=0,
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
    results = Path(results_dir)
    results.mkdir(parents=True, exist_ok=True)
    send_vllm_logs_to(results / "demo.log")
    from randkv.bench import serve

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
    print(serve.format_table(result, with_target=False))
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
        f"{results / 'retention.png'}; vLLM's logs: {results}/*.log"
    )


def _main(argv: list[str]) -> None:
    """`python -m randkv.demo retention MODEL RESULTS NEW_TOKENS` (the child process)."""
    if len(argv) != 4 or argv[0] != "retention":
        raise SystemExit("usage: python -m randkv.demo retention MODEL RESULTS NEW_TOKENS")
    retention_in_process(argv[1], Path(argv[2]), int(argv[3]))


if __name__ == "__main__":
    _main(sys.argv[1:])
