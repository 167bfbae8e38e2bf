"""While a run goes: was the split right? A plain verdict from the measured generation and training seconds per
step (the trainers' ``metrics.jsonl``) against the plan's prediction. Pure.

The trainer's "generation" is everything TRL does before the backward (generating, scoring, the old log-probs and,
in server mode, the weight sync), "training" the rest; a server that generates much longer than the trainers train
wants more GPUs, and the other way round.
"""

from __future__ import annotations

from grpo_launch.enums import VllmMode
from grpo_launch.rundir.shown_text import command_line

IMBALANCE = 1.5  # one side this many times the other is worth a change
OFF_PLAN = 1.5  # measured step this far from the plan's (either way): replan from the measurements


def split_verdict(
    generation_s: float,
    training_s: float,
    mode: VllmMode,
    *,
    planned: tuple[float, float] | None = None,
    run_dir: str = "RUN_DIR",
    cpu: bool = False,
    step: int | tuple[int, int] | None = None,
) -> str:
    """One line: the measured split (up to ``step``, or the mean over the steps ``(first, last)``, when given) and
    the planned one, then what would help."""
    if isinstance(step, tuple):  # a mean: named as one, with its steps (other steps' lines printed their own)
        at = f", mean of steps {step[0]}–{step[1]}" if step[0] != step[1] else f" of step {step[1]}"
    else:
        at = f" at step {step}" if step is not None else ""
    line = f"step split{at}: generation {generation_s:.2f} s, training {training_s:.2f} s"
    if planned:
        line += f" (planned {planned[0]:.2f} s / {planned[1]:.2f} s)"
    advice = []
    if generation_s > IMBALANCE * training_s:
        ratio = generation_s / max(training_s, 1e-9)
        more = {
            VllmMode.SERVER: "more vLLM GPUs would help",
            VllmMode.COLOCATE: "a vLLM server on GPUs of its own may help (launch.vllm=server)",
            VllmMode.OFF: "vLLM would help (launch.vllm=auto on GPUs)",
        }[mode]
        advice.append(f"generation is {ratio:.1f}× training" + ("" if cpu else f": {more}"))
    elif training_s > IMBALANCE * generation_s:
        ratio = training_s / max(generation_s, 1e-9)
        fewer = ": fewer vLLM GPUs, more trainers, would help" if mode == VllmMode.SERVER else ""
        advice.append(f"training is {ratio:.1f}× generation{fewer}")
    else:
        advice.append("balanced")
    if planned and sum(planned) > 0:
        off = (generation_s + training_s) / sum(planned)
        if off > OFF_PLAN or off < 1 / OFF_PLAN:
            advice.append(f"the measured step is {off:.1f}× the plan's")
    if advice != ["balanced"] and not cpu:
        advice.append(f"{command_line(['grpo-launch', 'plan', '--calibrate-from', run_dir])} replans with these times")
    return line + ": " + "; ".join(advice)
