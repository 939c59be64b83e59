"""Write the replay pool files under data/pools/ from one catalogue of recorded models.

Run: `.venv/bin/python -m scripts.make_replay_pools`. The catalogue below is the single place
where a recorded model gets its short worker name, family, size and price, so the replay pools
agree with each other. Prices are USD per million tokens: provider list prices of the
recording's period (autumn 2024) for API models; for open-weight models a typical hosted rate
for their size, marked "indicative" in the description.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from conductor_pipeline.corpora.sources import resolve_data_file
from conductor_pipeline.paths import POOLS_DIR
from conductor_pipeline.pools.backends.replay import SOURCE_KEYS, routerdc_models, zeroeval_models, zeroeval_responses


@dataclass(frozen=True)
class Recorded:
    name: str
    family: str
    params_b: float | None
    price_in: float
    price_out: float
    what: str
    list_price: bool = True  # False: an indicative hosted rate for open weights


def _open(name: str, family: str, params_b: float, rate: float, what: str) -> Recorded:
    return Recorded(name, family, params_b, rate, rate, what, list_price=False)


ZEROEVAL_CATALOGUE: dict[str, Recorded] = {
    "gpt-4o-2024-08-06": Recorded("gpt-4o", "gpt", None, 2.50, 10.00, "OpenAI GPT-4o (2024-08-06), strong general model"),
    "gpt-4o-2024-05-13": Recorded("gpt-4o-0513", "gpt", None, 5.00, 15.00, "OpenAI GPT-4o (2024-05-13)"),
    "gpt-4o-mini-2024-07-18": Recorded("gpt-4o-mini", "gpt", None, 0.15, 0.60, "OpenAI GPT-4o mini, cheap and fast"),
    "chatgpt-4o-latest-24-09-07": Recorded("chatgpt-4o-latest", "gpt", None, 5.00, 15.00, "OpenAI ChatGPT-4o (2024-09-07)"),
    "gpt-4-0314": Recorded("gpt-4-0314", "gpt", None, 30.00, 60.00, "OpenAI GPT-4 (2023-03-14)"),
    "gpt-4-turbo-2024-04-09": Recorded("gpt-4-turbo", "gpt", None, 10.00, 30.00, "OpenAI GPT-4 Turbo (2024-04-09)"),
    "gpt-3.5-turbo-0125": Recorded("gpt-3.5-turbo", "gpt", None, 0.50, 1.50, "OpenAI GPT-3.5 Turbo, older and cheap"),
    "o1-mini-2024-09-12": Recorded("o1-mini", "o1", None, 3.00, 12.00, "OpenAI o1-mini, reasoning model strong at math"),
    "o1-preview-2024-09-12": Recorded("o1-preview", "o1", None, 15.00, 60.00, "OpenAI o1-preview, reasoning model, expensive"),
    "claude-3-5-sonnet-20240620": Recorded(
        "claude-3.5-sonnet", "claude", None, 3.00, 15.00, "Anthropic Claude 3.5 Sonnet (2024-06-20), strong general model"
    ),
    "claude-3-haiku-20240307": Recorded("claude-3-haiku", "claude", None, 0.25, 1.25, "Anthropic Claude 3 Haiku, small and cheap"),
    "claude-3-opus-20240229": Recorded("claude-3-opus", "claude", None, 15.00, 75.00, "Anthropic Claude 3 Opus, large and expensive"),
    "claude-3-sonnet-20240229": Recorded("claude-3-sonnet", "claude", None, 3.00, 15.00, "Anthropic Claude 3 Sonnet"),
    "gemini-1.5-pro": Recorded("gemini-1.5-pro", "gemini", None, 1.25, 5.00, "Google Gemini 1.5 Pro, strong at math"),
    "gemini-1.5-pro-exp-0801": Recorded("gemini-1.5-pro-0801", "gemini", None, 1.25, 5.00, "Google Gemini 1.5 Pro experimental (08-01)"),
    "gemini-1.5-pro-exp-0827": Recorded("gemini-1.5-pro-0827", "gemini", None, 1.25, 5.00, "Google Gemini 1.5 Pro experimental (08-27)"),
    "gemini-1.5-flash": Recorded("gemini-1.5-flash", "gemini", None, 0.075, 0.30, "Google Gemini 1.5 Flash, fast and cheap"),
    "gemini-1.5-flash-exp-0827": Recorded("gemini-1.5-flash-0827", "gemini", None, 0.075, 0.30, "Google Gemini 1.5 Flash experimental (08-27)"),
    "deepseek-v2.5-0908": Recorded(
        "deepseek-v2.5", "deepseek", 236, 0.14, 0.28, "DeepSeek V2.5 (236B MoE, 21B active), strong and very cheap"
    ),
    "deepseek-chat": Recorded("deepseek-v2-chat", "deepseek", 236, 0.14, 0.28, "DeepSeek V2 chat (0628), MoE"),
    "deepseek-coder": Recorded("deepseek-v2-coder", "deepseek", 236, 0.14, 0.28, "DeepSeek V2 coder (0614), code-tuned MoE"),
    "DeepSeek-Coder-V2-0724": Recorded("deepseek-v2-coder-0724", "deepseek", 236, 0.14, 0.28, "DeepSeek V2 coder (0724), code-tuned MoE"),
    "Mistral-Large-2": Recorded("mistral-large-2", "mistral", 123, 2.00, 6.00, "Mistral Large 2 (123B dense)"),
    "Mistral-Nemo-Instruct-2407": Recorded("mistral-nemo", "mistral", 12, 0.15, 0.15, "Mistral NeMo 12B instruct"),
    "Mixtral-8x7B-Instruct-v0.1": Recorded("mixtral-8x7b", "mistral", 46.7, 0.60, 0.60, "Mixtral 8x7B instruct, sparse MoE"),
    "command-r": Recorded("command-r", "cohere", 35, 0.15, 0.60, "Cohere Command R (35B)"),
    "command-r-plus": Recorded("command-r-plus", "cohere", 104, 2.50, 10.00, "Cohere Command R+ (104B)"),
    "reka-core-20240501": Recorded("reka-core", "reka", None, 10.00, 25.00, "Reka Core (2024-05-01)"),
    "reka-flash-20240226": Recorded("reka-flash", "reka", 21, 0.80, 2.00, "Reka Flash (21B)"),
    "yi-large": Recorded("yi-large", "yi", None, 3.00, 3.00, "01.AI Yi-Large"),
    "yi-large-preview": Recorded("yi-large-preview", "yi", None, 3.00, 3.00, "01.AI Yi-Large preview"),
    "Llama-3.1-405B-Inst@sambanova": Recorded(
        "llama-3.1-405b", "llama", 405, 5.00, 10.00, "Meta Llama 3.1 405B instruct served by SambaNova, largest open model"
    ),
    "Llama-3.1-405B-Instruct-Turbo": Recorded("llama-3.1-405b-fp8", "llama", 405, 3.50, 3.50, "Meta Llama 3.1 405B instruct, fp8 (Together)"),
    "Meta-Llama-3.1-405B-Instruct@hyperbolic": Recorded(
        "llama-3.1-405b-hyperbolic", "llama", 405, 4.00, 4.00, "Meta Llama 3.1 405B instruct (Hyperbolic)"
    ),
    "Meta-Llama-3.1-70B-Instruct": _open("llama-3.1-70b", "llama", 70, 0.88, "Meta Llama 3.1 70B instruct"),
    "Meta-Llama-3.1-70B-Instruct@hyperbolic": _open("llama-3.1-70b-hyperbolic", "llama", 70, 0.40, "Meta Llama 3.1 70B instruct (Hyperbolic)"),
    "Meta-Llama-3.1-8B-Instruct": _open("llama-3.1-8b", "llama", 8, 0.18, "Meta Llama 3.1 8B instruct, small and cheap, weak at hard math"),
    "Meta-Llama-3-70B-Instruct": _open("llama-3-70b", "llama", 70, 0.88, "Meta Llama 3 70B instruct"),
    "Meta-Llama-3-8B-Instruct": _open("llama-3-8b", "llama", 8, 0.18, "Meta Llama 3 8B instruct, small"),
    "Athene-70B": _open("athene-70b", "llama", 70, 0.88, "Nexusflow Athene 70B (Llama 3 70B fine-tune)"),
    "Qwen2-72B-Instruct": _open("qwen2-72b", "qwen", 72, 0.90, "Alibaba Qwen2 72B instruct"),
    "Qwen2-7B-Instruct": _open("qwen2-7b", "qwen", 7, 0.20, "Alibaba Qwen2 7B instruct"),
    "Qwen2.5-72B-Instruct": _open("qwen2.5-72b", "qwen", 72, 1.20, "Alibaba Qwen2.5 72B instruct, strong at math"),
    "Qwen2.5-32B-Instruct": _open("qwen2.5-32b", "qwen", 32, 0.80, "Alibaba Qwen2.5 32B instruct"),
    "Qwen2.5-7B-Instruct": _open("qwen2.5-7b", "qwen", 7, 0.30, "Alibaba Qwen2.5 7B instruct, good math for its size"),
    "Qwen2.5-3B-Instruct": _open("qwen2.5-3b", "qwen", 3, 0.10, "Alibaba Qwen2.5 3B instruct, tiny and cheap"),
    "Phi-3-mini-4k-instruct": _open("phi-3-mini", "phi", 3.8, 0.10, "Microsoft Phi-3 mini 4k instruct (3.8B)"),
    "Phi-3.5-mini-instruct": _open("phi-3.5-mini", "phi", 3.8, 0.10, "Microsoft Phi-3.5 mini instruct (3.8B)"),
    "Yi-1.5-34B-Chat": _open("yi-1.5-34b", "yi", 34, 0.80, "01.AI Yi-1.5 34B chat"),
    "Yi-1.5-9B-Chat": _open("yi-1.5-9b", "yi", 9, 0.20, "01.AI Yi-1.5 9B chat"),
    "gemma-2-27b-it": _open("gemma-2-27b", "gemma", 27, 0.80, "Google Gemma 2 27B instruct"),
    "gemma-2-27b-it@together": _open("gemma-2-27b-together", "gemma", 27, 0.80, "Google Gemma 2 27B instruct (Together)"),
    "gemma-2-9b-it": _open("gemma-2-9b", "gemma", 9, 0.30, "Google Gemma 2 9B instruct"),
    "gemma-2-2b-it": _open("gemma-2-2b", "gemma", 2.6, 0.10, "Google Gemma 2 2B instruct, tiny"),
}

ROUTERDC_CATALOGUE: dict[str, Recorded] = {
    "mistralai/Mistral-7B-v0.1": _open("mistral-7b", "mistral", 7, 0.20, "Mistral 7B base"),
    "meta-math/MetaMath-Mistral-7B": _open("metamath-mistral-7b", "mistral", 7, 0.20, "MetaMath Mistral 7B, math-tuned"),
    "itpossible/Chinese-Mistral-7B-v0.1": _open("chinese-mistral-7b", "mistral", 7, 0.20, "Chinese Mistral 7B"),
    "HuggingFaceH4/zephyr-7b-beta": _open("zephyr-7b", "mistral", 7, 0.20, "Zephyr 7B beta, chat-tuned Mistral"),
    "cognitivecomputations/dolphin-2.6-mistral-7b": _open("dolphin-2.6-mistral-7b", "mistral", 7, 0.20, "Dolphin 2.6 Mistral 7B"),
    "meta-llama/Meta-Llama-3-8B": _open("llama-3-8b-base", "llama", 8, 0.20, "Meta Llama 3 8B base"),
    "cognitivecomputations/dolphin-2.9-llama3-8b": _open("dolphin-2.9-llama3-8b", "llama", 8, 0.20, "Dolphin 2.9 Llama 3 8B"),
}

MIXED6 = [
    "gpt-4o-2024-08-06",
    "claude-3-5-sonnet-20240620",
    "gemini-1.5-pro",
    "Llama-3.1-405B-Inst@sambanova",
    "deepseek-v2.5-0908",
    "Meta-Llama-3.1-8B-Instruct",
]
QWEN25 = ["Qwen2.5-3B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-72B-Instruct"]
# Pools of test models only (conductor_pipeline.pools.test_models), each recorded on all of MATH
# level-5 and GSM8K test: the workers a trained conductor never saw. Six of five vendors from small
# to large; the same six in another order; four others; eight with a vote seat.
TEST_SIX = [
    "gpt-4o-mini-2024-07-18",
    "claude-3-haiku-20240307",
    "gemini-1.5-flash",
    "Meta-Llama-3.1-70B-Instruct",
    "Mistral-Large-2",
    "gemma-2-9b-it",
]
TEST_SIX_REORDERED = [TEST_SIX[i] for i in (4, 2, 5, 0, 3, 1)]
TEST_FOUR = ["Qwen2-72B-Instruct", "Yi-1.5-34B-Chat", "Meta-Llama-3-70B-Instruct", "gemma-2-27b-it"]
TEST_EIGHT = [*TEST_SIX, "Qwen2-72B-Instruct", "Yi-1.5-34B-Chat"]
# The model zoo a conductor for any pool trains on, and the validation models held out of it to
# develop against (the test models are for final figures only). Both are drawn from the seventeen
# other models ZeroEval recorded on all of MATH level-5 and GSM8K test, so every sub-pool of the zoo
# answers every training question. The validation six span 0.19-0.55 on MATH L5 (ZeroEval's own match)
# and six families, as replay-test-six does five; the zoo keeps the eleven others, from o1-mini (0.89)
# to gemma-2-2b (0.04), so sub-pools differ in who is best.
VALIDATION_SIX = [
    "Athene-70B",
    "claude-3-opus-20240229",
    "gpt-4o-2024-05-13",
    "Phi-3.5-mini-instruct",
    "Qwen2-7B-Instruct",
    "Yi-1.5-9B-Chat",
]
ZOO_TRAIN = [
    "o1-mini-2024-09-12",
    "gpt-4o-2024-08-06",
    "claude-3-5-sonnet-20240620",
    "gemini-1.5-pro",
    "Llama-3.1-405B-Inst@sambanova",
    "deepseek-v2.5-0908",
    "reka-core-20240501",
    "gpt-3.5-turbo-0125",
    "Meta-Llama-3.1-8B-Instruct",
    "Meta-Llama-3-8B-Instruct",
    "gemma-2-2b-it",
]

# The aggregator seat of replay-mixed6-vote: no model, so no replay source, family or price.
VOTE_SEAT = {
    "name": "majority-vote",
    "backend": "vote",
    "model": "majority-vote",
    "description": (
        "Aggregator, not a model: replies with the most common final answer among the earlier steps in its "
        "access list (equivalent answers such as 1/2 and 0.5 count as one; a tie goes to the earliest step) and "
        "ignores its subtask. Give it access to several workers' steps; with access to none it answers nothing. Free."
    ),
    "concurrency": 64,
}

# The aggregator seat of replay-mixed6-cascade: the same vote, which skips the steps it has not yet
# run when the first two it sees agree (an agreement cascade the conductor writes). It keeps the vote
# seat's name, which the tiny tokenizer already holds as one token, so this pool changes no recorded
# figure.
AGREEMENT_VOTE_SEAT = {
    **VOTE_SEAT,
    "description": (
        "Aggregator, not a model: replies with the most common final answer among the earlier steps in its "
        "access list (equivalent answers such as 1/2 and 0.5 count as one; a tie goes to the earliest step) and "
        "ignores its subtask. When the first two steps it sees give the same answer, the steps before it that "
        "have not run are skipped and not paid for: put the workers most likely to agree on a right answer "
        "first. Give it access to several workers' steps; with access to none it answers nothing. Free."
    ),
    "stop_when_first_agree": 2,
}

# The conductor itself as a seat of replay-mixed6-recursive (depth-capped recursion): answered by the
# conductor policy of the run, so no replay source, family or price.
CONDUCTOR_SEAT = {
    "name": "conductor",
    "backend": "conductor",
    "model": "conductor",
    "description": (
        "The conductor itself: give it a subtask and it writes (and runs) a new workflow over these workers; it "
        "sees the workflow so far and the answer so far, and may pass that answer through unchanged."
    ),
    "concurrency": 8,
}

# Replay answers instantly: many calls in flight cost nothing, and the governor still caps them.
REPLAY_SEAT_CONCURRENCY = 64
REPLAY_MAX_IN_FLIGHT = 256


def seat(model: str, entry: Recorded, source: str, coverage: str) -> dict:
    price = "list price" if entry.list_price else "indicative open-weights hosted price"
    return {
        "name": entry.name,
        "backend": "replay",
        "replay_source": source,
        "model": model,
        "description": f"{entry.what}; {coverage} ({price})",
        "family": entry.family,
        **({"params_b": entry.params_b} if entry.params_b else {}),
        "price_input_per_mtok": entry.price_in,
        "price_output_per_mtok": entry.price_out,
        "concurrency": REPLAY_SEAT_CONCURRENCY,
    }


def zeroeval_coverage(model: str) -> str:
    """What the replay worker will actually answer (file match, else display-name match per benchmark)."""
    recorded = zeroeval_responses(model, Path(resolve_data_file(SOURCE_KEYS["zeroeval"])))
    gsm = sum(qid.startswith("gsm8k:") for qid in recorded)
    math = len(recorded) - gsm
    parts = [f"MATH L5 {math}/721" if math else "", f"GSM8K test {gsm}/1319" if gsm else ""]
    return "recorded on " + " and ".join(p for p in parts if p)


def pool_document(name: str, description: str, seats: list[dict]) -> dict:
    return {
        "name": name,
        "description": description,
        "governor": {"max_in_flight": REPLAY_MAX_IN_FLIGHT},
        "workers": seats,
    }


def write(path: Path, document: dict) -> None:
    header = "# Generated by scripts/make_replay_pools.py; edit the catalogue there, not this file.\n"
    path.write_text(header + yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=120))
    print(f"wrote {path} ({len(document['workers'])} workers)")


def main() -> None:
    models = zeroeval_models()
    recorded_files = models["model_file"].to_list()
    missing = sorted(set(recorded_files) - set(ZEROEVAL_CATALOGUE))
    if missing:
        raise SystemExit(f"add these recorded models to ZEROEVAL_CATALOGUE: {missing}")

    def zeroeval_seats(model_files: list[str]) -> list[dict]:
        return [seat(m, ZEROEVAL_CATALOGUE[m], "zeroeval", zeroeval_coverage(m)) for m in model_files]

    write(
        POOLS_DIR / "replay-mixed6.yaml",
        pool_document(
            "replay-mixed6",
            "Embedded default: six models from four families recorded by ZeroEval (Apache-2.0) on all of "
            "MATH level-5 and GSM8K test, greedy decoding, one sample per question.",
            zeroeval_seats(MIXED6),
        ),
    )
    write(
        POOLS_DIR / "replay-mixed6-vote.yaml",
        pool_document(
            "replay-mixed6-vote",
            "The six replay-mixed6 models plus a majority-vote aggregator seat, so a workflow that fans out to "
            "several workers and lets a last step see their answers can beat any single worker on recordings.",
            [*zeroeval_seats(MIXED6), VOTE_SEAT],
        ),
    )
    write(
        POOLS_DIR / "replay-mixed6-cascade.yaml",
        pool_document(
            "replay-mixed6-cascade",
            "The six replay-mixed6 models plus a majority vote that stops early: when the first two workers it "
            "sees agree, the workers after them are not called, so a fan-out spends more only on the questions "
            "where its first answers disagree.",
            [*zeroeval_seats(MIXED6), AGREEMENT_VOTE_SEAT],
        ),
    )
    write(
        POOLS_DIR / "replay-mixed6-recursive.yaml",
        pool_document(
            "replay-mixed6-recursive",
            "The six replay-mixed6 models plus the conductor itself as a seat, so a workflow can hand a subtask "
            "to a new workflow (recursion, depth-capped by the orchestrator).",
            [*zeroeval_seats(MIXED6), CONDUCTOR_SEAT],
        ),
    )
    write(
        POOLS_DIR / "replay-zoo-train.yaml",
        pool_document(
            "replay-zoo-train",
            "The model zoo a conductor for any pool trains on: eleven models of eight families recorded by ZeroEval "
            "on all of MATH level-5 and GSM8K test, no test or validation model; training shows each question a "
            "random sub-pool of them.",
            zeroeval_seats(ZOO_TRAIN),
        ),
    )
    write(
        POOLS_DIR / "replay-validation-six.yaml",
        pool_document(
            "replay-validation-six",
            "Six validation models (held out of replay-zoo-train, not test models) from six families, recorded "
            "by ZeroEval on all of MATH level-5 and GSM8K test, one sample per question: develop against these.",
            zeroeval_seats(VALIDATION_SIX),
        ),
    )
    test_pools = {
        "replay-test-six": ("Six test models (held out of training) from five vendors", zeroeval_seats(TEST_SIX)),
        "replay-test-six-reordered": (
            "The six replay-test-six models listed in another order", zeroeval_seats(TEST_SIX_REORDERED)
        ),
        "replay-test-four": ("Four other test models (held out of training)", zeroeval_seats(TEST_FOUR)),
        "replay-test-eight-vote": (
            "Eight test models (held out of training) and a majority-vote aggregator seat",
            [*zeroeval_seats(TEST_EIGHT), VOTE_SEAT],
        ),
    }
    for name, (what, seats) in test_pools.items():
        description = f"{what}; recorded by ZeroEval on all of MATH level-5 and GSM8K test, one sample per question."
        write(POOLS_DIR / f"{name}.yaml", pool_document(name, description, seats))
    write(
        POOLS_DIR / "replay-qwen2.5.yaml",
        pool_document(
            "replay-qwen2.5",
            "Qwen2.5 3B/7B/72B instruct recorded by ZeroEval on MATH level-5 only (no GSM8K), one sample per question.",
            zeroeval_seats(QWEN25),
        ),
    )
    write(
        POOLS_DIR / "replay-zeroeval-all.yaml",
        pool_document(
            "replay-zeroeval-all",
            "Every model file ZeroEval recorded on MATH level-5 and/or GSM8K test; coverage differs per model "
            "(see each description), one sample per question.",
            zeroeval_seats(sorted(recorded_files, key=str.lower)),
        ),
    )
    dc_models = routerdc_models()
    write(
        POOLS_DIR / "replay-routerdc.yaml",
        pool_document(
            "replay-routerdc",
            "OPTIONAL, UNLICENSED DATA (RouterDC has no LICENSE: internal research use only, never a default): "
            "7 open 7-8B models on GSM8K test, 10 samples each at T=0.2, verdicts only (no response text).",
            [seat(m, ROUTERDC_CATALOGUE[m], "routerdc", "GSM8K test 1319/1319, 10 samples") for m in dc_models],
        ),
    )


if __name__ == "__main__":
    main()
