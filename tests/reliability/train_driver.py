"""A training process for the kill test: GRPO on the tiny model with frequent checkpoints.

    python -m tests.reliability.train_driver MODEL_DIR OUT_DIR --max-steps 10 --save-steps 1 [--profile cpu-paper]

`train` is the same run in the calling process, for the tests whose subject is what a run leaves
on disk rather than the process (a killed or starved process is the subject only while it runs).

`--profile cpu-paper` trains with the paper-budget profile's trainer and shape (groups of 64, 4
questions a step, the shared-prompt path) instead of the default CPU profile's.

Prints `STEP <global step>` as each optimizer step is logged (flushed, so the test can time its
SIGKILL), and `DONE <global step> <resumed-from checkpoint or ->` at the end.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from conductor_pipeline.training.grpo import TrainingOutcome, train_grpo
from conductor_pipeline.training.reward import RolloutVerdict, make_conductor_reward
from conductor_pipeline.training.rollouts import conductor_prompt_rows
from conductor_pipeline.training.settings import GRPOSettings
from conductor_pipeline.workflow import parse_code

WORKERS = ["qwen-small", "llama-mid", "mistral-big"]
QUESTIONS = [f"Tom has {a} apples and buys {a + 4} more. How many apples does he have?" for a in range(3, 43)]


def short_prompt(question: str, workers: list[str]) -> list[dict]:
    return [
        {"role": "system", "content": "Workers: " + ", ".join(workers) + ". Reply with a workflow."},
        {"role": "user", "content": question},
    ]


def format_verdict(text: str, row: dict) -> RolloutVerdict:
    """Reward only the format (parseable 0.5, else 0): execution is not what this test is about."""
    return RolloutVerdict(parse_code(text, row["workers"]), correct=False)


def train(model_dir: str | Path, out_dir: str | Path, max_steps: int, *, save_steps: int = 1, profile: str = "cpu",
          on_step: Callable[[dict], object] | None = None,
          log: Callable[[str], object] | None = None) -> TrainingOutcome:
    """GRPO on the tiny model for `max_steps` (resuming from `out_dir`'s last whole checkpoint)."""
    if profile == "cpu-paper":
        settings = GRPOSettings.cpu_paper_profile(save_steps=save_steps, max_completion_length=16)
    else:
        settings = GRPOSettings.cpu_profile(save_steps=save_steps, max_completion_length=16, num_generations=4,
                                            questions_per_step=2)
    rows = conductor_prompt_rows(QUESTIONS, WORKERS, short_prompt, randomize_pools=True, question_id=str)
    reward = make_conductor_reward(format_verdict, settings.reward_variant, group_size=settings.num_generations)
    return train_grpo(model_dir, rows, reward, settings, out_dir, on_step=on_step, max_steps_override=max_steps,
                      log=log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--save-steps", type=int, default=1)
    parser.add_argument("--profile", choices=["cpu", "cpu-paper"], default="cpu")
    args = parser.parse_args(argv)

    def on_step(row: dict) -> None:
        print(f"STEP {row['step']}", flush=True)

    outcome = train(args.model_dir, args.out_dir, args.max_steps, save_steps=args.save_steps, profile=args.profile,
                    on_step=on_step)
    print(f"DONE {outcome.global_step} {outcome.resumed_from or '-'}", flush=True)
    return 0

if __name__ == "__main__":
    sys.exit(main())
