"""Child process of ``conductor_pipeline.grading``: runs math-verify on one request per line.

Protocol: the parent writes ``{"pred", "gold", "timeout_s"}`` as one JSON line; the child answers
``1``, ``0`` or ``timeout``. The child runs in its own main thread, so an interval timer can stop
Python-level work before the parent's deadline; C-level work a signal cannot stop is ended by the
parent killing this process.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys

# Leave a margin so the child reports its own timeout before the parent kills it.
SELF_TIMEOUT_FRACTION = 0.8
PARSE_CACHE_SIZE = 20_000


class _Overran(BaseException):
    """Raised by the interval timer; BaseException so library ``except Exception`` cannot eat it."""


def _on_alarm(signum: int, frame: object) -> None:
    raise _Overran


def main() -> None:
    # The protocol owns the real stdout; anything a library prints goes to stderr instead.
    protocol = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8", buffering=1)
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    logging.disable(logging.CRITICAL)
    sys.setrecursionlimit(10_000)

    from functools import lru_cache

    from math_verify import parse, verify

    # Golds repeat across every model that answered a question; parsed expressions are immutable.
    @lru_cache(maxsize=PARSE_CACHE_SIZE)
    def parsed(text: str) -> tuple:
        return tuple(parse(text, parsing_timeout=None))

    signal.signal(signal.SIGALRM, _on_alarm)
    protocol.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        signal.setitimer(signal.ITIMER_REAL, max(0.05, request["timeout_s"] * SELF_TIMEOUT_FRACTION))
        try:
            gold = list(parsed(request["gold"]))
            pred = list(parsed(request["pred"]))
            answer = "1" if verify(gold, pred, timeout_seconds=None) else "0"
        except _Overran:
            answer = "timeout"
        except Exception:  # math-verify failing on odd text means "not shown equivalent"
            answer = "0"
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
        protocol.write(answer + "\n")


if __name__ == "__main__":
    main()
