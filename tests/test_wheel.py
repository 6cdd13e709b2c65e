"""The wheel: `python -m build` packs the library and the vLLM plugin entry point, and no
model weights or study code; a fresh virtual environment with only that wheel (vLLM and
torch reused from this environment, no network) runs RandKV under stock vLLM's OpenAI
server."""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("vllm")
pytest.importorskip("build")
openai = pytest.importorskip("openai")

from randkv.bench.server import SERVED_MODEL_NAME, Server, free_port  # noqa: E402

pytestmark = pytest.mark.engine

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    # Build from a copy of the tracked files, so the checkout gets no build/ or egg-info.
    source = tmp_path_factory.mktemp("source")
    files = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in files:
        if (REPO / name).is_file():
            (source / name).parent.mkdir(parents=True, exist_ok=True)
            (source / name).write_bytes((REPO / name).read_bytes())
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
         str(source)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = out.glob("randkv-*.whl")
    return wheel


def test_the_wheel_ships_the_library_and_the_plugin_and_nothing_else(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        text = archive.read(entry_points).decode()
    modules = {n for n in names if n.endswith(".py")}
    # Every module of the library, each layer's package included, and nothing beside it.
    library = {str(p.relative_to(REPO / "src")) for p in (REPO / "src" / "randkv").rglob("*.py")}
    assert modules == library
    assert {"randkv/spec/__init__.py", "randkv/kernels/planner.py"} <= modules
    assert "randkv/vllm/plugin.py" in names
    assert "[vllm.general_plugins]" in text and "randkv.vllm.plugin:register" in text
    # No model weights, no study code or checkpoints (the studies run from a checkout).
    assert not [n for n in names if n.endswith((".safetensors", ".bin", ".gguf", ".pt"))]
    assert not [n for n in names if n.startswith(("studies/", "randkv/quality/", "tests/"))]
    data = [n for n in names if not n.endswith(".py") and ".dist-info/" not in n]
    assert not data, data


@pytest.fixture(scope="module")
def fresh_env(wheel, tmp_path_factory) -> Path:
    env = tmp_path_factory.mktemp("venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", str(env)], check=True, timeout=300)
    python = env / "bin" / "python"
    # Reuse this environment's vLLM and torch (a path line in a .pth file: this
    # environment's own .pth files, such as the editable RandKV, are not processed).
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(purelib) / "reuse-test-env.pth").write_text(site.getsitepackages()[0] + "\n")
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    return env


def test_vllms_plugin_loader_finds_the_installed_wheel(fresh_env):
    script = (
        "import json, randkv\n"
        "from vllm.plugins import load_plugins_by_group\n"
        "plugins = load_plugins_by_group('vllm.general_plugins')\n"
        "import randkv.vllm.plugin as p\n"
        "print(json.dumps({'randkv': randkv.__file__, 'plugin': p.__file__,\n"
        "  'loaded': 'randkv' in plugins and plugins['randkv'] is p.register}))\n"
    )
    out = subprocess.run(
        [str(fresh_env / "bin" / "python"), "-c", script],
        capture_output=True, text=True, timeout=300, env=_clean_env(),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["loaded"]
    assert found["randkv"].startswith(str(fresh_env)), found  # the wheel, not this checkout
    assert found["plugin"].startswith(str(fresh_env)), found


def _clean_env() -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "VLLM_PLUGINS", "VLLM_ENABLE_V1_MULTIPROCESSING"):
        env.pop(name, None)
    return env


def test_the_stock_server_runs_randkv_from_the_wheel(fresh_env, tiny_model_path, tmp_path):
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    port = free_port()
    config = {"budget": 48, "buffer_size": 8, "seed": 0}
    argv = [
        str(fresh_env / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server",
        f"--model={tiny_model_path}", f"--served-model-name={SERVED_MODEL_NAME}",
        "--host=127.0.0.1", f"--port={port}", "--additional-config",
        json.dumps({"randkv": config}), "--dtype=float32", "--max-model-len=1024",
        "--num-gpu-blocks-override=64", "--gpu-memory-utilization=0.2", "--enforce-eager",
    ]  # fmt: skip
    server = Server(
        argv, port, tmp_path / "server.log", {"PROMETHEUS_MULTIPROC_DIR": str(metrics_dir)}
    )
    try:
        server.wait_ready()
        client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="-", max_retries=0)
        response = client.completions.create(
            model=SERVED_MODEL_NAME, prompt="From the wheel.", max_tokens=120,
            temperature=0, extra_body={"ignore_eos": True},
        )  # fmt: skip
        assert response.usage.completion_tokens == 120
        assert server.metrics()["randkv:rounds_total"] > 0
        with pytest.raises(openai.BadRequestError, match="RandKV budget K=48"):
            client.completions.create(model=SERVED_MODEL_NAME, prompt="z" * 60, max_tokens=2)
    finally:
        server.stop()
