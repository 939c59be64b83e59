"""Agreement cascades: the arm stops when its first workers agree (paying only their calls), votes
over everyone otherwise, and the train-split choice replays exactly the rule the arm runs."""

from __future__ import annotations

import asyncio
import itertools

import polars as pl
import pytest

from conductor_pipeline.evaluation.arms import VoteArm, run_arm
from conductor_pipeline.evaluation.cascades import (
    AgreementCascade,
    CascadeArm,
    CascadeChoiceError,
    cascade_candidates,
    cascade_comparisons,
    cascade_stops,
    choose_cascades,
    replay_cascade,
)
from conductor_pipeline.evaluation.lineup import cascade_vote, eval_lineup
from conductor_pipeline.evaluation.routers import BestSingleChoice
from conductor_pipeline.records import Question
from conductor_pipeline.splits import split_of
from conductor_pipeline.warehouse import Warehouse
from tests.builders import RecordingWorker, make_pool, orchestrate, seat

HALF = Question(
    question_id="test/algebra/9.json", corpus="math", split="test", problem="Half of one?", answer="\\frac{1}{2}"
)
FIVE = ("a", "b", "c", "d", "e")
PAIR_FIRST = AgreementCascade(first=("a", "b"), then=("c", "d", "e"), quorum=2)


def run_cascade(tmp_path, answers: dict[str, str], cascade: AgreementCascade = PAIR_FIRST):
    workers = {name: RecordingWorker(name, answer=answer) for name, answer in answers.items()}
    warehouse = Warehouse(tmp_path / "w.duckdb")
    orchestrator = orchestrate(make_pool(*(seat(w) for w in answers)), workers, warehouse)
    (record,) = asyncio.run(run_arm(orchestrator, CascadeArm("t", cascade), [HALF], run_id="eval-cascade"))
    asyncio.run(orchestrator.aclose())
    called = warehouse.query("SELECT worker FROM calls WHERE workflow_id = $w", {"w": record.workflow_id})
    return record, sorted(called["worker"]), workers


def test_the_cascade_stops_when_its_first_workers_agree_and_pays_only_their_calls(tmp_path):
    # 0.5 and 1/2 agree by the grader: the three later workers (all saying 7) are never asked.
    record, called, workers = run_cascade(tmp_path, {"a": "0.5", "b": "1/2", "c": "7", "d": "7", "e": "7"})
    assert record.correct is True and record.final_answer == "0.5"
    assert record.workers == ["a", "b"] and record.n_steps == 2 and called == ["a", "b"]
    assert record.cost_usd == pytest.approx(2 * 0.001)
    assert not workers["c"].requests and not workers["e"].requests


def test_the_cascade_asks_everyone_and_votes_when_its_first_workers_disagree(tmp_path):
    # a and b disagree; over all five, 1/2 (a, e) ties 3 (b, c) and goes to a, asked first.
    record, called, _ = run_cascade(tmp_path, {"a": "1/2", "b": "3", "c": "3", "d": "7", "e": "0.5"})
    assert record.correct is True and record.n_steps == 5 and called == list(FIVE)
    assert record.cost_usd == pytest.approx(5 * 0.001)
    # Wrong agreement is final: the vote that would have fixed it is not asked.
    wrong, called, _ = run_cascade(tmp_path / "2", {"a": "3", "b": "3", "c": "1/2", "d": "1/2", "e": "1/2"})
    assert wrong.correct is False and called == ["a", "b"]


def test_a_quorum_of_two_in_three_stops_on_any_agreeing_pair(tmp_path):
    two_of_three = AgreementCascade(first=("a", "b", "c"), then=("d", "e"), quorum=2)
    record, called, _ = run_cascade(tmp_path, {"a": "3", "b": "1/2", "c": "0.5", "d": "3", "e": "3"}, two_of_three)
    assert record.correct is True and called == ["a", "b", "c"]  # b and c agree: d and e's 3s never count


@pytest.mark.parametrize("answers", [
    {"a": "0.5", "b": "1/2", "c": "7", "d": "7", "e": "7"},
    {"a": "1/2", "b": "3", "c": "3", "d": "7", "e": "0.5"},
    {"a": "3", "b": None, "c": "1/2", "d": "1/2", "e": "3"},
])
def test_the_replayed_rule_is_the_rule_the_arm_runs(tmp_path, answers):
    live, called, _ = run_cascade(tmp_path, {w: a if a is not None else "no answer here" for w, a in answers.items()})
    replayed = replay_cascade(PAIR_FIRST, {w: (a, a in ("1/2", "0.5"), 0.001) for w, a in answers.items()})
    assert (replayed.correct, replayed.calls) == (live.correct, len(called))
    assert replayed.cost_usd == pytest.approx(live.cost_usd)


def test_candidates_are_every_first_stage_of_two_or_three_and_every_quorum():
    candidates = cascade_candidates(FIVE)
    assert len(candidates) == 10 + 10 * 2  # pairs at quorum 2; triples at quorum 2 and 3
    assert all(c.workers == tuple(w for w in FIVE if w in c.first) + c.then for c in candidates)  # vote order kept
    assert len(cascade_candidates(("a", "b", "c"))) == 3  # three pairs; a triple would leave nobody to add
    with pytest.raises(ValueError, match="quorum"):
        AgreementCascade(first=("a", "b"), then=("c",), quorum=3)
    with pytest.raises(ValueError, match="once"):
        AgreementCascade(first=("a", "b"), then=("a",), quorum=2)


def ids_of_split(split: str, n: int) -> list[str]:
    return list(itertools.islice((q for i in range(10_000) if split_of(q := f"math/train/{i}.json") == split), n))


def probe_rows(question_ids, answers_of) -> list[dict]:
    costs = {"a": 0.001, "b": 0.002, "c": 0.010, "d": 0.010, "e": 0.010}
    return [
        {"question_id": qid, "worker": w, "extracted_answer": answer, "correct": answer == "1", "cost_usd": costs[w]}
        for i, qid in enumerate(question_ids) for w, answer in zip(FIVE, answers_of(i), strict=True)
    ]


def test_cascades_are_chosen_on_the_train_split_for_the_vote_accuracy_and_half_its_cost():
    # Easy questions (3 in 4): the cheap a and b agree and are right. Hard ones: a and b disagree,
    # and c, d, e carry the vote. The vote over all five is right everywhere.
    def answers_of(i: int) -> list[str]:
        return ["1", "1", "1", "1", "2"] if i % 4 else ["1", "2", "1", "1", "3"]

    train, evaluated = ids_of_split("train", 80), ids_of_split("eval", 40)
    frame = pl.DataFrame(probe_rows(train, answers_of) + probe_rows(evaluated, lambda i: ["2"] * 5))
    choices = {choice.label: choice for choice in choose_cascades(frame, VoteArm("all", FIVE))}
    as_vote, half = choices["as-vote"], choices["half-cost"]
    assert as_vote.questions == 80 and as_vote.vote_accuracy == 1.0  # the eval rows (all wrong) are not read
    assert as_vote.cascade.first == ("a", "b") and as_vote.cascade.quorum == 2
    assert as_vote.accuracy == 1.0 and as_vote.escalated_share == pytest.approx(0.25)
    assert as_vote.cost_per_question < half.vote_cost_per_question / 2
    assert half.cost_per_question <= half.vote_cost_per_question / 2 and half.accuracy == 1.0
    assert as_vote.goal_met and half.goal_met
    # Three workers at one price: every pair costs more than half their vote, so the cheapest (a and c,
    # who always agree) is kept and says it missed its goal.
    same_price = frame.with_columns(cost_usd=pl.lit(0.01))
    (missed,) = [c for c in choose_cascades(same_price, VoteArm("top3", ("a", "b", "c"))) if c.label == "half-cost"]
    assert not missed.goal_met and missed.cascade.first == ("a", "c") and missed.metadata()["goal_met"] is False
    assert missed.cost_per_question == pytest.approx(0.02)
    assert as_vote.metadata()["cascade"] == "a + b; 2 agree, or add c + d + e and vote"
    with pytest.raises(CascadeChoiceError, match="at least three"):
        choose_cascades(frame, VoteArm("two", ("a", "b")))
    with pytest.raises(CascadeChoiceError, match="no train-split question"):
        choose_cascades(pl.DataFrame(probe_rows(evaluated, lambda i: ["2"] * 5)), VoteArm("all", FIVE))


def test_the_cascades_vote_is_the_largest_best_k_vote_and_its_arms_follow_the_votes():
    ranked = ["c", "a", "d", "b", "e", "f"]
    assert cascade_vote(ranked, [3, 5]) == VoteArm("top5", ("c", "a", "d", "b", "e"))
    assert cascade_vote(ranked[:4], [3, 5]) == VoteArm("top3", ("c", "a", "d"))  # top5 would be every worker
    assert cascade_vote(ranked[:4], [5]) == VoteArm("all", tuple(ranked[:4]))  # no best-k vote: the vote over all
    choice = BestSingleChoice(worker="a", accuracies={"a": 0.8}, calibration_question_ids=frozenset())
    lineup = eval_lineup([seat(w) for w in "abcd"], choice, vote_top_k=[3],
                         agreement_cascades=[CascadeArm("as-vote", PAIR_FIRST)])
    assert lineup.names[-3:] == ["vote:all", "vote:top3", "cascade:as-vote"]


def test_cascade_stops_count_escalations_and_early_stops_right_and_wrong():
    workflows = pl.DataFrame({
        "arm": ["cascade:x"] * 4 + ["vote:all", "cascade:x"],
        "n_steps": [2, 2, 5, 5, 5, 2],
        "correct": [True, False, True, False, True, None],  # the last: an infrastructure failure
    })
    stops = cascade_stops(workflows, {"cascade:x": 2}).to_dicts()
    assert stops == [{"arm": "cascade:x", "workflows": 4, "escalated_share": 0.5, "stopped_right": 1, "stopped_wrong": 1}]
    assert cascade_stops(workflows, {}).height == 0


def test_cascades_are_paired_against_the_vote_they_stop_early_and_the_best_single_worker():
    n = 60
    scores = {"cascade:x": [1] * 40 + [0] * 20, "vote:top5": [1] * 41 + [0] * 19, "best_single": [1] * 20 + [0] * 40}
    workflows = pl.DataFrame([
        {"arm": arm, "question_id": f"q{i}", "correct": bool(v), "repeat": 0, "infra_failure": False}
        for arm, values in scores.items() for i, v in enumerate(values)
    ])
    rows = {(r["arm"], r["reference"]): r for r in cascade_comparisons(workflows, {"cascade:x": "vote:top5"}).to_dicts()}
    assert set(rows) == {("cascade:x", "vote:top5"), ("cascade:x", "best_single")} and rows[("cascade:x", "vote:top5")]["n_questions"] == n
    assert rows[("cascade:x", "vote:top5")]["verdict"] == "ties" and rows[("cascade:x", "best_single")]["verdict"] == "beats"
    assert rows[("cascade:x", "vote:top5")]["p_holm"] >= rows[("cascade:x", "vote:top5")]["p_value"]
