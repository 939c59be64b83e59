"""Grading: the final answer of a response, and whether it equals the gold. This is the reward.

`extraction` reads the answer out of hostile text with regexes and brace counting (nothing is
evaluated); `equivalence` compares it with the gold through exact fast paths, then math-verify in
supervised worker processes that are killed on timeout. Every accuracy, pass rate, gate figure and
training reward in the pipeline goes through `grade` / `grade_many`. Every verdict written to the
warehouse carries `GRADER_VERSION`; `regrade` re-grades stored responses when it changes.
"""

from conductor_pipeline.grader_version import GRADER_VERSION
from conductor_pipeline.grading.equivalence import (
    DEFAULT_TIMEOUT_S,
    Grade,
    grade,
    grade_many,
    is_equivalent,
    math_verify_verdict,
    warm_up,
)
from conductor_pipeline.grading.extraction import RULES, Reading, extract_answer, normalize_gold, read_answer

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "GRADER_VERSION",
    "RULES",
    "Grade",
    "Reading",
    "extract_answer",
    "grade",
    "grade_many",
    "is_equivalent",
    "math_verify_verdict",
    "normalize_gold",
    "read_answer",
    "warm_up",
]
