"""A tiny Qwen2-architecture causal LM built entirely offline, for the CPU profile and CI.

Why: the pipeline must run end to end (policy -> SFT warm start -> GRPO gate -> checkpoint) on a
laptop with no hub access. A random-weight Qwen2 with a locally trained byte-level BPE tokenizer
and a Qwen-style chat template has the same interfaces as Qwen2.5-*-Instruct
(`AutoModelForCausalLM`, `apply_chat_template`, `transformers serve`), so every code path the GPU
profile uses is exercised on CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

from conductor_pipeline.corpora.sources import data_source, mirror_dir

# Bump when the build recipe changes, so cached builds with the old recipe are rebuilt.
TINY_MODEL_RECIPE_VERSION = 4
# Written last into a finished build; its presence (with a matching hash) means "reuse".
MANIFEST_NAME = "tiny_model_manifest.json"
# Qwen2Tokenizer's pre-tokenizing split, as transformers rebuilds it when it loads a qwen2-type
# checkpoint (its module-private `PRETOKENIZE_REGEX`; a test checks the two are still the same).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2.5's special tokens, so prompts and templates look exactly like the real conductor's.
PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)
# Long enough for a catalogue + 4 in-context examples + a question at the tiny vocab's token rate.
MAX_POSITION_EMBEDDINGS = 8192
# How many corpus questions feed the tokenizer: enough for useful merges, fast to train (< 1 s).
DEFAULT_CORPUS_QUESTIONS = 600
DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."

# Qwen2.5-Instruct's template, minus tool calling: the tiny model never sees tools.
QWEN_STYLE_CHAT_TEMPLATE = (
    "{%- if messages and messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + DEFAULT_SYSTEM_PROMPT + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- endif %}"
)




# Used when the shared corpora are absent (e.g. a fresh clone elsewhere): the tokenizer still
# learns digits, LaTeX and English merges.
_FALLBACK_QUESTIONS = (
    "What is the value of $2^{10} - 1$?",
    "Solve for $x$: $3x + 7 = 22$.",
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many in May. "
    "How many clips did Natalia sell altogether?",
    "Compute $\\dbinom{8}{3}$.",
    "Find the remainder when $7^{100}$ is divided by $5$.",
    "What is the area of a circle with radius $4$? Express your answer in terms of $\\pi$.",
    "Simplify $\\frac{x^2 - 9}{x - 3}$ for $x \\neq 3$.",
    "A train travels 60 miles per hour for 3 hours. How far does it travel?",
)

# Copies of each shipped pool's conductor prompt in the corpus: the system prompt is most of every
# sequence the policy reads (~90% of a GRPO rollout's tokens), so its words deserve merges of
# their own; a few copies outweigh the same words in scattered math text.
PROMPT_COPIES = 20
# Rendered workflow targets (both synthetic styles) in the corpus: what the conductor writes.
FORMAT_STRINGS = 400


def _corpus_questions(limit: int) -> list[str]:
    """Math questions from the shared MATH500 and GSM8K files, else a small fallback list."""
    mirror = mirror_dir()
    if mirror is None:
        return list(_FALLBACK_QUESTIONS)
    sources = (("math500_test", "problem"), ("gsm8k_train", "question"))
    questions: list[str] = []
    for key, field_name in sources:
        path = mirror / data_source(key).path
        if not path.is_file():
            continue
        with path.open(encoding="utf-8") as handle:
            for line_number, line in enumerate(handle):
                if line_number >= limit // len(sources):
                    break
                questions.append(json.loads(line)[field_name])
    return questions or list(_FALLBACK_QUESTIONS)


# The pool files (data/pools/) whose catalogues the tiny tokenizer learns from: a fixed list, because
# the tokenizer's merges follow the text's frequencies, so a new pool file would otherwise change the
# tiny policy and every figure recorded with it. Every seat name of the later pool files
# (replay-zoo-train, replay-validation-six) is a seat of replay-zeroeval-all, and so a token already.
TOKENIZER_POOLS = (
    "hosted-six", "local-qwen-vllm", "replay-mixed6", "replay-mixed6-recursive", "replay-mixed6-vote",
    "replay-qwen2.5", "replay-routerdc", "replay-test-eight-vote", "replay-test-four", "replay-test-six",
    "replay-test-six-reordered", "replay-zeroeval-all", "tiny-serve",
)


def _tokenizer_pool_files() -> list[Path]:
    from conductor_pipeline.paths import POOLS_DIR

    return sorted(POOLS_DIR / f"{name}.yaml" for name in TOKENIZER_POOLS)


def conductor_prompt_texts() -> list[str]:
    """The conductor's system prompt over each `TOKENIZER_POOLS` catalogue."""
    from conductor_pipeline.conductor.prompt import build_conductor_prompt, catalogue_from_pool
    from conductor_pipeline.pools.config import PoolConfigError, load_pool

    texts = []
    for path in _tokenizer_pool_files():
        try:
            catalogue = catalogue_from_pool(load_pool(path))
        except PoolConfigError:
            continue
        texts.append(build_conductor_prompt("", catalogue, naming="ordinal")[0]["content"])
    return texts


def shipped_seat_names() -> list[str]:
    """Every seat name of the `TOKENIZER_POOLS`, sorted.

    They become whole tokens of the tiny tokenizer: under `naming: names` a conductor writes a
    worker's name, and the byte-level pre-tokenizer would cut "llama-3.1-405b" into eight pieces,
    which a two-layer model blends into names no pool has ("llama-4o", "gemini-v2.5-pro"). As one
    token each, a name is copied from the catalogue whole, or not at all.
    """
    from conductor_pipeline.pools.config import PoolConfigError, load_pool

    names: set[str] = set()
    for path in _tokenizer_pool_files():
        try:
            names.update(seat.name for seat in load_pool(path).workers)
        except PoolConfigError:
            continue
    return sorted(names)


def default_tokenizer_corpus(seed: int = 0) -> list[str]:
    """Math questions, the conductor prompts and rendered workflows: what the conductor reads and writes."""
    from conductor_pipeline.training.synthetic import format_corpus

    return (
        _corpus_questions(DEFAULT_CORPUS_QUESTIONS)
        + conductor_prompt_texts() * PROMPT_COPIES
        + format_corpus(FORMAT_STRINGS, seed)
    )


def _train_tokenizer(texts: list[str], vocab_size: int):
    """Byte-level BPE trained on `texts`, wrapped as a transformers fast tokenizer.

    The normalizer and pre-tokenizer are exactly Qwen2Tokenizer's: `AutoTokenizer` loads a
    qwen2-type checkpoint as Qwen2Tokenizer, which rebuilds them from its own recipe, so any other
    choice would encode differently at load time than at training time.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        chat_template=QWEN_STYLE_CHAT_TEMPLATE,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        padding_side="left",  # decoder-only generation pads on the left
    )


def _config_hash(settings: dict, texts: list[str] | None) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for text in texts or ():
        digest.update(hashlib.sha256(text.encode()).digest())
    return digest.hexdigest()[:16]


def _read_manifest(out_dir: Path) -> dict | None:
    try:
        return json.loads((out_dir / MANIFEST_NAME).read_text())
    except (OSError, ValueError):
        return None


def build_tiny_causal_lm(
    out_dir: Path,
    *,
    texts: Iterable[str] | None = None,
    vocab_size: int = 2048,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    seed: int = 0,
) -> Path:
    """Build (or reuse) a random-weight Qwen2ForCausalLM + local tokenizer in `out_dir`.

    Idempotent: a finished build records its config hash in a manifest; a later call with the
    same settings returns at once, a call with different settings rebuilds. The build is written
    to a sibling temp folder and renamed into place, so a crash never leaves a half-built model
    that looks finished.
    """
    out_dir = Path(out_dir)
    text_list = list(texts) if texts is not None else None
    settings = {
        "recipe": TINY_MODEL_RECIPE_VERSION,
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "num_layers": num_layers,
        "num_heads": num_heads,
        "seed": seed,
        "custom_texts": text_list is not None,
        "seat_tokens": shipped_seat_names(),
    }
    config_hash = _config_hash(settings, text_list)
    existing = _read_manifest(out_dir)
    if existing is not None and existing.get("config_hash") == config_hash:
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and existing is None:
        raise FileExistsError(f"{out_dir} exists and is not a tiny-model build; refusing to replace")

    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    if hidden_size % num_heads:
        raise ValueError(f"hidden_size {hidden_size} must be divisible by num_heads {num_heads}")
    tokenizer = _train_tokenizer(
        text_list if text_list is not None else default_tokenizer_corpus(seed), vocab_size
    )
    tokenizer.add_tokens(settings["seat_tokens"])
    eos_id = tokenizer.convert_tokens_to_ids(IM_END)
    pad_id = tokenizer.convert_tokens_to_ids(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 4,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    # Like Qwen2.5-Instruct: stop on <|im_end|> or <|endoftext|>.
    model.generation_config = GenerationConfig(
        eos_token_id=[eos_id, pad_id], pad_token_id=pad_id, do_sample=True, temperature=1.0
    )

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.building-", dir=out_dir.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        manifest = {"config_hash": config_hash, "settings": settings, "vocab_size": len(tokenizer)}
        (staging / MANIFEST_NAME).write_text(json.dumps(manifest, indent=2))
        if out_dir.exists():
            shutil.rmtree(out_dir)  # only reached for our own stale build (manifest present)
        os.replace(staging, out_dir)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out_dir
