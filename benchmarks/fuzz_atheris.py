"""Coverage-guided fuzzing of the workflow parser and answer extraction with atheris (libFuzzer).

Time-bounded; prints how many inputs were tried. Properties as in tests/reliability/test_fuzz.py:
the parser raises nothing but `WorkflowParseError`, extraction raises nothing, and no input is
executed (a marker file that an executed payload would create must not appear). math-verify
equivalence is not fuzzed here: it runs in a subprocess per comparison, far too slow for
coverage-guided fuzzing (hypothesis covers it).

    .venv/bin/pip install atheris   # optional: not a project dependency
    .venv/bin/python -m benchmarks.fuzz_atheris [--seconds 60] [--target parser|extract]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

try:
    import atheris
except ImportError:  # pragma: no cover - optional tool
    sys.exit("atheris is not installed: `.venv/bin/pip install atheris` (it needs a clang-built wheel for this Python)")

with atheris.instrument_imports():
    from conductor_pipeline.grading import extract_answer
    from conductor_pipeline.workflow import WorkflowParseError, parse_workflow

WORKERS = ["Model 0", "Model 1", "Model 2"]
MARKER = Path(tempfile.gettempdir()) / f"coryphaeus_atheris_PWNED_{os.getpid()}"
SEEDS = [
    'model_id = ["Model 0", 1]\nsubtasks = ["Solve.", "Check."]\naccess_list = [[], "all"]',
    '{"steps": [{"worker": "Model 2", "subtask": "Solve.", "sees": []}]}',
    "The final answer is \\boxed{\\frac{1}{2}}.",
    '{"reasoning": "...", "answer": "42"}',
    f"\\boxed{{__import__('os').system('touch {MARKER}')}}",
]
tried = 0


def fuzz_parser(data: bytes) -> None:
    global tried
    tried += 1
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(4096)
    try:
        parse_workflow(text, WORKERS)
    except WorkflowParseError:
        pass


def fuzz_extract(data: bytes) -> None:
    global tried
    tried += 1
    text = atheris.FuzzedDataProvider(data).ConsumeUnicodeNoSurrogates(4096)
    answer = extract_answer(text)
    if answer is not None and not isinstance(answer, str):
        raise TypeError(f"extract_answer returned {type(answer).__name__}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=int, default=60)
    parser.add_argument("--target", choices=["parser", "extract"], default="parser")
    args, libfuzzer_args = parser.parse_known_args()
    corpus = Path(tempfile.mkdtemp(prefix="atheris-corpus-"))
    for index, seed in enumerate(SEEDS):
        (corpus / f"seed{index}").write_text(seed)
    started = time.monotonic()

    def report() -> None:
        print(f"atheris {args.target}: {tried} inputs in {time.monotonic() - started:.0f}s; "
              f"payload executed: {MARKER.exists()}", flush=True)

    target = fuzz_parser if args.target == "parser" else fuzz_extract
    # libFuzzer ends the process itself at max_total_time (Python's atexit does not run), so
    # the count is reported from a final wrapper call made when time is up.
    deadline = started + args.seconds

    def bounded(data: bytes) -> None:
        target(data)
        if time.monotonic() >= deadline:
            report()
            os._exit(1 if MARKER.exists() else 0)

    atheris.Setup([sys.argv[0], f"-max_total_time={args.seconds + 5}", "-rss_limit_mb=2048",
                   f"-artifact_prefix={corpus}/", *libfuzzer_args, str(corpus)], bounded)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
