"""Which verdicts a grader change flips: the grader at a git revision vs the working tree.

Usage: python -m benchmarks.grading_flips --old-ref REV [--limit N] [--examples 3] [--processes 2]

Both graders grade every recorded ZeroEval response (the rows of grading_benchmark.py). The old
one runs from `git archive REV conductor_pipeline` in a child process (its own math-verify
workers), the new one in this process. Prints how many verdicts flip, in which direction, per
benchmark, classified by the extraction rule that now reads the answer (`read_answer`), with
examples; and how many answers are read differently without changing the verdict.
"""

from __future__ import annotations

import argparse
import os
import random
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl

ROOT = Path(__file__).resolve().parent.parent

from benchmarks.grading_benchmark import SAMPLE_SEED, load_rows
from conductor_pipeline.grading import grade_many, normalize_gold, read_answer

# Runs in the child process, whose PYTHONPATH holds the old revision's package.
OLD_GRADER = """
import sys, polars as pl
from conductor_pipeline.grading import grade_many
frame = pl.read_parquet(sys.argv[1])
grades = grade_many(frame["response"].to_list(), frame["answer"].to_list(), processes=int(sys.argv[3]))
pl.DataFrame({"extracted": [g.extracted for g in grades], "correct": [g.correct for g in grades]},
             schema={"extracted": pl.String, "correct": pl.Boolean}).write_parquet(sys.argv[2])
"""
# What each rule of `read_answer` means, as a flip class.
RULE_CLASSES = {
    "boxes": "several boxes read together as one answer",
    "final_answer_after_box": "a final-answer sentence after the last box wins over the box",
    "closing_span": "a math span closing the response (no box, no marker)",
    "bare": "a response that is only a short answer",
    "phrase": "a trailing 'final answer is X' / 'Answer: X' read up to its full stop",
}
SAME_ANSWER_CLASS = "same answer, equivalence changed (e.g. '2, 500' is a list, not 2500)"


def grade_with_old(frame: pl.DataFrame, ref: str, processes: int) -> tuple[pl.DataFrame, float]:
    """(extracted, correct) of the grader at `ref`, graded in a child process; and its seconds."""
    with tempfile.TemporaryDirectory(prefix="old-grader-") as folder:
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", ref, "conductor_pipeline/__init__.py", "conductor_pipeline/grading"],
            check=True, capture_output=True,
        ).stdout
        subprocess.run(["tar", "-x", "-C", folder], input=archive, check=True)
        rows, graded = Path(folder) / "rows.parquet", Path(folder) / "graded.parquet"
        frame.select("response", "answer").write_parquet(rows)
        started = time.perf_counter()
        subprocess.run(
            [sys.executable, "-c", OLD_GRADER, str(rows), str(graded), str(processes)],
            check=True, env={**os.environ, "PYTHONPATH": folder}, cwd=folder,
        )
        return pl.read_parquet(graded), time.perf_counter() - started


def classify(old_answer: str | None, new_answer: str | None, rule: str) -> str:
    if old_answer == new_answer:
        return SAME_ANSWER_CLASS
    return RULE_CLASSES.get(rule, f"answer read differently (rule {rule})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--old-ref", required=True, help="git revision of the grader to compare with")
    parser.add_argument("--limit", type=int, default=None, help="a fixed random subset of N responses")
    parser.add_argument("--examples", type=int, default=3, help="examples printed per class")
    parser.add_argument("--processes", type=int, default=2, help="math-verify workers of each grader")
    args = parser.parse_args()

    frame = load_rows(args.limit)
    old, old_s = grade_with_old(frame, args.old_ref, args.processes)
    responses, golds = frame["response"].to_list(), frame["answer"].to_list()
    started = time.perf_counter()
    new = grade_many(responses, golds, processes=args.processes)
    new_s = time.perf_counter() - started
    rules = [read_answer(response).rule for response in responses]
    print(f"rows: {frame.height}; old grader ({args.old_ref}) {old_s:.1f} s, new grader {new_s:.1f} s")

    print("rules that read the answers now: " + ", ".join(f"{rule} {n}" for rule, n in Counter(rules).most_common()))

    flips: dict[str, list[int]] = defaultdict(list)
    reread: dict[str, list[int]] = defaultdict(list)
    for index, (old_answer, old_correct) in enumerate(old.iter_rows()):
        graded = new[index]
        if graded.correct != old_correct:
            flips[classify(old_answer, graded.extracted, rules[index])].append(index)
        elif graded.extracted != old_answer:
            reread[classify(old_answer, graded.extracted, rules[index])].append(index)
    benchmarks = frame["benchmark"].to_list()

    def show(rows: list[int]) -> None:
        for index in random.Random(SAMPLE_SEED).sample(rows, min(args.examples, len(rows))):
            tail = (responses[index] or "")[-160:].replace("\n", "\\n")
            print(f"    gold={normalize_gold(golds[index])!r} old={old['extracted'][index]!r} "
                  f"new={new[index].extracted!r} now {'correct' if new[index].correct else 'wrong'} "
                  f"model={frame['model_file'][index]}\n      tail: ...{tail}")

    total = sum(len(rows) for rows in flips.values())
    gained = sum(new[i].correct for rows in flips.values() for i in rows)
    print(f"verdict flips: {total} ({gained} wrong -> correct, {total - gained} correct -> wrong)")
    for name, rows in sorted(flips.items(), key=lambda item: -len(item[1])):
        up = sum(new[i].correct for i in rows)
        split = Counter(benchmarks[i] for i in rows)
        print(f"- {name}: {len(rows)} ({up} wrong -> correct, {len(rows) - up} correct -> wrong; "
              f"{', '.join(f'{b} {n}' for b, n in sorted(split.items()))})")
        show(rows)
    print(f"answers read differently, same verdict: {sum(len(rows) for rows in reread.values())}")
    for name, rows in sorted(reread.items(), key=lambda item: -len(item[1])):
        print(f"- {name}: {len(rows)}")
        show(rows)


if __name__ == "__main__":
    main()
