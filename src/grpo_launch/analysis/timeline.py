"""What ``status`` and the report say about a run's course besides its steps: each attempt (its steps, step time,
checkpoint and end: :mod:`.course`), launch.adapt's decisions (each with the seconds per prompt measured and
predicted before, and measured after on the split it moved to) and the time to the first step, term by term,
against the plan's forecast. Pure: reads records."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from grpo_launch.analysis.by_attempt import AttemptCourse
from grpo_launch.rundir.async_signals import async_verdict, signals_text
from grpo_launch.rundir.records import AdaptRecord, Attempt, LogRecord, MetricRecord, StartupRecord
from grpo_launch.rundir.startup_phases import critical_path_s


def _decided(attempts: Sequence[Attempt]) -> list[tuple[AdaptRecord, float | None]]:
    """Every decision in order, with what the split it moved to measured at the next decision (None: no move, or
    no later decision)."""
    made = [a for attempt in attempts for a in attempt.adaptations]
    later: list[AdaptRecord | None] = [*made[1:], None] if made else []
    return [(a, n.measured_s if a.action.moves and n is not None else None) for a, n in zip(made, later, strict=True)]


def adaptations(attempts: Sequence[Attempt]) -> list[dict[str, Any]]:
    """Every decision in order, as the run directory keeps it, each with ``measured_after_s``: what the split it
    moved to measured at the next decision (None when there was none)."""
    return [a.to_json() | {"measured_after_s": after} for a, after in _decided(attempts)]


def _s(value: Any) -> str:
    return f"{value:.3g} s" if isinstance(value, (int, float)) else "-"


def adaptation_rows(attempts: Sequence[Attempt]) -> list[tuple[str, str]]:
    rows = []
    for a, after in _decided(attempts):
        head = f"step {a.at_step}: {a.action}"
        if a.action.moves:
            head += f" {a.split} → {a.new_split}"
        times = (
            f"per prompt: measured {_s(a.measured_s)} (planned {_s(a.predicted_s)}, re-predicted {_s(a.calibrated_s)})"
        )
        if a.action.moves or a.new_s is not None:
            times += f"; {a.new_split}: predicted {_s(a.new_s)}"
        if after is not None:
            times += f", measured after {_s(after)}"
        rows.append(("adapt", f"{head}; {times}; {a.reason}"))
    return rows


def attempt_rows(
    courses: Sequence[AttemptCourse], *, running: bool = False, last: int | None = None
) -> list[tuple[str, str]]:
    """One row per attempt: its steps and own mean step time, the checkpoint it left, how it ended (``running``: a
    launcher holds the run, so the last attempt without an end is the one it runs). ``last``: only the last so
    many, the earlier ones counted in one row by how they ended (a run requeued fifty times)."""
    rows = []
    if last is not None and len(courses) > last:
        earlier = courses[: len(courses) - last]
        ends: dict[str, int] = {}
        for c in earlier:
            word = str(c.end.state) if c.end is not None else "no end recorded"
            ends[word] = ends.get(word, 0) + 1
        said = ", ".join(f"{n} {word}" for word, n in ends.items())
        rows.append((f"attempts {earlier[0].number}–{earlier[-1].number}", said))
        courses = courses[len(courses) - last :]
    for c in courses:
        end = "running" if running and c is courses[-1] and c.end is None else c.ended
        if c.first_step is None:
            said = "no step"
        else:
            span = f"step {c.first_step}" if c.steps == 1 else f"steps {c.first_step}–{c.last_step}"
            said = f"{span} ({c.steps} step{'s' if c.steps != 1 else ''})"
            if c.step_s is not None:
                said += f", {_s(c.step_s)} per step (generation {_s(c.generation_s)}, training {_s(c.training_s)})"
        said += f"; checkpoint at step {c.saved_step}" if c.saved_step is not None else "; no checkpoint saved"
        rows.append((f"attempt {c.number}", f"{said}; {end}"))
    return rows


def startup_terms(records: Sequence[MetricRecord]) -> dict[str, float]:
    """The latest attempt's time-to-first-step terms (each phase's last record)."""
    terms: dict[str, float] = {}
    for r in records:
        if isinstance(r, StartupRecord):
            if r.phase in terms:  # a phase seen again: a later attempt starts its terms afresh
                terms = {}
            terms[r.phase] = r.seconds
    return terms


PHASE_NAMES = {"start": "start (launcher and imports)", "model_load": "load (model, data, process groups)",
               "vllm_ready": "vLLM ready", "first_sync": "first sync",
               "first_generation": "first generation (with its warm-up)"}  # fmt: skip


def startup_row(
    records: Sequence[MetricRecord], forecast_s: float | None, forecast: Sequence[tuple[str, float, bool]] = ()
) -> tuple[str, str] | None:
    """``status``'s and the report's time to first step: the measured phases, each beside its forecast (plan.json's
    phases; ``forecast_s``: its total, for a plan that recorded no phases)."""
    terms = startup_terms(records)
    path = critical_path_s(terms)
    if path is None:
        return None
    planned = {name: seconds for name, seconds, _ in forecast}
    load, ready = terms.get("start", 0.0) + terms.get("model_load", 0.0), terms.get("vllm_ready")
    slower = "vLLM start-up" if (ready or 0.0) > load else "trainer start-up"

    names = dict(PHASE_NAMES)
    if "start" not in terms:  # a run from before the start was its own record: its load counted the imports
        names["model_load"] = "trainer start-up (imports, model and data load)"

    def part(key: str) -> str:
        text = f"{names[key]} {_s(terms[key])}"
        return text + (f" (forecast {_s(planned[key])})" if key in planned else "")

    parts = [part(key) for key in PHASE_NAMES if key in terms]
    said = f"{path:.0f} s on the critical path ({slower}, then the first sync and generation): {', '.join(parts)}"
    total = critical_path_s(planned) if planned else forecast_s
    if total:
        said += f"; forecast ≈ {total:.0f} s"
    return ("time to first step", said)


def async_row(records: Sequence[MetricRecord], queue_maxsize: int | None) -> tuple[str, str] | None:
    """An AsyncGRPO run's own signals at its last logged step and the verdict read from the last few (None for a
    synchronous run). ``queue_maxsize``: the rollout queue's size the plan set (PlanRecord.queue_maxsize)."""
    logs = [r.log for r in records if isinstance(r, LogRecord)]
    verdict = async_verdict(logs, queue_maxsize)
    if verdict is None:
        return None
    last = next((log for log in reversed(logs) if signals_text(log)), {})
    return ("async", f"{signals_text(last).removeprefix(' | ').replace(' | ', ', ')}; {verdict}")
