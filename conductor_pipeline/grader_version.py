"""The grader's version: recorded with every verdict, so verdicts of different graders never mix.

Outside `grading/` so that the records stamp it without loading the grader (extraction,
math-verify workers).

Bump it whenever a change to extraction or equivalence can change a verdict, and set the same
value as the `grader_version` column default in sql/schema.sql; rows graded before the bump are
then reported as stale until `python -m conductor_pipeline.grading.regrade` re-grades them.
Version 1 is every verdict written before versions were recorded.
"""

from __future__ import annotations

GRADER_VERSION = "2"


def grader_of(correct: bool | None, recorded: str | None) -> str | None:
    """The grader version a row records: as given, else the current grader's when there is a
    verdict (a record built now was graded by today's rules), else none."""
    if recorded is not None or correct is None:
        return recorded
    return GRADER_VERSION
