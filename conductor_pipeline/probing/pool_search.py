"""Is there a pool with real headroom? A search for workers whose competence is asymmetric.

A pool's oracle ceiling minus its own best single worker is the most any router can add on it.
Correlated generalists (strong workers that fail on the same questions) leave little of it;
specialists (each strong where the others are weak) leave much. The search:

1. Population: the questions given; candidates: workers with an outcome on at least
   `min_coverage` of them; scored rows: the questions every candidate answered (the oracle-ceiling
   SQL's coverage rule, applied once to all candidates, so every sub-pool is scored on the same
   questions). A worker's outcome on a question is the majority of its samples, as in `outcomes`.
2. On the TRAIN side of the project's question split: a beam search over sub-pools of sizes
   `min_size`..`max_size` maximising headroom = oracle - the sub-pool's best member's accuracy.
   Pairs are scored exhaustively; each larger size extends the `beam_width` best pools of the size
   below by one worker (`beam_width=1` is the greedy search).
3. On the EVAL side: each size's winner re-measured, with a bootstrap interval over questions (the
   best member re-chosen on each resample). A headroom found by searching is inflated by the search
   itself; only the eval figure says whether it holds out of sample.

Beside each pool: the null-pool headroom of its best member where that worker has several samples
per question (what resampling one model fakes), the mean pairwise correlation of the members'
outcomes, the cost per question of calling every member and of the best member alone, and a
subject-by-worker accuracy table that shows which worker wins where.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl
from pydantic import BaseModel, ConfigDict, Field

from conductor_pipeline.corpora.summaries import population_text
from conductor_pipeline.probing.ceilings import null_pool_table
from conductor_pipeline.probing.reports import null_pool_note
from conductor_pipeline.splits import split_of
from conductor_pipeline.stats import percentile_interval, question_resample_counts

ALL_CANDIDATES = "all candidates"  # label of the reference row holding every candidate worker


class PoolSearchSettings(BaseModel):
    """Knobs of the search (their descriptions are the Dagster config's help text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    min_size: int = Field(2, ge=2, description="Smallest sub-pool size searched")
    max_size: int = Field(6, ge=2, description="Largest sub-pool size searched")
    beam_width: int = Field(
        64, ge=1, description="Sub-pools of one size kept to extend to the next size (1: greedy search)"
    )
    min_coverage: float = Field(
        0.98, gt=0, le=1, description="Candidate workers answered at least this share of the population's questions"
    )
    min_worker_accuracy: float = Field(
        0.0, ge=0, le=1, description="Search only workers at least this accurate on the train split (0: all candidates)"
    )
    n_bootstrap: int = Field(1000, ge=10, description="Question resamples for the eval-split intervals")
    confidence: float = Field(0.95, gt=0, lt=1, description="Coverage of every interval")
    seed: int = Field(0, description="Seed of the bootstrap resamples")


class PoolSearchError(ValueError):
    """Too little data to search (names what is missing)."""


# --- the outcome matrix --------------------------------------------------------------------------


@dataclass(frozen=True)
class OutcomeMatrix:
    """Questions x candidate workers: majority outcome (0/1) and mean cost per call (NaN: none)."""

    question_ids: list[str]
    workers: list[str]
    correct: np.ndarray
    cost: np.ndarray
    tokens_estimated: bool
    is_eval: np.ndarray  # bool per question: the eval side of the project's split
    subject: np.ndarray  # subject (GSM8K: its corpus) per question
    samples: pl.DataFrame  # the sample-level outcomes of these questions and workers (null pools)
    excluded: dict[str, float]  # workers below min_coverage -> their coverage
    population: str  # the scored questions, by corpus, split and level


def outcome_matrix(
    sample_outcomes: pl.DataFrame,
    questions: pl.DataFrame,
    min_coverage: float,
    *,
    split_fn: Callable[[str], str] = split_of,
) -> OutcomeMatrix:
    """The matrix the search scores, from sample-level outcomes (question_id, worker, sample, correct,
    cost_usd, tokens_estimated) and the population's questions (question_id, corpus, subject, ...)."""
    scored = sample_outcomes.filter(
        pl.col("correct").is_not_null() & pl.col("question_id").is_in(questions["question_id"].implode())
    )
    per_pair = scored.group_by("question_id", "worker").agg(
        correct=2 * pl.col("correct").sum() > pl.len(),
        cost=pl.col("cost_usd").mean(),
        estimated=pl.col("tokens_estimated").fill_null(False).any(),
    )
    # Coverage counts against the questions someone answered: a slice question nobody was probed on
    # (or that no model was recorded on) says nothing about any worker.
    n_answered = per_pair["question_id"].n_unique()
    coverage = (
        per_pair.group_by("worker").agg(share=pl.len() / n_answered).sort("share", "worker", descending=[True, False])
    )
    candidates = sorted(coverage.filter(pl.col("share") >= min_coverage)["worker"].to_list())
    excluded = dict(coverage.filter(pl.col("share") < min_coverage).iter_rows())
    if len(candidates) < 2:
        shown = ", ".join(f"{w} {share:.0%}" for w, share in coverage.head(5).iter_rows())
        raise PoolSearchError(
            f"{len(candidates)} of {coverage.height} workers answered at least {min_coverage:.0%} of the "
            f"{n_answered} answered questions; a pool search needs two (best covered: {shown})"
        )
    per_pair = per_pair.filter(pl.col("worker").is_in(candidates))
    complete = per_pair.group_by("question_id").len().filter(pl.col("len") == len(candidates))["question_id"]
    per_pair = per_pair.filter(pl.col("question_id").is_in(complete.implode())).sort("question_id", "worker")
    question_ids = complete.sort().to_list()
    n = len(question_ids)
    if n == 0:
        raise PoolSearchError(f"no question was answered by all {len(candidates)} candidate workers {candidates}")
    correct = per_pair["correct"].to_numpy().reshape(n, len(candidates)).astype(float)
    cost = per_pair["cost"].fill_null(np.nan).to_numpy().reshape(n, len(candidates)).astype(float)
    meta = (
        pl.DataFrame({"question_id": question_ids})
        .join(questions.unique("question_id"), on="question_id", how="left")
        .sort("question_id")
    )
    subject = meta.select(pl.coalesce("subject", "corpus", pl.lit("unknown")))[:, 0].to_numpy()
    return OutcomeMatrix(
        question_ids=question_ids,
        workers=candidates,
        correct=correct,
        cost=cost,
        tokens_estimated=bool(per_pair["estimated"].any()),
        is_eval=np.array([split_fn(q) == "eval" for q in question_ids]),
        subject=subject,
        samples=scored.filter(
            pl.col("worker").is_in(candidates) & pl.col("question_id").is_in(complete.implode())
        ).select("question_id", "worker", "sample", "correct"),
        excluded=excluded,
        population=population_text(meta),
    )


# --- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubPool:
    """A sub-pool's figures on one set of questions."""

    members: tuple[str, ...]
    oracle: float
    best_worker: str
    best_single: float

    @property
    def headroom(self) -> float:
        return self.oracle - self.best_single


def sub_pool_figures(correct: np.ndarray, workers: Sequence[str], members: Sequence[int]) -> SubPool:
    """Oracle, best member (ties: the smallest name) and its accuracy on the rows of `correct`."""
    accuracy = correct[:, list(members)].mean(axis=0)
    names = [workers[i] for i in members]
    best = min(range(len(members)), key=lambda k: (-accuracy[k], names[k]))
    oracle = float(correct[:, list(members)].max(axis=1).mean())
    return SubPool(tuple(sorted(names)), oracle, names[best], float(accuracy[best]))


def _ranking_key(candidate: tuple[float, float, tuple[int, ...]], workers: Sequence[str]) -> tuple:
    headroom, oracle, members = candidate
    return (-round(headroom, 12), -round(oracle, 12), tuple(sorted(workers[i] for i in members)))


def beam_search(
    correct: np.ndarray, workers: Sequence[str], *, min_size: int, max_size: int, beam_width: int
) -> dict[int, list[tuple[int, ...]]]:
    """Per size, the sub-pools (worker indices) the beam kept, best headroom first.

    Pairs are exhaustive: oracle(i, j) = acc_i + acc_j - both_i_j. Growing a pool P by worker j adds
    the share of questions j solves that P leaves unsolved, one matrix product per size.
    """
    n, n_workers = correct.shape
    accuracy = correct.mean(axis=0)
    both = correct.T @ correct / n
    pairs = [
        (float(accuracy[i] + accuracy[j] - both[i, j] - max(accuracy[i], accuracy[j])),
         float(accuracy[i] + accuracy[j] - both[i, j]), (i, j))
        for i in range(n_workers) for j in range(i + 1, n_workers)
    ]
    kept: dict[int, list[tuple[int, ...]]] = {}
    beam = sorted(pairs, key=lambda c: _ranking_key(c, workers))[:beam_width]
    for size in range(2, min(max_size, n_workers) + 1):
        if size >= min_size:
            kept[size] = [members for _, _, members in beam]
        if size == min(max_size, n_workers):
            break
        pools = [members for _, _, members in beam]
        unsolved = np.stack([1.0 - correct[:, list(m)].max(axis=1) for m in pools])  # (beam, n)
        gained = unsolved @ correct / n  # (beam, workers): share newly solved by adding each worker
        grown: dict[tuple[int, ...], tuple[float, float, tuple[int, ...]]] = {}
        for row, (headroom, oracle, members) in enumerate(beam):
            best = max(accuracy[i] for i in members)
            for j in range(n_workers):
                if j in members:
                    continue
                key = tuple(sorted((*members, j)))
                if key not in grown:
                    new_oracle = oracle + float(gained[row, j])
                    grown[key] = (new_oracle - max(best, float(accuracy[j])), new_oracle, key)
        beam = sorted(grown.values(), key=lambda c: _ranking_key(c, workers))[:beam_width]
    return kept


# --- the report ----------------------------------------------------------------------------------


@dataclass
class PoolResult:
    """One pool: how it was found (or given), its train and eval figures, null pool, cost, subjects."""

    label: str
    kind: str  # "searched" (the train-split winner of its size) or "reference" (given, not searched)
    train: SubPool
    eval: SubPool
    eval_headroom_interval: tuple[float, float]
    samples_per_question: int
    null_headroom: float | None  # eval split: samples of the best member, as many as the pool has workers
    null_samples: int | None
    error_correlation: float  # mean pairwise Pearson correlation of members' 0/1 outcomes (train)
    cost_all_members: float | None  # USD per question, every member called (eval split)
    cost_best_single: float | None  # USD per question, the train-best member alone (eval split)
    subject_table: pl.DataFrame  # subject x member accuracy on the eval split, with the pool oracle
    runners_up: list[SubPool] = field(default_factory=list)  # the beam's next pools of the size (train)

    @property
    def members(self) -> tuple[str, ...]:
        return self.train.members

    @property
    def size(self) -> int:
        return len(self.members)

    @property
    def holds_out_of_sample(self) -> bool:
        """The eval headroom's interval is above 0."""
        return self.eval_headroom_interval[0] > 0


@dataclass
class PoolSearchReport:
    """What a search found (the text a reader takes in: `pool_search_report`)."""

    results: list[PoolResult]
    candidates: list[str]
    excluded: dict[str, float]
    population: str
    n_train: int
    n_eval: int
    search_seconds: float
    settings: PoolSearchSettings
    tokens_estimated: bool
    notes: list[str] = field(default_factory=list)

    @property
    def searched(self) -> list[PoolResult]:
        return [r for r in self.results if r.kind == "searched"]

    @property
    def best_out_of_sample(self) -> PoolResult | None:
        """The searched pool with the largest eval headroom."""
        return max(self.searched, key=lambda r: r.eval.headroom, default=None)

    @property
    def any_multi_sample(self) -> bool:
        return any(r.null_headroom is not None for r in self.results)

    @property
    def strongest_candidate(self) -> tuple[str, float] | None:
        """(name, eval accuracy) of the most accurate candidate on the eval split."""
        everyone = [r for r in self.results if r.kind == "reference" and r.label.startswith(ALL_CANDIDATES)]
        return (everyone[0].eval.best_worker, everyone[0].eval.best_single) if everyone else None

    def table(self) -> pl.DataFrame:
        rows = []
        for r in self.results:
            low, high = r.eval_headroom_interval
            sides = {f"{side}_{name}": getattr(pool, name) for side, pool in (("train", r.train), ("eval", r.eval))
                     for name in ("oracle", "best_worker", "best_single", "headroom")}
            rows.append({"pool": r.label, "kind": r.kind, "size": r.size, "workers": ", ".join(r.members), **sides,
                         "eval_headroom_low": low, "eval_headroom_high": high,
                         "samples_per_question": r.samples_per_question, "null_headroom": r.null_headroom,
                         "error_correlation": r.error_correlation, "cost_all_members_usd": r.cost_all_members,
                         "cost_best_single_usd": r.cost_best_single})
        return pl.DataFrame(rows, infer_schema_length=None)

def subject_table(
    correct: np.ndarray, subject: np.ndarray, workers: Sequence[str], members: Sequence[int]
) -> pl.DataFrame:
    """Per subject: questions, each member's accuracy, the pool oracle (rows of `correct`)."""
    rows = []
    for name in sorted(set(subject.tolist())):
        mask = subject == name
        block = correct[mask][:, list(members)]
        rows.append({"subject": name, "questions": int(mask.sum()),
                     **{workers[i]: float(block[:, k].mean()) for k, i in enumerate(members)},
                     "oracle": float(block.max(axis=1).mean())})
    return pl.DataFrame(rows)


def _error_correlation(correct: np.ndarray) -> float:
    """Mean pairwise Pearson correlation of the columns (constant columns are skipped)."""
    varying = correct[:, correct.std(axis=0) > 0]
    if varying.shape[1] < 2:
        return float("nan")
    matrix = np.corrcoef(varying, rowvar=False)
    return float(matrix[np.triu_indices_from(matrix, k=1)].mean())


def _samples_per_question(samples: pl.DataFrame, worker: str) -> int:
    """The most scored samples `worker` has on one question."""
    own = samples.filter(pl.col("worker") == worker)
    return int(own.group_by("question_id").agg(pl.col("sample").n_unique())["sample"].max() or 0)


def _null_headroom(samples: pl.DataFrame, worker: str, pool_size: int) -> tuple[float | None, int | None]:
    """(headroom, samples used) of the null pool of `worker`: as many of its samples as the pool has
    workers (fewer when it has fewer), treated as workers; (None, None) with one sample per question."""
    per_question = _samples_per_question(samples, worker)
    if per_question < 2:
        return None, None
    own = samples.filter(pl.col("worker") == worker)
    table = null_pool_table(own, pool_size=pool_size, sizes=(min(pool_size, per_question),))
    if table.is_empty():
        return None, None
    widest = table.sort("size").row(-1, named=True)
    return widest["headroom"], widest["size"]


def _measure(
    matrix: OutcomeMatrix,
    members: Sequence[int],
    label: str,
    kind: str,
    weights: np.ndarray,
    confidence: float,
) -> PoolResult:
    train_rows, eval_rows = ~matrix.is_eval, matrix.is_eval
    correct = matrix.correct
    train = sub_pool_figures(correct[train_rows], matrix.workers, members)
    evaluated = sub_pool_figures(correct[eval_rows], matrix.workers, members)
    block = correct[eval_rows][:, list(members)]
    n_eval = block.shape[0]
    draws = (weights @ block.max(axis=1) - (weights @ block).max(axis=1)) / n_eval
    names = [matrix.workers[i] for i in members]
    eval_ids = [q for q, is_eval in zip(matrix.question_ids, matrix.is_eval, strict=True) if is_eval]
    eval_samples = matrix.samples.filter(pl.col("question_id").is_in(eval_ids))
    null, null_samples = _null_headroom(eval_samples, train.best_worker, len(members))
    samples_per_question = max(_samples_per_question(eval_samples, w) for w in names)
    cost = matrix.cost[eval_rows][:, list(members)]
    with np.errstate(invalid="ignore"):
        mean_cost = np.array([np.nanmean(c) if np.isfinite(c).any() else np.nan for c in cost.T])
    best_index = names.index(train.best_worker)
    return PoolResult(
        label=label,
        kind=kind,
        train=train,
        eval=evaluated,
        eval_headroom_interval=percentile_interval(draws, confidence),
        samples_per_question=samples_per_question,
        null_headroom=null,
        null_samples=null_samples,
        error_correlation=_error_correlation(correct[train_rows][:, list(members)]),
        cost_all_members=None if np.isnan(mean_cost).any() else float(mean_cost.sum()),
        cost_best_single=None if np.isnan(mean_cost[best_index]) else float(mean_cost[best_index]),
        subject_table=subject_table(correct[eval_rows], matrix.subject[eval_rows], matrix.workers, members),
    )


def search_pools(
    sample_outcomes: pl.DataFrame,
    questions: pl.DataFrame,
    settings: PoolSearchSettings | None = None,
    *,
    reference_pools: Mapping[str, Sequence[str]] | None = None,
    split_fn: Callable[[str], str] = split_of,
) -> PoolSearchReport:
    """Search sub-pools on the train split, re-measure the winners (and `reference_pools`) on eval."""
    settings = settings or PoolSearchSettings()
    if settings.max_size < settings.min_size:
        raise PoolSearchError(f"max_size {settings.max_size} is below min_size {settings.min_size}")
    matrix = outcome_matrix(sample_outcomes, questions, settings.min_coverage, split_fn=split_fn)
    n_eval, n_train = int(matrix.is_eval.sum()), int((~matrix.is_eval).sum())
    if n_train == 0 or n_eval == 0:
        raise PoolSearchError(f"{n_train} train-split and {n_eval} eval-split questions: the search needs both")
    train = matrix.correct[~matrix.is_eval]
    searched = [i for i, accuracy in enumerate(train.mean(axis=0)) if accuracy >= settings.min_worker_accuracy]
    if len(searched) < 2:
        raise PoolSearchError(
            f"{len(searched)} candidate workers reach min_worker_accuracy {settings.min_worker_accuracy} on train"
        )
    started = time.perf_counter()
    kept = beam_search(
        train[:, searched], [matrix.workers[i] for i in searched],
        min_size=settings.min_size, max_size=settings.max_size, beam_width=settings.beam_width,
    )
    search_seconds = time.perf_counter() - started
    weights = question_resample_counts(n_eval, settings.n_bootstrap, settings.seed)
    results = []
    for size, ranked in kept.items():
        pools = [[searched[i] for i in members] for members in ranked]
        result = _measure(matrix, pools[0], f"best {size}", "searched", weights, settings.confidence)
        result.runners_up = [sub_pool_figures(train, matrix.workers, members) for members in pools[1:4]]
        results.append(result)
    notes = []
    index = {w: i for i, w in enumerate(matrix.workers)}
    # For scale: every candidate together, the most any sub-pool of them can reach.
    all_candidates = {f"{ALL_CANDIDATES} ({len(matrix.workers)})": matrix.workers}
    for label, workers in {**(reference_pools or {}), **all_candidates}.items():
        missing = sorted(set(workers) - set(index))
        if missing:
            notes.append(f"Reference pool {label} is not shown: {missing} are not candidates here.")
            continue
        members = [index[w] for w in sorted(workers)]
        results.append(_measure(matrix, members, label, "reference", weights, settings.confidence))
    if not any(r.null_headroom is not None for r in results):
        notes.append(null_pool_note({}, None))
    return PoolSearchReport(
        results=results,
        candidates=[matrix.workers[i] for i in searched],
        excluded=matrix.excluded,
        population=matrix.population,
        n_train=n_train,
        n_eval=n_eval,
        search_seconds=search_seconds,
        settings=settings,
        tokens_estimated=matrix.tokens_estimated,
        notes=notes,
    )
