"""The grader's version: recorded with every verdict, so verdicts of different graders never mix.

Bump it whenever a change to extraction or equivalence can change a verdict, and set the same
value as the `grader_version` column default in sql/schema.sql; rows graded before the bump are
then reported as stale until `python -m conductor_pipeline.grading.regrade` re-grades them.
Version 1 is every verdict written before versions were recorded.
"""

GRADER_VERSION = "2"
