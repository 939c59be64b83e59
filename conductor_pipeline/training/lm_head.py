"""On a CPU, TRL's fused LM head scores only the positions that carry a label.

TRL 1.16 trains through `add_fused_lm_head`: the LM head projects hidden states to log-probabilities
in tiles, without building the logits. On Triton devices it projects only the positions whose label
is not -100; everywhere else it projects every position and zeroes the ignored ones afterwards, so
that compiled backends (XLA, Neuron) see one tile shape per batch. Eager CPU training has no such
constraint, and a conductor sequence is mostly prompt (the catalogue and the question), which
carries no label in SFT (completion-only loss) or GRPO (the loss covers the completion), so most
of the head's work there is thrown away. Scoring the labelled positions only gives the same loss
and gradients up to the order of float sums.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def labelled_positions_only() -> Iterator[None]:
    """Within this block, TRL's fused LM head on a CPU projects labelled positions only.

    TRL decides per call through `trl.trainer.utils._use_triton(device)` ("compact" scoring on
    Triton devices); the block answers yes for CPU tensors as well. On a TRL without that hook the
    block changes nothing. Other devices keep TRL's own answer.
    """
    import trl.trainer.utils as trl_utils

    decide = getattr(trl_utils, "_use_triton", None)
    if decide is None:
        yield
        return

    def compact_on_cpu(device) -> bool:
        return device.type == "cpu" or decide(device)

    trl_utils._use_triton = compact_on_cpu
    try:
        yield
    finally:
        trl_utils._use_triton = decide
