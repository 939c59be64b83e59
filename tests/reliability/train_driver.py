"""A training process for the kill test: GRPO on the tiny model with frequent checkpoints.

    python -m tests.reliability.train_driver MODEL_DIR OUT_DIR --max-steps 10 --save-steps 1 [--profile cpu-paper]

`--profile cpu-paper` trains with the paper-budget profile's trainer and shape (groups of 64, 4
questions a step, the shared-prompt path) instead of the default CPU profile's.

Prints `STEP <global step>` as each optimizer step is logged (flushed, so the test can time its
SIGKILL), and `DONE <global step> <resumed-from checkpoint or ->` at the end.
"""

from __future__ import annotations

import argparse
import sys

from conductor_pipeline.training.grpo import train_grpo
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out_dir")
    parser.add_argument("--max-steps", type=int, default=10)
    parser.add_argument("--save-steps", type=int, default=1)
    parser.add_argument("--profile", choices=["cpu", "cpu-paper"], default="cpu")
    args = parser.parse_args(argv)
    if args.profile == "cpu-paper":
        settings = GRPOSettings.cpu_paper_profile(save_steps=args.save_steps, max_completion_length=16)
    else:
        settings = GRPOSettings.cpu_profile(save_steps=args.save_steps, max_completion_length=16, num_generations=4,
                                            questions_per_step=2)
    rows = conductor_prompt_rows(QUESTIONS, WORKERS, short_prompt, randomize_pools=True, question_id=str)
    reward = make_conductor_reward(format_verdict, settings.reward_variant, group_size=settings.num_generations)

    def on_step(row: dict) -> None:
        print(f"STEP {row['step']}", flush=True)

    outcome = train_grpo(args.model_dir, rows, reward, settings, args.out_dir, on_step=on_step,
                         max_steps_override=args.max_steps)
    print(f"DONE {outcome.global_step} {outcome.resumed_from or '-'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
