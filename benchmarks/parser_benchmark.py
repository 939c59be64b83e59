"""Parse 100k typical conductor outputs and print the time (target: under 5 s).

Typical output: 1-2k characters of reasoning with LaTeX braces and apostrophes, then a workflow
in one of the accepted forms; about 15% fail, the rate Coryphaeus's prompted conductor showed
(14.7% unparseable; docs/ARCHITECTURE.md, References). Side by side, a naive baseline on the same texts: regex for the
three assignments plus `ast.literal_eval`, with no validation at all; the ratio says what the
strictness and the no-eval decoder cost.

    .venv/bin/python -m benchmarks.parser_benchmark [--n 100000] [--distinct 10000]
"""

from __future__ import annotations

import argparse
import ast
import random
import re
import time
from collections import Counter

from conductor_pipeline.workflow import PARSE_OK, Step, Workflow, WorkflowParseError, parse_workflow, render_workflow

WORKERS = [f"Model {i}" for i in range(6)]
SENTENCES = [
    "Let me think about which worker should handle this problem.",
    "The question asks for $\\frac{a}{b}$ where $a + b = 12$ and the ratio is $\\frac{1}{3}$.",
    "Model 2 is strong at algebra, but it's slower; Model 0 is fast and usually right on arithmetic.",
    "We need $\\sqrt{x^2 + 1}$ evaluated at $x = 3$, which gives $\\sqrt{10}$, so a checker helps.",
    "A single solver might miss the edge case {n = 0}, so I'll add a verification step.",
    "The answer should go in \\boxed{} as the benchmark expects.",
    "Geometry problems benefit from a plan: identify the triangle, then apply the law of cosines.",
    "I don't think decomposition helps much for a one-line computation like this one.",
]
SUBTASKS = [
    "Solve the problem step by step. Give the final answer in \\boxed{}.",
    "Check the previous solution step by step; if it's wrong, correct it. Give the final answer in \\boxed{}.",
    "Outline a plan: the quantities involved and the steps, without computing the answer.",
    "Two solutions are given. Compare them and give the correct answer in \\boxed{}.",
]


def _reasoning(rng: random.Random) -> str:
    target = rng.randint(1000, 2000)
    parts: list[str] = []
    while sum(map(len, parts)) < target:
        parts.append(rng.choice(SENTENCES))
    return " ".join(parts)


def _valid_block(rng: random.Random) -> str:
    n_steps = rng.choice([1, 1, 1, 2, 2, 3, 4])
    steps = []
    for index in range(n_steps):
        sees = tuple(range(index)) if rng.random() < 0.7 else ()
        steps.append(Step(rng.choice(WORKERS), rng.choice(SUBTASKS), sees))
    form = rng.choice(["lists", "lists", "lists", "json"])
    block = render_workflow(Workflow(tuple(steps)), WORKERS, form=form, by_index=rng.random() < 0.6)
    if rng.random() < 0.5:
        block = f"```{'json' if form == 'json' else 'python'}\n{block}\n```"
    return block


FAILURES = [
    lambda rng, block: "",  # reasoning only: no_workflow
    lambda rng, block: '{"steps": [{"worker": 0, "subtask": "Solve it.", "sees": [],}]}',  # json_decode
    lambda rng, block: "model_id = [0, 1]\nsubtasks = ['Solve it.']\naccess_list = [[], 'all']",  # length_mismatch
    lambda rng, block: "model_id = [9]\nsubtasks = ['Solve it.']\naccess_list = [[]]",  # unknown_worker
    lambda rng, block: block[: len(block) // 2],  # cut off mid-block (max tokens)
    lambda rng, block: "model_id = [0, 1]\nsubtasks = ['Solve.', 'Check.']\naccess_list = [[], [1]]",  # forward_dep
]


def make_outputs(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    outputs = []
    for _ in range(n):
        block = _valid_block(rng)
        if rng.random() < 0.15:
            block = rng.choice(FAILURES)(rng, block)
        outputs.append(f"{_reasoning(rng)}\n\n{block}")
    return outputs


_NAIVE = re.compile(r"(model_id|subtasks|access_list)\s*=\s*(\[.*?\])\s*$", re.M | re.S)


def naive_baseline(text: str) -> bool:
    """Regex + ast.literal_eval, no validation: what a quick script would do."""
    found = {}
    for name, literal in _NAIVE.findall(text):
        try:
            found[name] = ast.literal_eval(literal)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
    return len(found) == 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000, help="parses to time")
    parser.add_argument("--distinct", type=int, default=10_000, help="distinct outputs, cycled to reach n")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    outputs = make_outputs(args.distinct, args.seed)
    texts = [outputs[i % len(outputs)] for i in range(args.n)]
    mean_chars = sum(map(len, outputs)) / len(outputs)

    codes: Counter[str] = Counter()
    start, start_cpu = time.perf_counter(), time.process_time()
    for text in texts:
        try:
            parse_workflow(text, WORKERS)
            codes[PARSE_OK] += 1
        except WorkflowParseError as exc:
            codes[exc.code] += 1
    strict_s, strict_cpu = time.perf_counter() - start, time.process_time() - start_cpu

    start, start_cpu = time.perf_counter(), time.process_time()
    for text in texts:
        naive_baseline(text)
    naive_s, naive_cpu = time.perf_counter() - start, time.process_time() - start_cpu

    print(f"{args.n} outputs ({len(outputs)} distinct, mean {mean_chars:.0f} chars)")
    # CPU time next to wall time: on a shared machine the wall clock also counts other people's work.
    print("                               wall s   cpu s   us/output (cpu)")
    print(f"parse_workflow (strict):      {strict_s:6.2f}  {strict_cpu:6.2f}   {strict_cpu / args.n * 1e6:6.1f}   target < 5 s")
    print(f"regex + ast.literal_eval:     {naive_s:6.2f}  {naive_cpu:6.2f}   {naive_cpu / args.n * 1e6:6.1f}   (no validation)")
    print(f"ratio strict / naive (cpu):   {strict_cpu / naive_cpu:6.2f}")
    print("codes:", ", ".join(f"{code} {count / args.n:.1%}" for code, count in codes.most_common()))


if __name__ == "__main__":
    main()
