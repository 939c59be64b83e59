"""Stands in for the `vllm` executable in tests: takes `serve MODEL --host H --port P ...`.

FAKE_VLLM_MODE picks the behaviour: `serve` (the fault server answers /health and chat
completions on the given port), `exit` (dies at once, like a CUDA out-of-memory), `never`
(never listens), `stubborn` (ignores SIGTERM and starts a child that does too: only SIGKILL
of the process group ends them).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time

from tests.fakes.fault_app import main as serve_faults


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("model")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--served-model-name", required=True)
    parser.add_argument("--gpu-memory-utilization", type=float, required=True)
    parser.add_argument("--max-model-len", type=int, required=True)
    parser.add_argument("--dtype", required=True)
    args, extra = parser.parse_known_args()
    print("FAKE_VLLM_ARGS", json.dumps({**vars(args), "extra": extra}), flush=True)
    mode = os.environ.get("FAKE_VLLM_MODE", "serve")
    if mode == "exit":
        print("CUDA out of memory (fake)", flush=True)
        sys.exit(3)
    if mode == "never":
        time.sleep(600)
    if mode == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                                  "signal.SIG_IGN); time.sleep(600)"])
        print("FAKE_VLLM_CHILD", child.pid, flush=True)
        time.sleep(600)
    serve_faults(["--host", args.host, "--port", str(args.port)])


if __name__ == "__main__":
    main()
