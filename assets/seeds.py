"""`make seeds`: train and evaluate one recipe over several seeds, then pool their verdicts.

    .venv/bin/python -m assets.seeds                               # the default recipe, seeds 0 1 2
    .venv/bin/python -m assets.seeds --seeds 0 1 2 3 4 --pool replay-mixed6-vote --config FILE
    .venv/bin/python -m assets.seeds --report-only                  # pool the seed runs already in $DAGSTER_HOME

Each seed is one `python -m assets.main --seed N` in a process of its own, then that seed's trained
conductor on a pool of test models (`assets.evaluate_checkpoint --trained`, `--unseen-pool`): its runs are tagged
`seed` and `recipe` (the trainer profile and the settings file's name) and show in the UI like any
other run; each seed keeps its own warm start and checkpoints, so a killed seed resumes on the
next call and a finished one trains nothing again (the seeds share asset keys, so its training
assets, whose latest materialization is another seed's, re-materialize from its saved files).
Then the latest evaluation of every seed of the recipe on the pool is read back (its per-question
scores from the eval tables) and every trained arm is compared with its references pooled over the
seeds (`conductor_pipeline.evaluation.seeds`: a two-way bootstrap over seeds and questions,
Holm-adjusted), on each pool. The summaries go to the
console and to `<artifacts>/seeds/<pool>/<recipe>.json`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from assets.instance import open_instance
from assets.results import UNSEEN_POOL, seeds_summary, summary_text
from conductor_pipeline.files import write_json_atomic
from conductor_pipeline.paths import artifacts_root
from resources.pool import default_pool_name
from resources.trainer import default_trainer_profile

# Three seeds: what the recorded verdicts pool, and the spread a run on another machine is checked against.
DEFAULT_SEEDS = (0, 1, 2)


def run_seed(seed: int, pool: str, config: str | None, torch_threads: int | None, unseen_pool: str | None) -> int:
    """One seed's `make run`, in processes of their own: the run, then its trained conductor on
    `unseen_pool` (none: not evaluated elsewhere); the first nonzero exit status, else 0."""
    threads = ["--torch-threads", str(torch_threads)] if torch_threads else []
    command = [sys.executable, "-m", "assets.main", "--pool", pool, "--seed", str(seed), *threads]
    command += ["--config", config] if config else []
    commands = [command]
    if unseen_pool:
        commands.append([sys.executable, "-m", "assets.evaluate_checkpoint", "--trained", "--seed", str(seed),
                         "--pool", unseen_pool, *threads])
    for command in commands:
        print(f"\n######## seed {seed}: {' '.join(command[1:])}", flush=True)
        code = subprocess.run(command, check=False).returncode
        if code != 0:
            return code
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=list(DEFAULT_SEEDS), help="Seeds to train and evaluate")
    parser.add_argument("--pool", default=default_pool_name(), help="Pool name under data/pools/ or a pool file")
    parser.add_argument("--config", help="YAML of resource settings and asset config (assets/run_settings.py)")
    parser.add_argument("--torch-threads", type=int, default=None, help="Passed on to each seed's run")
    parser.add_argument("--report-only", action="store_true", help="Pool the seeds' runs already recorded; train nothing")
    parser.add_argument("--unseen-pool", default=UNSEEN_POOL,
                        help="Also evaluate each seed's trained conductor on this pool (default: test models); '' skips")
    args = parser.parse_args(argv)
    from assets.run_settings import RunSettings, load_run_settings  # the settings file names the recipe

    settings = load_run_settings(args.config) if args.config else RunSettings()
    profile = settings.resource("trainer").get("profile") or default_trainer_profile()
    recipe = settings.recipe(profile)
    if not args.report_only:
        for seed in args.seeds:
            code = run_seed(seed, args.pool, args.config, args.torch_threads, args.unseen_pool)
            if code != 0:
                print(f"seed {seed} stopped with exit status {code}: the seeds after it were not run; rerun to resume")
                return code
    pools = [args.pool, *([args.unseen_pool] if args.unseen_pool else [])]
    with open_instance() as instance:
        summaries = {pool: seeds_summary(instance, pool, recipe, args.seeds) for pool in pools}
    for pool, summary in summaries.items():
        out = artifacts_root() / "seeds" / Path(pool).stem / f"{recipe}.json"
        write_json_atomic(out, summary, "seed summary")
        print(f"\n## {pool}\n" + summary_text(summary) + f"\n\nWritten to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
