"""The conductor's prompt: format rules, the worker catalogue, in-context examples, the question.

Workers are shown either by their real names or, as in the Conductor paper, by ordinal names
"Model 0..k" (`naming="ordinal"`), so a policy trained on randomised pools learns routing from the
descriptions rather than from brand names. The parser must then be given the *displayed* names
(`displayed_worker_names`); the orchestrator maps a parsed step back to a seat by position.

The in-context examples come from tasks other than math word problems: the paper found four such
examples worth +7 points on MATH500, because they teach the format and the decomposition style
without leaking a math recipe. Their workers are positions into whatever catalogue is shown,
wrapped around its size, since an example teaches form, not which worker is good.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Literal, NamedTuple

from pydantic import BaseModel, ConfigDict, Field, model_validator

from conductor_pipeline.files import parse_yaml
from conductor_pipeline.paths import DATA_DIR
from conductor_pipeline.records import Question
from conductor_pipeline.workflow import DEFAULT_MAX_STEPS, Step, Workflow, render_workflow

Naming = Literal["names", "ordinal"]

PROMPT_EXAMPLES_PATH = DATA_DIR / "prompt_examples.yaml"
DEFAULT_EXAMPLE_COUNT = 4  # the paper's k: four examples from other tasks
ORDINAL_PREFIX = "Model "  # the paper's anonymous worker names: "Model 0", "Model 1", ...


class CatalogueEntry(NamedTuple):
    """One worker as the conductor sees it. A plain (name, description) tuple works too."""

    name: str
    description: str


class ExampleStep(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    worker: int = Field(ge=0, description="Position in the shown catalogue, wrapped around its size")
    subtask: str = Field(min_length=1)
    sees: Literal["all"] | tuple[int, ...] = Field((), description='"all" or indices of earlier steps')


class PromptExample(BaseModel):
    """One in-context example: a question from another task and the workflow a good conductor wrote."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    task: str = Field(description="Where the example comes from (coding, science QA, ...); not shown")
    question: str = Field(min_length=1)
    reasoning: str = Field("", description="The short thinking shown before the lists")
    steps: tuple[ExampleStep, ...] = Field(min_length=1, max_length=DEFAULT_MAX_STEPS)

    @model_validator(mode="after")
    def _earlier_steps_only(self) -> PromptExample:
        for index, step in enumerate(self.steps):
            if step.sees != "all" and any(i >= index for i in step.sees):
                raise ValueError(f"step {index} of example {self.question[:40]!r} sees a later step")
        return self

    def workflow(self, displayed: Sequence[str]) -> Workflow:
        """This example's workflow over the displayed names (positions wrap around)."""
        steps = []
        for index, step in enumerate(self.steps):
            sees = tuple(range(index)) if step.sees == "all" else tuple(sorted(set(step.sees)))
            steps.append(Step(displayed[step.worker % len(displayed)], step.subtask, sees))
        return Workflow(tuple(steps))


@lru_cache(maxsize=4)
def load_prompt_examples(path: Path = PROMPT_EXAMPLES_PATH) -> tuple[PromptExample, ...]:
    """All examples in a YAML file (a list under `examples:`), validated."""
    raw = parse_yaml(path.read_text())
    return tuple(PromptExample.model_validate(item) for item in raw["examples"])


def default_examples(k: int = DEFAULT_EXAMPLE_COUNT) -> list[PromptExample]:
    """The first k shipped examples (data/prompt_examples.yaml)."""
    examples = load_prompt_examples()
    if not 0 <= k <= len(examples):
        raise ValueError(f"k must be in 0..{len(examples)}, got {k}")
    return list(examples[:k])


CatalogueLike = Sequence[CatalogueEntry | tuple[str, str] | str]


def as_catalogue(catalogue: CatalogueLike) -> list[CatalogueEntry]:
    """Entries from entries, (name, description) pairs, or bare names (shown without a description)."""
    return [CatalogueEntry(entry, "") if isinstance(entry, str) else CatalogueEntry(*entry) for entry in catalogue]


def displayed_worker_names(catalogue: CatalogueLike, naming: Naming) -> list[str]:
    """The names the conductor sees, in catalogue order: give these to `parse_workflow`."""
    entries = as_catalogue(catalogue)
    if naming == "ordinal":
        return [f"{ORDINAL_PREFIX}{i}" for i in range(len(entries))]
    if naming == "names":
        return [entry.name for entry in entries]
    raise ValueError(f"naming must be 'names' or 'ordinal', got {naming!r}")


# Beside a trained policy's weights: how it was prompted and sampled in training (naming, in-context
# examples, completion cap, temperature, W's numbers), so any later evaluation prompts it the same way.
TRAINED_PROMPT_FILE = "conductor_prompt.json"
# The conductor's default completion cap: room for reasoning plus the workflow lists.
DEFAULT_MAX_NEW_TOKENS = 1024


class PromptSpec(BaseModel):
    """How a conductor is prompted and sampled: what training used (the recipe's `prompt`) is written
    beside the weights (`write_trained_prompt`) and read back whole by the eval, so a checkpoint is
    evaluated on any pool exactly as it was trained. Fields a record predates take these defaults
    (a checkpoint trained before fan-outs existed is prompted without them)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    naming: Naming = Field("ordinal", description="Workers shown as 'Model 0..k' (the paper's) or by name")
    n_examples: int = Field(DEFAULT_EXAMPLE_COUNT, ge=0, description="In-context example workflows in the prompt")
    max_new_tokens: int = Field(DEFAULT_MAX_NEW_TOKENS, ge=1, description="Token cap on a sampled workflow")
    temperature: float = Field(1.0, ge=0, description="Sampling temperature (0: greedy)")
    show_predicted_success: bool = Field(
        False, description="Each catalogue line shows the world model's P(success) of its worker on the question"
    )
    ranked_catalogue: bool = Field(
        False,
        description="List the workers by the world model's P(success) on the question, highest first, so a "
        "position means the same thing in every pool (needs show_predicted_success)",
    )
    constrained_decoding: bool = Field(
        False, description="Sample only workflows that parse against the catalogue the prompt shows"
    )
    fan_outs_only: bool = Field(
        False, description="With constrained decoding and a vote seat: a multi-step workflow is a fan-out the vote closes"
    )

    @model_validator(mode="after")
    def _ranked_by_shown_numbers(self) -> PromptSpec:
        if self.ranked_catalogue and not self.show_predicted_success:
            raise ValueError("ranked_catalogue orders the workers by W's numbers: it needs show_predicted_success")
        return self


def write_trained_prompt(folder: str | Path, prompt: PromptSpec) -> Path:
    """Record how the policy saved in (or under) `folder` was prompted in training."""
    from conductor_pipeline.files import write_json_atomic

    return write_json_atomic(Path(folder) / TRAINED_PROMPT_FILE, prompt.model_dump(), "training prompt")


def read_trained_prompt(model_dir: str | Path) -> PromptSpec | None:
    """How the policy in `model_dir` was trained to be prompted: its own record, or its run
    folder's (a GRPO checkpoint-N sits in the run's folder); None when neither has one. A record
    this code cannot read (an unknown field, a bad value) is refused, naming the file."""
    from conductor_pipeline.files import DamagedArtifactError, read_json_checked

    for folder in (Path(model_dir), Path(model_dir).parent):
        path = folder / TRAINED_PROMPT_FILE
        if path.is_file():
            try:
                return PromptSpec.model_validate(read_json_checked(path, "training prompt"))
            except ValueError as exc:
                raise DamagedArtifactError(f"{path}: not a training prompt this code can read: {exc}") from exc
    return None


# How many leading words of a worker's description name it (enough to tell "Meta Llama 3.1 8B" from
# "Meta Llama 3.1 405B"): what a conductor can copy from the catalogue to say whom it picks.
LABEL_WORDS = 4


def worker_label(entry: CatalogueEntry) -> str:
    """A worker's name as the catalogue shows it: the first words of its description, up to the
    first parenthesis or comma (its name when it has no description)."""
    head = re.split(r"[(,;]", entry.description, maxsplit=1)[0]
    words = head.split()[:LABEL_WORDS] or [entry.name]
    return " ".join(words)


def rank_by_predicted_success(names: Sequence[str], predicted_success: Mapping[str, float]) -> list[str]:
    """`names` by W's P(success), highest first; ties (and workers W has no number for, last) keep
    their given order, so a shuffled pool breaks ties at random and a file's order is kept."""
    position = {name: index for index, name in enumerate(names)}
    return sorted(names, key=lambda name: (-predicted_success.get(name, -1.0), position[name]))


def catalogue_from_pool(pool: object) -> list[CatalogueEntry]:
    """Catalogue entries of a `PoolConfig`'s seats, in pool order."""
    return [CatalogueEntry(seat.name, seat.description) for seat in pool.workers]  # type: ignore[attr-defined]


def _question_text(question: str | Question) -> str:
    return question.problem if isinstance(question, Question) else question


def _catalogue_lines(
    entries: Sequence[CatalogueEntry], displayed: Sequence[str], predicted_success: Mapping[str, float] | None
) -> str:
    lines = []
    for entry, shown in zip(entries, displayed, strict=True):
        line = f"- {shown}: {entry.description}" if entry.description else f"- {shown}"
        # Keyed by the entry's real name (what the world model scores) or by the name displayed.
        predicted = None if predicted_success is None else predicted_success.get(entry.name, predicted_success.get(shown))
        if predicted is not None:
            line += f" (predicted success on this question: {predicted:.0%})"
        lines.append(line)
    return "\n".join(lines)


def _worker_view(workers_see_question: bool) -> str:
    """What a worker is shown, matching the orchestrator's `include_question` setting."""
    if workers_see_question:
        return (
            "A worker sees the original task, its own subtask and the outputs of the earlier steps in its "
            "access entry, nothing else of the workflow."
        )
    return (
        "A worker sees only its own subtask and the outputs of the earlier steps in its access entry, nothing "
        "else (not the original task): put what it needs into its subtask."
    )


CATALOGUE_HEADER = "The workers:\n"
_PREDICTED_SUFFIX = re.compile(r" \(predicted success on this question: [^)]*\)$")
_STEP_RANGE = re.compile(r"A workflow has 1 to (\d+) steps")


def shown_catalogue(messages: Sequence[Mapping[str, object]]) -> tuple[list[str], int]:
    """(the worker names, the step limit) a conductor prompt of `build_conductor_prompt` shows,
    read back from its system message: what constrained decoding holds a completion to."""
    system = next((str(m["content"]) for m in messages if m.get("role") == "system"), None)
    if system is None or CATALOGUE_HEADER not in system:
        raise ValueError("the prompt has no system message with a worker catalogue (`The workers:`)")
    section = system.split(CATALOGUE_HEADER, 1)[1].split("\n\n", 1)[0]
    names = []
    for line in section.split("\n"):
        if line.startswith("- "):
            names.append(_PREDICTED_SUFFIX.sub("", line[2:]).split(": ", 1)[0])
    steps = _STEP_RANGE.search(system)
    if not names or steps is None:
        raise ValueError("the prompt's system message lists no workers or no step limit")
    return names, int(steps.group(1))


def _format_rules(displayed: Sequence[str], naming: Naming, max_steps: int, workers_see_question: bool) -> str:
    worker_ref = (
        f"worker numbers 0 to {len(displayed) - 1}" if naming == "ordinal" else "worker names, as quoted strings"
    )
    return f"""A workflow has 1 to {max_steps} steps, run in order. Each step gives one worker a subtask. \
{_worker_view(workers_see_question)} \
The last step's answer is the final answer, so the last subtask must ask for it in the required form.

Think briefly if you like, then end your reply with exactly three Python lists of equal length:
model_id = [...]     # {worker_ref}, one per step
subtasks = [...]     # one instruction per step, each a quoted string
access_list = [...]  # per step: [] (sees no earlier step), "all" (sees every earlier step) or a list of earlier step numbers
Steps are numbered from 0. The last lists in your reply are the ones that run, and they must be exact: a workflow \
that does not parse scores nothing."""


def _examples_block(examples: Sequence[PromptExample], displayed: Sequence[str], naming: Naming) -> str:
    parts = []
    for example in examples:
        lists = render_workflow(example.workflow(displayed), displayed, by_index=naming == "ordinal")
        reasoning = f"{example.reasoning.strip()}\n" if example.reasoning.strip() else ""
        parts.append(f"Task: {example.question.strip()}\n{reasoning}{lists}")
    return "\n\n".join(parts)


def _system_message(
    entries: Sequence[CatalogueEntry],
    naming: Naming,
    examples: Sequence[PromptExample],
    predicted_success: Mapping[str, float] | None,
    max_steps: int,
    extra_rules: str = "",
    workers_see_question: bool = True,
) -> str:
    displayed = displayed_worker_names(entries, naming)
    sections = [
        "You are the conductor of a team of language models. You never solve the task yourself: "
        "you read it and write a workflow that the workers carry out.",
        f"{CATALOGUE_HEADER}{_catalogue_lines(entries, displayed, predicted_success)}",
        _format_rules(displayed, naming, max_steps, workers_see_question),
    ]
    if extra_rules:
        sections.append(extra_rules)
    if examples:
        sections.append(
            "Examples from other tasks (the workers in them are this team's):\n\n"
            + _examples_block(examples, displayed, naming)
        )
    return "\n\n".join(sections)


def build_conductor_prompt(
    question: str | Question,
    catalogue: CatalogueLike,
    *,
    naming: Naming = "ordinal",
    examples: Sequence[PromptExample] = (),
    predicted_success: Mapping[str, float] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    workers_see_question: bool = True,
) -> list[dict[str, str]]:
    """Chat messages for the conductor: a system turn (rules, catalogue, examples) and the question.

    `predicted_success` maps a catalogue entry's `name` (or the name displayed for it: "Model i"
    under ordinal naming) to the world model's P(success) for this question; entries without a
    prediction show none. `workers_see_question` must be the orchestrator's `include_question`
    (default True, as there): the rules tell the conductor what its workers will be shown.
    """
    entries = as_catalogue(catalogue)
    system = _system_message(
        entries, naming, examples, predicted_success, max_steps, workers_see_question=workers_see_question
    )
    return [
        {"role": "system", "content": system},
        {"role": "user", "content": f"Task: {_question_text(question).strip()}"},
    ]


RECURSION_RULES = """You may also be asked to revise a workflow that already ran. Then, if the answer so far \
is right and complete, pass it through unchanged by writing three empty lists:
model_id = []
subtasks = []
access_list = []
Otherwise write a new workflow; its answer replaces the answer so far. Its workers do not see the earlier \
workflow or the answer so far: put what they need from them into their subtasks."""


def build_recursion_prompt(
    question: str | Question,
    catalogue: CatalogueLike,
    parent_workflow: str | Workflow,
    answer_so_far: str | None,
    *,
    naming: Naming = "ordinal",
    examples: Sequence[PromptExample] = (),
    predicted_success: Mapping[str, float] | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    workers_see_question: bool = True,
) -> list[dict[str, str]]:
    """The conductor called as a worker: it sees the parent workflow and the answer so far, and
    returns a new workflow or three empty lists (parse with `allow_empty=True`).

    `parent_workflow` is the text the parent conductor wrote, or a `Workflow` over the displayed
    names (rendered here as the lists the conductor would have written).
    """
    entries = as_catalogue(catalogue)
    if isinstance(parent_workflow, Workflow):
        displayed = displayed_worker_names(entries, naming)
        parent_text = render_workflow(parent_workflow, displayed, by_index=naming == "ordinal")
    else:
        parent_text = parent_workflow.strip()
    answer = answer_so_far.strip() if answer_so_far and answer_so_far.strip() else "(none: no answer was produced)"
    system = _system_message(
        entries, naming, examples, predicted_success, max_steps, extra_rules=RECURSION_RULES,
        workers_see_question=workers_see_question,
    )
    user = (
        f"Task: {_question_text(question).strip()}\n\n"
        f"This workflow already ran:\n{parent_text}\n\n"
        f"The answer so far:\n{answer}\n\n"
        "Pass the answer through with three empty lists, or write a new workflow."
    )
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]
