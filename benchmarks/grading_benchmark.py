"""Re-grade ZeroEval's recorded GSM8K and MATH level-5 responses: project grader vs plain math-verify.

Usage: python -m benchmarks.grading_benchmark [--limit N] [--baseline-sample 3000] [--full-baseline]
       [--processes 2] [--baseline-processes 1]

Prints, side by side in one run:
- responses/s of ``grade_many`` (extraction + fast paths + cache + math-verify worker pool) and of
  plain math-verify (``verify(parse(gold), parse(answer))`` on the same extracted answers, run
  sequentially unless --baseline-processes says otherwise), the speed ratio, and how often the two verdicts agree;
- the project's verdicts against the recording's own ``ze_matched`` (a first-number grader), by
  category of disagreement with counts and examples.
The plain baseline costs ~10 ms a response, so by default it runs on a fixed random sample.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import random
import re
import time
from collections import Counter, defaultdict

import polars as pl

from conductor_pipeline.corpora.sources import resolve_data_file
from conductor_pipeline.grading import grade_many, is_equivalent, normalize_gold
from conductor_pipeline.grading.equivalence import _canonical, _latex_for_parse

TELEMETRY_FILE = resolve_data_file("zeroeval_outputs")  # the registry's file, sha256-checked
SAMPLE_SEED = 20240924  # fixed so the baseline sample is the same rows in every run
EXAMPLES_PER_CATEGORY = 2


def load_rows(limit: int | None) -> pl.DataFrame:
    frame = pl.read_parquet(
        TELEMETRY_FILE,
        columns=["benchmark", "model_file", "output", "answer", "ze_matched", "ze_no_answer", "ze_model_answer_raw"],
    )
    frame = frame.with_row_index("row")
    if limit is not None and limit < frame.height:
        frame = frame.sample(n=limit, seed=SAMPLE_SEED).sort("row")
    responses = [json.loads(output)[0] if output else None for output in frame["output"]]
    return frame.with_columns(pl.Series("response", responses, dtype=pl.String)).drop("output")


def _plain_verdict(pair: tuple[str, str, bool]) -> bool:
    """math-verify as documented, in a pool process's main thread (its signal timeouts work)."""
    from math_verify import parse, verify

    answer, gold, delimited = pair
    if delimited:
        answer, gold = _latex_for_parse(answer), _latex_for_parse(gold)
    try:
        return bool(verify(parse(gold), parse(answer)))
    except Exception:
        return False


def _silence_logs() -> None:
    import logging

    logging.disable(logging.CRITICAL)


def run_plain(pairs: list[tuple[str, str, bool]], processes: int) -> tuple[list[bool], float]:
    """Plain math-verify: in this process's main thread, or in a pool of ``processes``."""
    started = time.perf_counter()
    if processes <= 1:
        _silence_logs()
        verdicts = [_plain_verdict(pair) for pair in pairs]
    else:
        with multiprocessing.get_context("spawn").Pool(processes, initializer=_silence_logs) as pool:
            verdicts = pool.map(_plain_verdict, pairs, chunksize=16)
    return verdicts, time.perf_counter() - started


def first_number(text: str | None) -> str | None:
    match = re.search(r"-?\d[\d,]*(?:\.\d+)?", text or "")
    return match.group(0).replace(",", "") if match else None


def categorize(row: dict, extracted: str | None, project: bool) -> str:
    """Why the project's verdict differs from ZeroEval's first-number verdict."""
    gold = normalize_gold(row["answer"])
    ze_answer = row["ze_model_answer_raw"]
    same_answer = extracted is not None and ze_answer is not None and _canonical(extracted) == _canonical(ze_answer)
    if project:
        if row["ze_no_answer"]:
            return "project right: ZeroEval found no answer (boxed / prose / non-JSON response)"
        if not same_answer:
            return "project right?: answers read differently (JSON field vs later \\boxed / trailing text)"
        if first_number(extracted) != first_number(gold):
            return "project right: equivalent form, first numbers differ (e.g. 0.5 vs \\frac{1}{2}, 3360 after '40*21*4=')"
        return "project right: same first number but ZeroEval's comparison failed (format, sign, thousands)"
    if extracted is None:
        return "ZeroEval credits an answer the project does not extract"
    if not same_answer:
        if ze_answer is not None and is_equivalent(ze_answer, gold):
            return "ZeroEval right?: it read a different, correct answer (first JSON field vs our last/boxed)"
        return "ZeroEval wrong: it read a different answer whose first number coincides with the gold's"
    if first_number(extracted) == first_number(gold):
        return "ZeroEval wrong: first numbers coincide, answers differ (e.g. \\frac{1}{2} vs 1, 2\\sqrt{3} vs 2)"
    return "other"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=None, help="grade a fixed random subset of N responses")
    parser.add_argument("--baseline-sample", type=int, default=3000, help="rows graded by plain math-verify")
    parser.add_argument("--full-baseline", action="store_true", help="run plain math-verify on every row")
    parser.add_argument("--processes", type=int, default=2, help="math-verify workers of the project grader")
    parser.add_argument(
        "--baseline-processes", type=int, default=1,
        help="plain math-verify runs sequentially by default (a process pool is one of the project's levers)",
    )
    args = parser.parse_args()

    frame = load_rows(args.limit)
    responses = frame["response"].to_list()
    golds = frame["answer"].to_list()
    counts = frame.group_by("benchmark").len().sort("benchmark")
    print(f"rows: {frame.height} ({', '.join(f'{b}: {n}' for b, n in counts.iter_rows())})")

    started = time.perf_counter()
    grades = grade_many(responses, golds, processes=args.processes)
    project_s = time.perf_counter() - started
    project_rate = len(grades) / project_s
    print(f"project grader : {len(grades):6d} responses in {project_s:7.1f} s = {project_rate:8.0f} responses/s "
          f"({args.processes} worker processes; includes extraction and worker start-up)")

    if args.full_baseline:
        sample = list(range(frame.height))
        note = "all rows"
    else:
        sample = sorted(random.Random(SAMPLE_SEED).sample(range(frame.height), min(args.baseline_sample, frame.height)))
        note = f"fixed random sample of {len(sample)} rows (seed {SAMPLE_SEED}); full run too slow"
    pairs = [(grades[i].extracted or "", normalize_gold(golds[i]), True) for i in sample]
    plain, plain_s = run_plain(pairs, args.baseline_processes)
    plain_rate = len(sample) / plain_s
    print(f"plain math-verify: {len(sample):6d} responses in {plain_s:7.1f} s = {plain_rate:8.0f} responses/s "
          f"({args.baseline_processes} process(es); extraction not counted; {note})")
    print(f"speed ratio    : {project_rate / plain_rate:.1f}x")
    # An empty extraction is graded False by both; plain math-verify never sees None.
    plain = [verdict and grades[i].extracted is not None for verdict, i in zip(plain, sample)]
    agree = sum(grades[i].correct == verdict for verdict, i in zip(plain, sample))
    print(f"agreement with plain math-verify (same delimiters): {agree}/{len(sample)} = {agree / len(sample):.2%}")
    diffs = [(i, verdict) for verdict, i in zip(plain, sample) if grades[i].correct != verdict]
    for i, verdict in diffs[:10]:
        print(f"   differs: gold={normalize_gold(golds[i])!r} answer={grades[i].extracted!r} "
              f"project={grades[i].correct} plain={verdict}")

    verbatim_pairs = [(grades[i].extracted or "", normalize_gold(golds[i]), False) for i in sample]
    verbatim, _ = run_plain(verbatim_pairs, args.baseline_processes)
    verbatim = [verdict and grades[i].extracted is not None for verdict, i in zip(verbatim, sample)]
    agree_verbatim = sum(grades[i].correct == verdict for verdict, i in zip(verbatim, sample))
    print(f"agreement with verbatim verify(parse(gold), parse(answer)) (no $ delimiters; bare LaTeX unread): "
          f"{agree_verbatim}/{len(sample)} = {agree_verbatim / len(sample):.2%}")

    print("\naccuracy by benchmark (project vs ze_matched):")
    correct = pl.Series("project", [g.correct for g in grades])
    extracted_none = pl.Series("no_extract", [g.extracted is None for g in grades])
    summary = (
        frame.with_columns(correct, extracted_none)
        .group_by("benchmark")
        .agg(
            pl.len().alias("rows"),
            pl.col("project").mean().alias("project_acc"),
            pl.col("ze_matched").mean().alias("ze_acc"),
            pl.col("no_extract").mean().alias("project_no_answer"),
            pl.col("ze_no_answer").mean().alias("ze_no_answer"),
            (pl.col("project") == pl.col("ze_matched")).mean().alias("agreement"),
        )
        .sort("benchmark")
    )
    with pl.Config(tbl_rows=10, tbl_cols=10, float_precision=4):
        print(summary)

    categories: dict[str, list[int]] = defaultdict(list)
    for index, row in enumerate(frame.iter_rows(named=True)):
        if grades[index].correct != row["ze_matched"]:
            categories[categorize(row, grades[index].extracted, grades[index].correct)].append(index)
    by_benchmark = Counter()
    for name, indices in categories.items():
        for index in indices:
            by_benchmark[(name, frame["benchmark"][index])] += 1
    print(f"\ndisagreements with ze_matched: {sum(len(v) for v in categories.values())}")
    rng = random.Random(SAMPLE_SEED)
    for name, indices in sorted(categories.items(), key=lambda item: -len(item[1])):
        split = ", ".join(f"{b} {by_benchmark[(name, b)]}" for b in ("gsm", "math-l5") if by_benchmark[(name, b)])
        print(f"- {name}: {len(indices)} ({split})")
        for index in rng.sample(indices, min(EXAMPLES_PER_CATEGORY, len(indices))):
            row = frame.row(index, named=True)
            tail = (row["response"] or "")[-160:].replace("\n", "\\n")
            print(f"    gold={normalize_gold(row['answer'])!r} project_answer={grades[index].extracted!r} "
                  f"ze_answer={row['ze_model_answer_raw']!r} project={grades[index].correct} "
                  f"ze={row['ze_matched']} model={row['model_file']}\n      tail: ...{tail}")


if __name__ == "__main__":
    main()
