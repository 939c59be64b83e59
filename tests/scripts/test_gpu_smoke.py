"""The GPU smoke script's CPU dry run: the same warm start and GRPO code path at tiny size, importing
nothing the lent GPU machine lacks beyond the wheels the script carries."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conductor_pipeline.paths import PROJECT_ROOT

MODULE = "scripts.gpu_smoke"  # run as a module from the repository root: `python -m scripts.gpu_smoke`
# In the project's environment, absent on the GPU machine, and not carried: importing one fails there.
ABSENT_ON_THE_GPU_MACHINE = ("dagster", "dagster_duckdb", "duckdb", "polars", "lightgbm", "math_verify", "vllm")
RUN_WITHOUT_THEM = (
    "import runpy, sys; sys.modules.update(dict.fromkeys({absent!r})); sys.argv = {argv!r}; "
    "runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
)


def test_cpu_dry_run_trains_without_the_modules_the_gpu_machine_lacks(tmp_path: Path) -> None:
    report = tmp_path / "out" / "gpu_smoke.json"
    argv = [MODULE, "--cpu-dry-run", "--workdir", str(tmp_path / "work"), "--report", str(report)]
    code = RUN_WITHOUT_THEM.format(absent=ABSENT_ON_THE_GPU_MACHINE, argv=argv, module=MODULE)
    run = subprocess.run([sys.executable, "-c", code], cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads(report.read_text())
    assert result["mode"] == "cpu-dry-run" and result["sft"]["steps"] == 1 and result["prompt_tokens"] > 100
    [grpo] = result["grpo"]
    assert grpo["steps"] == 1 and len(grpo["step_s"]) == 1 and grpo["rollouts_per_step"] == 4
    assert result["projection"]["paper_steps"] == 200 and result["projection"]["hours"] > 0
    assert "projected: 200 steps" in run.stdout
    assert not list((tmp_path / "work").glob("grpo-g2/checkpoint-*"))  # weights removed after timing
