"""The Python half of scripts/gpu_acceptance.sh: the stack check and its verdict (which phases this environment can
run, and why not the others), the random-weight assets built from the project's own model shapes, and the one JSON
the acceptance writes. Nothing is downloaded.

    python scripts/gpu_acceptance.py check [--skip-file FILE]   # the stack and the verdict; FILE: what to skip, why
    python scripts/gpu_acceptance.py assets OUT_DIR             # model (config from models/builtin.py), data, recipes
    python scripts/gpu_acceptance.py report OUT_DIR JSON_PATH   # predicted ÷ measured per run and term, one JSON

The report reads each run directory with the launcher's own readers (analysis.view.RunView, analysis.step_means.measure,
analysis.timeline.startup_terms), the way ``grpo-launch status`` does, and sets what the run's own plan.json predicted
beside what it measured: predicted ÷ measured per term, each in its band (:data:`BANDS`). It exits 1 when a term
leaves its band, or when a run the stack could run measured nothing, and writes the JSON either way.
:func:`stack_verdict`, :func:`compare` and :func:`build_report` are pure: the CPU tests (tests/test_gpu_acceptance.py)
give them version lists and fake run directories, as no GPU exists there.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from grpo_launch.rundir.plan_record import PlanRecord
    from grpo_launch.rundir.records import MetricRecord

SCHEMA = "grpo-launch/gpu-acceptance/2"
BUDGET_S = 480  # 8 minutes on one H100 or H200, the whole script
RUN_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"  # the shape calibrated and trained (random weights, the built-in shape)
# Transformers' decode of a small model is bound by kernel launches, so a step's time follows the completion length
# (≈ 9 s a step at 256 tokens on an H200): 128 keeps steps of seconds, long enough to time, and three runs without
# vLLM within the budget.
COMPLETION_LEN = 128

# The stack. Required, as the project's train extra pins it (pyproject.toml): without one of these no phase after
# the check can run. datasets too: TRL imports it, and the trainers load the arithmetic data with it.
REQUIRED = {"torch": "2.4", "transformers": "5.0", "trl": "1.16", "accelerate": "1.10", "datasets": "3.0"}
TRL_SERIES = (1, 16)  # trl>=1.16,<1.17: the launcher renders TRL 1.16's arguments (recipe/trl_schema.py)
# Optional: without them the phases that need them are skipped, with the reason. TRL 1.16 supports vLLM 0.22-0.31
# (trl/import_utils.py refuses a vLLM outside that range).
VLLM_RANGE = ((0, 22), (0, 31))
DEEPSPEED_LEAST = "0.17"
OPTIONAL = ("vllm", "deepspeed")


@dataclass(frozen=True)
class RunKind:
    """One GPU run of the acceptance (phase ``run-KIND``, run directory ``OUT/run-KIND``): its launch block, the TRL
    values it sets beyond the shared ones, the optional package it needs and the GPUs it needs (with why)."""

    steps: int
    launch: Mapping[str, Any]
    trl: Mapping[str, Any] = field(default_factory=dict)
    needs: str | None = None
    gpus: int = 1
    gpus_why: str = ""

    @property
    def vllm(self) -> bool:
        return self.launch.get("vllm") != "off"


# Three steps or more: measure() leaves each attempt's first step out (it warms up), so two or more warm steps are
# averaged. ZeRO-3 is given three (its DeepSpeed start-up is the longest: 72 s for 3 steps at 256 tokens on an H200).
RUNS: dict[str, RunKind] = {
    # vLLM's phases first: where the stack skips them, the time their caps held passes to the runs after them
    "server": RunKind(5, {"vllm": "server"}, needs="vllm", gpus=2,
                      gpus_why="launch.vllm=server puts vLLM on one GPU and the trainer on another"),
    "colocate": RunKind(5, {"vllm": "colocate"}, needs="vllm"),
    "ddp": RunKind(4, {"vllm": "off", "backend": "ddp"}),
    "zero3": RunKind(3, {"vllm": "off", "backend": "zero3"}, needs="deepspeed"),
    "cb": RunKind(4, {"vllm": "off", "backend": "ddp"}, trl={"use_transformers_continuous_batching": True}),
}  # fmt: skip

# Bands of predicted ÷ measured. Step, generation and training: within 25 %; time to first step: within 50 % (it
# holds imports, loads and warm-ups); peak memory: the plan may overestimate by half, never underestimate (a plan
# under the peak is an out-of-memory error on the GPU).
BANDS: dict[str, tuple[float, float]] = {
    "step_s": (0.75, 1.25),
    "generation_s": (0.75, 1.25),
    "training_s": (0.75, 1.25),
    "first_step_s": (0.5, 1.5),
    "peak_memory_gib": (1.0, 1.5),
}


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def _phase(kind: str) -> str:
    return f"run-{kind}"


@dataclass(frozen=True)
class Verdict:
    """What the stack check decided: ``fatal``, what keeps every phase after the check from running (empty: the
    acceptance runs); ``skipped``, each phase this stack cannot run and why (the others run)."""

    fatal: tuple[str, ...]
    skipped: Mapping[str, str]


def _optional_problems(versions: Mapping[str, str | None]) -> dict[str, str]:
    """Each optional package that is missing or outside what TRL 1.16 and the project support, with why."""
    why: dict[str, str] = {}
    vllm = versions.get("vllm")
    low, high = VLLM_RANGE
    shown = f"{'.'.join(map(str, low))}–{'.'.join(map(str, high))}"
    if vllm is None:
        why["vllm"] = "vLLM is not installed"
    elif not low <= _version_tuple(vllm)[:2] <= high:
        side = "newer" if _version_tuple(vllm)[:2] > high else "older"
        why["vllm"] = f"vllm {vllm} is {side} than TRL 1.16 supports ({shown})"
    deepspeed = versions.get("deepspeed")
    if deepspeed is None:
        why["deepspeed"] = "DeepSpeed is not installed (ZeRO-3 needs it)"
    elif _version_tuple(deepspeed) < _version_tuple(DEEPSPEED_LEAST):
        why["deepspeed"] = f"deepspeed {deepspeed} is older than {DEEPSPEED_LEAST}"
    return why


def stack_verdict(versions: Mapping[str, str | None], cuda_devices: int) -> Verdict:
    """The phases this environment runs: fatal when a required package is missing or too old, TRL is not 1.16,
    torch is a CPU build or no CUDA GPU is visible; a run skipped (not fatal) where its optional package (vLLM,
    DeepSpeed) is missing or out of range, or where it needs more GPUs than the machine has."""
    fatal = []
    for name, least in REQUIRED.items():
        have = versions.get(name)
        if have is None:
            fatal.append(f"{name} is not installed (need ≥ {least})")
        elif _version_tuple(have) < _version_tuple(least):
            fatal.append(f"{name} {have} is older than {least}")
    trl = versions.get("trl")
    if trl is not None and _version_tuple(trl)[:2] > TRL_SERIES:
        fatal.append(f"trl {trl} is not TRL 1.16 (the launcher renders TRL 1.16's arguments: trl>=1.16,<1.17)")
    torch = versions.get("torch")
    if torch is not None and "+cpu" in torch:
        fatal.append(f"torch {torch} is a CPU build (no CUDA)")
    elif torch is not None and cuda_devices < 1:
        fatal.append("no CUDA GPU is visible (torch.cuda.device_count() is 0)")
    missing = _optional_problems(versions)
    skipped = {}
    for kind, run in RUNS.items():
        if run.needs in missing:
            skipped[_phase(kind)] = missing[run.needs]
        elif run.gpus > max(cuda_devices, 1):  # no GPU at all is fatal, said above
            skipped[_phase(kind)] = f"{run.gpus} GPUs needed ({run.gpus_why}); this machine has {cuda_devices}"
    return Verdict(tuple(fatal), skipped)


def installed_versions() -> dict[str, str | None]:
    """The installed version of each package the acceptance uses, from its metadata (None: missing)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in (*REQUIRED, *OPTIONAL):
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _cuda_devices(torch_version: str | None) -> tuple[int, str | None]:
    """The CUDA GPUs torch sees, and why it cannot say (a torch that does not import)."""
    if torch_version is None or "+cpu" in torch_version:
        return 0, None
    try:
        import torch
    except Exception as exc:  # a broken install (a missing CUDA library) raises more than ImportError
        return 0, f"torch does not import: {type(exc).__name__}: {exc}"
    return (torch.cuda.device_count() if torch.cuda.is_available() else 0), None


def check(skip_file: Path | None = None) -> int:
    """Print the stack and the verdict; exit 0 when the acceptance can run (optional phases may be skipped), else 3
    with what is missing (no traceback). ``skip_file``: each skipped phase and its reason (a JSON string), one a line
    separated by a tab, for the shell script."""
    versions = installed_versions()
    devices, broken = _cuda_devices(versions.get("torch"))
    verdict = stack_verdict(versions, devices)
    fatal = (*verdict.fatal, broken) if broken else verdict.fatal
    print("stack: " + ", ".join(f"{k} {v or 'missing'}" for k, v in versions.items()) + f"; CUDA GPUs {devices}")
    for phase, why in verdict.skipped.items():
        print(f"gpu_acceptance: {phase} is skipped: {why}")
    if skip_file is not None:
        skip_file.write_text("".join(f"{phase}\t{json.dumps(why)}\n" for phase, why in verdict.skipped.items()))
    if fatal:
        print("gpu_acceptance: this environment cannot run the acceptance:\n  - " + "\n  - ".join(fatal))
        print(
            "It installs nothing (offline): run it where the GPU stack is installed, e.g. a venv made with\n"
            "  pip install -e '.[train]'   (and '.[vllm]' for the vLLM runs; GPU torch comes with vllm)\n"
            "and point PYTHON= (and GRPO_LAUNCH=) at it."
        )
        return 3
    return 0


def hf_config(model: str) -> dict[str, Any]:
    """A Qwen2 ``config.json`` for the built-in shape of ``model`` (models/builtin.py), never the Hub's. Tied
    embeddings when counting them tied is nearer the shape's parameter count (Qwen2.5 ≤ 3B ties them)."""
    from grpo_launch.models.builtin import find_model_shape

    shape = find_model_shape(model)
    if shape is None:
        raise SystemExit(f"gpu_acceptance: {model} has no built-in shape (src/grpo_launch/models/builtin.py)")
    h, i, heads, kv = shape.hidden, shape.intermediate or 4 * shape.hidden, shape.heads, shape.kv_heads
    head_dim = shape.head_dim or h // heads
    layer = h * heads * head_dim + 2 * h * kv * head_dim + heads * head_dim * h + 3 * h * i
    untied = shape.layers * layer + 2 * shape.vocab * h
    tied = untied - shape.vocab * h
    return {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": h,
        "intermediate_size": i,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": shape.vocab,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "tie_word_embeddings": abs(tied - shape.params) < abs(untied - shape.params),
        "torch_dtype": "bfloat16",
        "use_sliding_window": False,
        "bos_token_id": None,
        "eos_token_id": None,
    }


def _recipe(kind: str, model_dir: Path, data: Path, run_dir: Path, allowed: Sequence[int]) -> str:
    """The recipe of run ``kind`` (:data:`RUNS`) on the random model: 16 prompts × 8 completions of
    :data:`COMPLETION_LEN` tokens per optimizer step.

    The random model's vocabulary is the shape's (151,936) and the tokenizer's is tiny. With vLLM, sampling is kept
    to the tokenizer's ids without its end-of-sequence (``allowed_token_ids``, which TRL passes to vLLM's
    SamplingParams), so every completion runs to the maximum, the length the plan is told to expect
    (expected_completion_length): the measured and the predicted work are the same. Without vLLM that argument is
    not transformers', and needs no stand-in: the random model almost never samples its end-of-sequence, and ids
    beyond the tokenizer's decode to nothing. A short stop grace: ``timeout`` stops a run at its cap, and the
    launcher, its trainers and their GPU memory must be gone before the next run starts (timeout's kill follows its
    stop by 10 s)."""
    import yaml

    run = RUNS[kind]
    values = {
        "model_name_or_path": str(model_dir), "dataset_name": str(data), "dataset_prompt_column": "prompt",
        "dataset_answer_column": "answer", "reward_funcs": ["digits"], "num_generations": 8,
        "per_device_train_batch_size": 32, "gradient_accumulation_steps": 4, "max_prompt_length": 64,
        "max_completion_length": COMPLETION_LEN, "temperature": 1.0,
        **({"generation_kwargs": {"allowed_token_ids": list(allowed)}} if run.vllm else {}), **run.trl,
        "learning_rate": 1.0e-6, "max_steps": run.steps, "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "seed": 42, "bf16": True, "gradient_checkpointing": True,
        "launch": {**run.launch, "expected_completion_length": COMPLETION_LEN, "run_dir": str(run_dir),
                   "stop_grace_s": 4, "grace_period_s": 4},
    }  # fmt: skip
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=None, width=120)


def assets(out: Path) -> int:
    """A random-weight model of the built-in shape, the tiny tokenizer and arithmetic data of
    scripts/make_tiny_assets.py, and one recipe per run kind (``OUT/recipe-KIND.yaml``, each writing its run to
    ``OUT/run-KIND``). The 1.5B shape is not calibrated: 122 s on an H200, more than its share of the budget."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_tiny_assets as tiny

    tiny_dir = out / "tiny"
    tiny.make_dataset(tiny_dir / "data" / "train.jsonl", n=512)
    tiny.make_model(tiny_dir / "model")  # for its tokenizer (≈1 s)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir / "model")
    target = out / "models" / RUN_MODEL.rsplit("/", 1)[-1]
    target.mkdir(parents=True, exist_ok=True)
    cfg = hf_config(RUN_MODEL) | {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
    (target / "config.json").write_text(json.dumps(cfg, indent=1))
    tok.save_pretrained(target)
    if not (target / "model.safetensors").exists():
        import torch
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        config = Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
        weights: Any = Qwen2ForCausalLM(config)
        weights.to(torch.bfloat16).save_pretrained(target)
    print(f"assets: {target} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']})")
    allowed = [i for i in range(len(tok)) if i not in (tok.eos_token_id, tok.pad_token_id)]
    for kind in RUNS:
        recipe = out / f"recipe-{kind}.yaml"
        recipe.write_text(_recipe(kind, target, tiny_dir / "data" / "train.jsonl", out / _phase(kind), allowed))
        print(f"assets: {recipe}")
    return 0


# ------------------------------------------------------------------------------------------------------- the report
def compare(measured: float | None, predicted: float | None, band: tuple[float, float]) -> dict[str, Any]:
    """One term: both sides, predicted ÷ measured, its band and whether it lies in it. Not compared (``in_band``
    None) where the plan predicted nothing or nothing was measured (a zero: the run did not time it)."""
    ratio = predicted / measured if predicted is not None and measured is not None and measured > 0 else None
    in_band = None if ratio is None else band[0] <= ratio <= band[1]
    return {"measured": measured, "predicted": predicted, "predicted_over_measured": ratio, "band": list(band),
            "in_band": in_band}  # fmt: skip


def first_step_rows(records: Sequence[MetricRecord], plan: PlanRecord | None) -> dict[str, dict[str, Any]]:
    """The time-to-first-step rows: the measured critical path (the trainers' start-up beside vLLM's, then the
    first sync and generation, as ``status`` reads it) against the plan's forecast, and each phase the run recorded
    against the same phase of the forecast (``first_step_s.PHASE``, where plan.json has its phases; not banded:
    the whole is)."""
    from grpo_launch.analysis.timeline import startup_terms
    from grpo_launch.rundir.startup_phases import critical_path_s

    terms = startup_terms(records)
    row = compare(critical_path_s(terms), plan.startup_s if plan else None, BANDS["first_step_s"])
    rows = {"first_step_s": row | {"phases": terms}}
    forecast = {name: seconds for name, seconds, _ in (plan.startup_phases if plan else ())}
    for name, seconds in terms.items():
        if name in forecast:
            predicted = forecast[name]
            ratio = predicted / seconds if seconds else None
            rows[f"first_step_s.{name}"] = {"measured": seconds, "predicted": predicted,
                                            "predicted_over_measured": ratio, "band": None,
                                            "in_band": None}  # fmt: skip
    return rows


def _first_line(exc: Exception) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def _plan_estimate(run_dir: Path) -> dict[str, Any]:
    """plan.json's estimate as written, for the figure PlanRecord does not carry (the GPU's memory, of which a
    colocated vLLM takes its share); empty where it does not read."""
    try:
        estimate = json.loads((run_dir / "plan.json").read_text()).get("estimate")
    except (OSError, ValueError, AttributeError):
        return {}
    return estimate if isinstance(estimate, dict) else {}


def read_run(run_dir: Path) -> dict[str, Any]:
    """One run directory, read by the launcher's own readers, as the report's entry: the run's backend and vLLM
    mode, its steps, and each term (:data:`BANDS`) measured against plan.json's prediction. ``error`` says why a
    directory gave no measurement (no metrics.jsonl, no step, a file that does not read)."""
    from grpo_launch.analysis.step_means import measure
    from grpo_launch.analysis.view import RunView
    from grpo_launch.errors import GrpoLaunchError

    try:
        view = RunView.load(run_dir, strict=False)
        m = measure(view)
    except (GrpoLaunchError, OSError) as exc:
        return {"run_dir": str(run_dir), "error": _first_line(exc)}
    plan, pr = m.plan, m.prediction
    estimate = _plan_estimate(run_dir)
    # A colocated vLLM lives in the trainer's process: its CUDA peak holds vLLM's share of the GPU too (vLLM takes
    # gpu_memory_utilization of the GPU's memory, whatever it needs of it).
    vllm_gib = None
    if plan is not None and plan.vllm_mode == "colocate" and plan.vllm_memory_share and estimate.get("gpu_memory_gib"):
        vllm_gib = plan.vllm_memory_share * float(estimate["gpu_memory_gib"])
    train_gib = pr.train_memory_gib if pr else None
    peak_predicted = None if train_gib is None else train_gib + (vllm_gib or 0.0)
    # a CPU run's peak is a resident set (rss_max): no term of the GPU memory model
    peak = m.peak_memory_bytes / 2**30 if m.memory_kind == "cuda_max_allocated" and m.peak_memory_bytes else None
    terms = {
        "step_s": compare(m.step_s, pr.step_s if pr else None, BANDS["step_s"]),
        # the trainer's "generation" holds the old log-probs and the weight sync too
        "generation_s": compare(m.generation_s, pr.trainer_generation_s if pr else None, BANDS["generation_s"]),
        "training_s": compare(m.training_s, pr.training_s if pr else None, BANDS["training_s"]),
        **first_step_rows(view.records, plan),
        "peak_memory_gib": compare(peak, peak_predicted, BANDS["peak_memory_gib"])
        | {"train_gib": train_gib, "vllm_gib": vllm_gib},
    }
    return {
        "run_dir": str(run_dir),
        "backend": plan.train.get("backend") if plan else None,
        "vllm": plan.vllm_mode if plan else None,
        "steps": m.steps,
        "warm_steps": len(view.steps(warm=True)),
        "memory_kind": m.memory_kind,
        "mean_completion_len": m.mean_completion_len,
        "terms": terms,
        "error": None,
    }


def read_calibrations(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """What each calibration in ``folder`` measured against the model, read by grpo-launch's own reader: the
    training step's peak memory against the memory model's tensors (with and without activation checkpointing),
    and the weight sync (its path and seconds). A file that reader refuses (another tool's JSON) is listed as
    skipped, with why."""
    from grpo_launch.errors import ConfigError
    from grpo_launch.planning.measured_scales import step_peak_points
    from grpo_launch.probe.calibration_store import read_calibration

    read, skipped = [], []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            t = read_calibration(path).terms
        except ConfigError as exc:
            skipped.append({"file": path.name, "why": _first_line(exc)})
            continue
        peaks = [{"checkpointing": ckpt, "measured_gib": measured / 2**30, "predicted_gib": predicted / 2**30,
                  "predicted_over_measured": predicted / measured}
                 for ckpt, predicted, measured in step_peak_points(t)]  # fmt: skip
        read.append({"file": path.name, "device": t.device, "step_peak": peaks, "sync_s": t.sync_s,
                     "sync_path": t.sync_path or None})  # fmt: skip
    return read, skipped


def _problems(phases: Sequence[Mapping[str, Any]], runs: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Why the acceptance fails: each term out of its band, each run the stack could run that measured nothing (it
    failed, ran out of time or was not reached) or had nothing to compare, and nothing measured at all."""
    status = {str(p.get("phase")): p for p in phases}  # each phase's last record
    problems, measured = [], 0
    for phase, run in runs.items():
        record = status.get(phase)
        if run.get("error") is None:
            measured += 1
            if all(t["in_band"] is None for t in run["terms"].values()):
                problems.append(f"{phase}: no term compared (plan.json predicted none of what the run measured)")
            for name, t in run["terms"].items():
                if t["in_band"] is False:
                    lo, hi = t["band"]
                    problems.append(f"{phase} {name}: predicted ÷ measured {t['predicted_over_measured']:.2f} "
                                    f"(predicted {t['predicted']:.3g}, measured {t['measured']:.3g}) outside "
                                    f"{lo}–{hi}")  # fmt: skip
        elif record is not None and record.get("status") != "skipped":
            problems.append(f"{phase}: measured nothing (phase {record.get('status')}; {run['error']})")
    if not measured:
        problems.append("no run measured anything")
    return problems


def build_report(
    *,
    device: str,
    versions: Mapping[str, str | None],
    phases: Sequence[Mapping[str, Any]],
    budget_s: float,
    runs: Mapping[str, Mapping[str, Any]],
    calibrations: Sequence[Mapping[str, Any]] = (),
    calibrations_skipped: Sequence[Mapping[str, str]] = (),
) -> dict[str, Any]:
    """The acceptance JSON. ``runs``: phase → :func:`read_run`'s entry (an ``error`` where it measured nothing);
    a phase the stack skipped carries its reason as ``skipped``. ``problems`` (empty: passed) lists the terms out of
    their bands and the runs that should have measured and did not."""
    skipped = {str(p.get("phase")): p.get("reason") for p in phases if p.get("status") == "skipped"}
    entries = {phase: {**run, "skipped": skipped.get(phase)} for phase, run in runs.items()}
    elapsed = sum(float(ph.get("seconds") or 0.0) for ph in phases)
    problems = _problems(phases, runs)
    return {
        "schema": SCHEMA,
        "device": device,
        "versions": dict(versions),
        "budget_s": budget_s,
        "elapsed_s": round(elapsed, 1),
        "within_budget": elapsed <= budget_s,
        "phases": [dict(ph) for ph in phases],
        "model": RUN_MODEL,
        "bands": {name: list(band) for name, band in BANDS.items()},
        "runs": entries,
        "calibrations": [dict(c) for c in calibrations],
        "calibrations_skipped": [dict(c) for c in calibrations_skipped],
        "problems": problems,
        "passed": not problems,
    }


def _summary(doc: Mapping[str, Any]) -> str:
    """The report's terms as a table, for the log."""
    lines = []
    for phase, run in doc["runs"].items():
        if run.get("error") is not None:
            lines.append(f"{phase:<13} {run['error']}")
            continue
        for name, t in run["terms"].items():
            ratio = t["predicted_over_measured"]
            said = "in band" if t["in_band"] else "OUT" if t["in_band"] is False else "(a phase: the whole is banded)"
            shown = "not compared" if ratio is None else f"{ratio:6.2f}  {said}"
            m, p = t["measured"], t["predicted"]
            lines.append(f"{phase:<13} {name:<16} measured {m if m is None else f'{m:.3g}':>8}  predicted "
                         f"{p if p is None else f'{p:.3g}':>8}  predicted ÷ measured {shown}")  # fmt: skip
    return "\n".join(lines)


def report(out: Path, path: Path) -> int:
    """Write the acceptance JSON of ``out`` to ``path``; 0 when every compared term is in its band, 1 when one is
    not or a run that should have measured did not (each named on stderr)."""
    from grpo_launch.probe.calibration_store import calibration_dir

    versions = installed_versions()
    device = "unknown"
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    phases_file = out / "phases.jsonl"
    phases = [json.loads(x) for x in phases_file.read_text().splitlines() if x.strip()] if phases_file.exists() else []
    skipped = {str(p.get("phase")): p.get("reason") for p in phases if p.get("status") == "skipped"}
    runs: dict[str, dict[str, Any]] = {}
    for kind in RUNS:
        phase, run_dir = _phase(kind), out / _phase(kind)
        if phase in skipped:  # not read: a directory there is an earlier acceptance's
            runs[phase] = {"run_dir": str(run_dir), "error": f"skipped: {skipped[phase]}"}
        elif run_dir.is_dir():
            runs[phase] = read_run(run_dir)
        else:
            runs[phase] = {"run_dir": str(run_dir), "error": "no run directory"}
    # The calibrate phase's XDG_CACHE_HOME is OUT/cache; only grpo-launch's folder in it holds calibrations (HF's
    # and matplotlib's JSON files may sit beside it).
    calibrations, foreign = read_calibrations(calibration_dir({"XDG_CACHE_HOME": str(out / "cache")}))
    doc = build_report(device=device, versions=versions, phases=phases, budget_s=BUDGET_S, runs=runs,
                       calibrations=calibrations, calibrations_skipped=foreign)  # fmt: skip
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(_summary(doc))
    for c in foreign:
        print(f"gpu_acceptance: {c['file']} is not a calibration: skipped ({c['why']})")
    print(f"gpu_acceptance: wrote {path}")
    if doc["problems"]:
        print("gpu_acceptance: failed:\n  - " + "\n  - ".join(doc["problems"]), file=sys.stderr)
        return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"] and len(argv) in (1, 3) and argv[1:2] in ([], ["--skip-file"]):
        return check(Path(argv[2]) if len(argv) == 3 else None)
    if argv[:1] == ["assets"] and len(argv) == 2:
        return assets(Path(argv[1]))
    if argv[:1] == ["report"] and len(argv) == 3:
        return report(Path(argv[1]), Path(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
