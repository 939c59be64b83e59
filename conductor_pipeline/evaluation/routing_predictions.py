"""A train-split W's predictions for every eval question x seat, recorded with an evaluation run: the
W-routed arms decide on them, and the cost sweeps recompute those arms from them without refitting W.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from conductor_pipeline.evaluation.routers import SuccessAndCostModel, list_price_per_mtok
from conductor_pipeline.files import decode_array, encode_array
from conductor_pipeline.pools.config import WorkerSeat
from conductor_pipeline.records import Question


@dataclass(frozen=True)
class RoutingPredictions:
    """A train-split W's predictions for every eval question x seat, kept with the run so the sweeps
    are recomputed from recorded answers without refitting W.

    `success` and `cost` are (questions x workers); `prices` are the workers' list prices
    (USD per million tokens, input plus output), the cascade's ladder; `fallback` is the best
    single worker, who answers when no rung reaches the threshold.
    """

    question_ids: tuple[str, ...]
    workers: tuple[str, ...]
    success: np.ndarray
    cost: np.ndarray
    prices: tuple[float, ...]
    fallback: str

    @classmethod
    def from_model(
        cls, model: SuccessAndCostModel, seats: Sequence[WorkerSeat], questions: Sequence[Question], fallback: str
    ) -> RoutingPredictions:
        """W's predictions for every question x seat, in one batch each."""
        return cls(
            question_ids=tuple(q.question_id for q in questions),
            workers=tuple(seat.name for seat in seats),
            success=np.asarray(model.predict_success(list(questions), list(seats)), dtype=float),
            cost=np.asarray(model.predict_cost(list(questions), list(seats)), dtype=float),
            prices=tuple(list_price_per_mtok(seat) for seat in seats),
            fallback=fallback,
        )

    def to_json_dict(self) -> dict[str, object]:
        """Plain JSON, the arrays bit for bit (`encode_array`): what `eval_arms` hands on."""
        return {
            "question_ids": list(self.question_ids), "workers": list(self.workers),
            "success": encode_array(self.success), "cost": encode_array(self.cost),
            "prices": list(self.prices), "fallback": self.fallback,
        }

    @classmethod
    def from_json_dict(cls, payload: Mapping[str, object]) -> RoutingPredictions:
        return cls(
            question_ids=tuple(payload["question_ids"]), workers=tuple(payload["workers"]),
            success=decode_array(payload["success"]), cost=decode_array(payload["cost"]),
            prices=tuple(payload["prices"]), fallback=str(payload["fallback"]),
        )

    def fingerprint(self) -> str:
        """A digest of what the W-routed arms decide on: the predictions (to 6 decimals), the ladder
        and the fallback. W refitted on the same rows gives the same digest, whatever bytes its saved files hold."""
        digest = hashlib.sha256(repr((self.question_ids, self.workers, self.prices, self.fallback)).encode())
        for predictions in (self.success, self.cost):
            digest.update(np.round(np.asarray(predictions, dtype=float), 6).tobytes())
        return digest.hexdigest()[:24]

    def restricted(self, question_ids: Sequence[str]) -> RoutingPredictions:
        row = {qid: i for i, qid in enumerate(self.question_ids)}
        rows = [row[qid] for qid in question_ids]
        return RoutingPredictions(
            tuple(question_ids), self.workers, self.success[rows], self.cost[rows], self.prices, self.fallback
        )
