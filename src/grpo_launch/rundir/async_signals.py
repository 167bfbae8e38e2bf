"""AsyncGRPOTrainer's own signals, as its logged metrics reach ``metrics.jsonl`` (LogRecord lines), and the verdict
TRL's maintainers read from them. Standard library only.

trl 1.16 async_grpo_trainer.py:374-381: "An empty queue with the trainer waiting is generation-bound; a full queue
with no wait is trainer-bound (and then ``rollout/backpressure_s`` is what generation lost to it)".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

# (metric TRL logs, what the console calls it, unit)
SIGNALS: tuple[tuple[str, str, str], ...] = (
    ("perf/rollout_wait_s", "rollout wait", "s"),  # the trainer blocked on an empty queue (trainer.py:1656)
    ("rollout/backpressure_s", "backpressure", "s"),  # the scorer blocked on a full queue (rollout_worker.py:792)
    ("sample/rollout_queue_size", "queue", ""),  # samples waiting where the trainer consumes them (trainer.py:382)
    ("sample/staleness_mean", "staleness", ""),  # weight versions behind (trainer.py:386)
    ("sample/staleness_max", "staleness max", ""),
    ("sample/dropped_stale_total", "dropped stale", ""),  # over max_staleness, dropped (trainer.py:371)
    ("perf/weight_sync_s", "weight sync", "s"),  # pause + barrier + transfer (trainer.py:1745)
)
WAIT_SHARE = 0.1  # the trainers waiting this share of a step or more: they starve
FULL_SHARE = 0.8  # a queue at this share of its cap or more: full
RECENT = 5  # the verdict reads the last this many logged steps


def signals_text(log: Mapping[str, float]) -> str:
    """The async signals of one logged step, for the console line ('' when the step has none)."""
    out = []
    for key, name, unit in SIGNALS:
        value = log.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out.append(f"{name} {value:.2f}{' ' + unit if unit else ''}" if unit else f"{name} {value:g}")
    return "".join(f" | {x}" for x in out)


def async_verdict(logs: Sequence[Mapping[str, float]], queue_maxsize: int | None = None) -> str | None:
    """Which side is slower, as TRL's maintainers read the signals, over the last logged steps; None without them."""
    recent = [log for log in logs if "perf/rollout_wait_s" in log or "sample/rollout_queue_size" in log][-RECENT:]
    if not recent:
        return None

    def mean(key: str) -> float:
        values = [float(log[key]) for log in recent if isinstance(log.get(key), (int, float))]
        return sum(values) / len(values) if values else 0.0

    wait, queue, step = mean("perf/rollout_wait_s"), mean("sample/rollout_queue_size"), mean("perf/step_s")
    waits = [float(log.get("perf/rollout_wait_s", 0.0)) for log in recent]
    rising = len(waits) > 1 and waits[-1] > waits[0]
    starving = wait > WAIT_SHARE * step if step else wait > 0
    full = queue >= FULL_SHARE * queue_maxsize if queue_maxsize else False
    said = f"queue {queue:.0f}" + (f" of {queue_maxsize}" if queue_maxsize else "") + f", rollout wait {wait:.2f} s"
    if full and not starving:
        line = (
            f"training is the slower side ({said} per step: a full queue and trainers that never wait): more "
            "trainer GPUs would help; rollout/backpressure_s is what generation loses"
        )
    elif queue < 1 and starving:
        line = (
            f"generation is the slower side ({said} per step{', rising' if rising else ''}: an empty queue "
            "and trainers waiting for rollouts): more vLLM GPUs would help"
        )
    else:
        line = f"generation and training keep pace ({said} per step)"
    dropped = sum(float(log.get("sample/dropped_stale_total", 0.0)) for log in recent)
    if dropped:
        line += (
            f"; {dropped:.0f} sample(s) dropped as stale: raise max_staleness or lower max_inflight_tasks "
            "and queue_maxsize"
        )
    return line
