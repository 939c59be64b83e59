"""What the conductor is told: W's train-split predictions next to the catalogue (both namings,
top level and recursion), and worker-visibility rules that match the orchestrator's setting."""

from __future__ import annotations

import asyncio
import re

import pytest

from conductor_pipeline.conductor.prompt import build_conductor_prompt, build_recursion_prompt
from conductor_pipeline.evaluation.arms import ConductorArm
from conductor_pipeline.splits import split_of
from conductor_pipeline.world_model.model import WorldModel, fit_on_train_split
from conductor_pipeline.world_model.prompts_and_pruning import prompt_predictor
from tests.builders import (
    FAST_WORLD_MODEL,
    SAMPLE_QUESTION,
    RecordingWorker,
    ScriptedPolicy,
    lists,
    make_pool,
    orchestrate,
    seat,
    specialist_skill,
    synthetic_frame,
    synthetic_questions,
    synthetic_seats,
)

PREDICTION_RE = re.compile(r"^- (.+?): .*\(predicted success on this question: (\d+)%\)$", re.MULTILINE)
SEES_QUESTION = "A worker sees the original task, its own subtask"
SEES_SUBTASK_ONLY = "A worker sees only its own subtask"


@pytest.fixture(scope="module")
def questions():
    return synthetic_questions(240, seed=5)


@pytest.fixture(scope="module")
def train_w(questions) -> WorldModel:
    return fit_on_train_split(synthetic_frame(questions, specialist_skill, seed=6), synthetic_seats(), FAST_WORLD_MODEL)


def _pool_with_conductor():
    synthetic = list(synthetic_seats().values())
    return make_pool(*synthetic, seat("self", backend="conductor")), synthetic


@pytest.mark.parametrize("naming", ["ordinal", "names"])
def test_the_conductor_prompt_carries_the_train_split_ws_numbers(questions, train_w, naming):
    pool, synthetic = _pool_with_conductor()
    workers = {s.name: RecordingWorker(s.name) for s in synthetic}
    question = next(q for q in questions if split_of(q.question_id) == "eval")
    assert question.question_id not in train_w.training_question_ids
    policy = ScriptedPolicy([lists([0], ["Solve it."], [[]])])
    arm = ConductorArm("w", policy, naming=naming, predicted_success=prompt_predictor(train_w, pool.workers))

    async def main():
        orch = orchestrate(pool, workers, naming=naming, conductor_policy=policy)
        await arm.answer(orch, question, run_id="r", repeat=0)
        return orch

    orch = asyncio.run(main())
    system = policy.calls[0][0]["content"]  # what the policy was really sent
    shown = dict(PREDICTION_RE.findall(system))
    expected = train_w.predict_success([question], synthetic)[0]
    displayed = orch.displayed_names[: len(synthetic)]
    assert displayed == ([f"Model {i}" for i in range(len(synthetic))] if naming == "ordinal" else [s.name for s in synthetic])
    assert shown == {name: f"{p:.0%}".rstrip("%") for name, p in zip(displayed, expected)}
    assert orch.displayed_names[-1] not in shown  # the conductor seat gets no number


def test_predictions_keyed_by_displayed_ordinal_names_are_shown_too():
    catalogue = [("alpha", "first"), ("beta", "second")]
    (system, _) = build_conductor_prompt("q?", catalogue, predicted_success={"Model 1": 0.25})
    assert "- Model 1: second (predicted success on this question: 25%)" in system["content"]
    assert "- Model 0: first\n" in system["content"]


def test_without_the_option_no_numbers_are_shown(questions):
    pool, synthetic = _pool_with_conductor()
    orch = orchestrate(pool, {s.name: RecordingWorker(s.name) for s in synthetic}, conductor_policy=ScriptedPolicy([""]))
    system = ConductorArm("plain", ScriptedPolicy([""])).prompt(orch, questions[0])[0]["content"]
    assert "predicted success" not in system


@pytest.mark.parametrize("include_question", [True, False])
def test_the_rules_say_what_the_orchestrator_shows_workers(include_question):
    pool = make_pool(seat("a"), seat("self", backend="conductor"))
    worker = RecordingWorker("a")
    policy = ScriptedPolicy(["model_id = []\nsubtasks = []\naccess_list = []"])
    orch = orchestrate(pool, {"a": worker}, include_question=include_question, conductor_policy=policy,
                       predicted_success=lambda q: {"a": 0.5})
    system = ConductorArm("c", policy).prompt(orch, SAMPLE_QUESTION)[0]["content"]
    assert (SEES_QUESTION in system) is include_question
    assert (SEES_SUBTASK_ONLY in system) is not include_question

    async def main():
        return await orch.run_workflow_text(SAMPLE_QUESTION, lists([0, 1], ["Compute it.", "Check."], [[], "all"]),
                                            conductor_name="c", run_id="r", arm="c")

    asyncio.run(main())
    # What the worker really saw matches what the rules promised.
    assert (SAMPLE_QUESTION.problem in worker.requests[0].messages[-1].content) is include_question
    recursion_system = policy.calls[0][0]["content"]
    assert (SEES_QUESTION in recursion_system) is include_question
    assert "- Model 0: worker a (predicted success on this question: 50%)" in recursion_system


def test_prompt_builders_default_to_the_orchestrators_default():
    (system, _) = build_conductor_prompt("q?", [("a", "A")])
    assert SEES_QUESTION in system["content"]
    (system, _) = build_recursion_prompt("q?", [("a", "A")], "model_id = [0]", "7", workers_see_question=False)
    assert SEES_SUBTASK_ONLY in system["content"]
