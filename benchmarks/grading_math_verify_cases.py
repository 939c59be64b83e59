"""The project grader on math-verify's own regression cases, read at run time from a checkout.

Usage: python -m benchmarks.grading_math_verify_cases --tests-dir PATH/TO/Math-Verify/tests [--max-gold 80]

Nothing of math-verify's test suite is stored in this repository: the cases are read from the
given folder with `ast.literal_eval` (literals only, nothing is imported or run). A case is kept
when its test function is a single `assert compare_strings(gold, pred[, match_types=[... "latex"
...]]) == expected` (the default precision and strictness, LaTeX read) and its gold has at most
`--max-gold` characters. For each case it compares with the suite's expectation:

- plain math-verify: `verify(parse(gold), parse(pred))` with the library's defaults;
- the project grader: `is_equivalent(extract_answer(pred), gold)`, as the pipeline grades;
- the project grader fed the whole text when it extracts nothing (`extract_answer(pred) or pred`),
  the way a caller who skips extraction would use `is_equivalent`.

and prints every case where one of them disagrees with the suite.
"""

from __future__ import annotations

import argparse
import ast
import logging
from pathlib import Path

from conductor_pipeline.grading import is_equivalent, read_answer, warm_up

ASSERT_PREFIX = "assert compare_strings(gold, pred"
# Keyword arguments that move a case away from the default verification settings.
NON_DEFAULT_SETTINGS = ("precision", "strict", "allow_set_relation_comp")


def load_cases(tests_dir: Path, max_gold: int) -> list[tuple[str, str, str, bool]]:
    """(test name, gold, pred, expected) of the default-setting cases in `tests_dir`."""
    cases = []
    for path in sorted(tests_dir.glob("test_*.py")):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef) or len(node.body) != 1:
                continue
            statement = ast.unparse(node.body[0])
            if (
                not statement.startswith(ASSERT_PREFIX)
                or any(setting in statement for setting in NON_DEFAULT_SETTINGS)
                or ("match_types" in statement and "'latex'" not in statement)
            ):
                continue
            for decorator in node.decorator_list:
                if isinstance(decorator, ast.Call) and ast.unparse(decorator.func).endswith("parametrize"):
                    for gold, pred, expected in ast.literal_eval(decorator.args[1]):
                        if len(gold) <= max_gold:
                            cases.append((f"{path.stem}::{node.name}", gold, pred, bool(expected)))
    return cases


def plain_verdict(gold: str, pred: str) -> bool:
    from math_verify import parse, verify  # noqa: PLC0415 (only this script needs it in-process)

    try:
        return bool(verify(parse(gold), parse(pred)))
    except Exception:
        return False


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tests-dir", required=True, type=Path, help="the tests/ folder of a math-verify checkout")
    parser.add_argument("--max-gold", type=int, default=80, help="longest gold answer kept")
    args = parser.parse_args()
    logging.disable(logging.CRITICAL)
    cases = load_cases(args.tests_dir, args.max_gold)
    if not cases:
        raise SystemExit(f"no default-setting cases found under {args.tests_dir}")
    warm_up(1)
    labels = {
        "plain": "plain math-verify",
        "grader": "project grader",
        "grader_or_text": "project grader, whole text when nothing extracted",
    }
    scores = dict.fromkeys(labels, 0)
    for name, gold, pred, expected in cases:
        reading = read_answer(pred)
        verdicts = {
            "plain": plain_verdict(gold, pred),
            "grader": is_equivalent(reading.answer, gold),
            "grader_or_text": is_equivalent(reading.answer or pred, gold),
        }
        for key, verdict in verdicts.items():
            scores[key] += verdict == expected
        if any(verdict != expected for verdict in verdicts.values()):
            shown = " ".join(f"{key}={verdict}" for key, verdict in verdicts.items())
            print(f"[{name}] expected={expected} {shown} read={reading.answer!r} ({reading.rule}) gold={gold!r}\n"
                  f"    pred tail: {pred[-160:]!r}")
    print(f"\n{len(cases)} cases (gold <= {args.max_gold} chars, default settings)")
    for key, label in labels.items():
        print(f"{label:52s}: {scores[key]}/{len(cases)} match the suite")


if __name__ == "__main__":
    main()
