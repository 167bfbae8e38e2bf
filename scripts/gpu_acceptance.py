"""The Python half of scripts/gpu_acceptance.sh (issue 39): the version check, the random-weight assets built from
the project's own model shapes, and the one JSON the acceptance run writes. Nothing is downloaded.

    python scripts/gpu_acceptance.py check                      # the GPU stack, with a clear message when it is not
    python scripts/gpu_acceptance.py assets OUT_DIR             # models (config from models/builtin.py), data, recipes
    python scripts/gpu_acceptance.py report OUT_DIR JSON_PATH   # measured against predicted, one JSON

The report reads the 5-step run the way ``grpo-launch status`` does (rundir.measured.measure) and compares its mean
warm step time and its peak GPU memory with what the run's own plan.json predicted. :func:`build_report` is pure: the
CPU test (tests/test_gpu_acceptance.py) gives it a fake measurement and checks the schema.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

SCHEMA = "grpo-launch/gpu-acceptance/1"
BUDGET_S = 480  # 8 minutes on one H100 or H200, the whole script (issue 39)
# The shapes calibrated (random weights) and the one the 5-step colocated run trains: built-in shapes, not the Hub.
CALIBRATED = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-1.5B-Instruct")
RUN_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"
RUN_STEPS = 5
# The stack, as TRL 1.16's own metadata pins it: accelerate>=1.10.1, transformers>=4.56.2, vllm>=0.22.0,<=0.31.0
# (trl/import_utils.py refuses a vLLM outside that range); torch is whatever vLLM brings, a CUDA build.
NEEDS = {"torch": "2.6", "transformers": "4.56.2", "trl": "1.16", "vllm": "0.22.0", "accelerate": "1.10.1"}
VLLM_RANGE = ("0.22", "0.31")


def _version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+")[0])[:3])


def stack_problems(versions: Mapping[str, str | None], cuda_devices: int) -> list[str]:
    """What keeps this environment from running the acceptance: a missing package, one too old, vLLM outside TRL's
    range, no CUDA GPU. Empty when it can run."""
    problems = []
    for name, least in NEEDS.items():
        have = versions.get(name)
        if have is None:
            problems.append(f"{name} is not installed (need ≥ {least})")
        elif _version_tuple(have) < _version_tuple(least):
            problems.append(f"{name} {have} is older than {least}")
    vllm = versions.get("vllm")
    if vllm is not None and _version_tuple(vllm)[:2] > _version_tuple(VLLM_RANGE[1])[:2]:
        problems.append(f"vllm {vllm} is newer than TRL 1.16 supports ({VLLM_RANGE[0]}–{VLLM_RANGE[1]})")
    torch = versions.get("torch") or ""
    if "+cpu" in torch:
        problems.append(f"torch {torch} is a CPU build")
    elif cuda_devices < 1:
        problems.append("no CUDA GPU is visible (torch.cuda.device_count() is 0)")
    return problems


def installed_versions() -> dict[str, str | None]:
    """The installed version of each package the run needs (None: missing)."""
    from importlib import metadata

    versions: dict[str, str | None] = {}
    for name in NEEDS:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def check() -> int:
    """Exit 0 when the stack is installed and a GPU is visible, else 3 with what is missing (no traceback)."""
    versions = installed_versions()
    devices = 0
    if versions.get("torch"):
        import torch

        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    print("stack: " + ", ".join(f"{k} {v or 'missing'}" for k, v in versions.items()) + f"; CUDA GPUs {devices}")
    problems = stack_problems(versions, devices)
    if problems:
        print("gpu_acceptance: this environment cannot run the acceptance:\n  - " + "\n  - ".join(problems))
        print(
            "It installs nothing (offline): run it where the GPU stack is installed, e.g. a venv made with\n"
            "  pip install -e . 'trl==1.16.*' 'vllm>=0.22,<0.32'   (GPU torch comes with vllm)\n"
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


def _recipe(model_dir: Path, data: Path, run_dir: Path, allowed: list[int]) -> str:
    """The 5-step colocated GRPO run on one GPU: 16 prompts × 8 completions of 256 tokens per optimizer step (steps
    of seconds, long enough to time; small enough that 5 of them and vLLM's start fit the run's cap).

    The random model's vocabulary is the shape's (151,936) and the tokenizer's is tiny: sampling is kept to the
    tokenizer's ids without its end-of-sequence (``allowed_token_ids``, which TRL passes to vLLM's SamplingParams),
    so every completion runs to the maximum, the length the plan is told to expect (expected_completion_length):
    the measured and the predicted work are the same."""
    import yaml

    values = {
        "model_name_or_path": str(model_dir), "dataset_name": str(data), "dataset_prompt_column": "prompt",
        "dataset_answer_column": "answer", "reward_funcs": ["digits"], "num_generations": 8,
        "per_device_train_batch_size": 32, "gradient_accumulation_steps": 4, "max_prompt_length": 64,
        "max_completion_length": 256, "temperature": 1.0, "generation_kwargs": {"allowed_token_ids": allowed},
        "learning_rate": 1.0e-6, "max_steps": RUN_STEPS, "logging_steps": 1, "save_strategy": "no",
        "report_to": "none", "seed": 42, "bf16": True, "gradient_checkpointing": True,
        "launch": {"vllm": "colocate", "expected_completion_length": 256, "run_dir": str(run_dir)},
    }  # fmt: skip
    return yaml.safe_dump(values, sort_keys=False, default_flow_style=None, width=120)


def assets(out: Path) -> int:
    """Random-weight models of the built-in shapes (weights only for the model the run trains: calibrate's
    --random-weights needs the config alone), the tiny tokenizer and arithmetic data of scripts/make_tiny_assets.py,
    and the recipes."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_tiny_assets as tiny

    tiny_dir = out / "tiny"
    tiny.make_dataset(tiny_dir / "data" / "train.jsonl", n=512)
    tiny.make_model(tiny_dir / "model")  # for its tokenizer (≈1 s)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dir / "model")
    for model in CALIBRATED:
        name = model.rsplit("/", 1)[-1]
        target = out / "models" / name
        target.mkdir(parents=True, exist_ok=True)
        cfg = hf_config(model) | {"eos_token_id": tok.eos_token_id, "pad_token_id": tok.pad_token_id}
        (target / "config.json").write_text(json.dumps(cfg, indent=1))
        tok.save_pretrained(target)
        if model == RUN_MODEL and not (target / "model.safetensors").exists():
            import torch
            from transformers import Qwen2Config, Qwen2ForCausalLM

            torch.manual_seed(0)
            config = Qwen2Config(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
            weights: Any = Qwen2ForCausalLM(config)
            weights.to(torch.bfloat16).save_pretrained(target)
        recipe = out / f"recipe-{name}.yaml"
        allowed = [i for i in range(len(tok)) if i not in (tok.eos_token_id, tok.pad_token_id)]
        recipe.write_text(_recipe(target, tiny_dir / "data" / "train.jsonl", out / "run", allowed))
        print(f"assets: {target} ({cfg['num_hidden_layers']} layers, hidden {cfg['hidden_size']}) → {recipe}")
    return 0


def build_report(
    *,
    device: str,
    versions: Mapping[str, str | None],
    phases: list[Mapping[str, Any]],
    budget_s: float,
    measured: Mapping[str, Any] | None,
    predicted: Mapping[str, Any] | None,
    calibrations: list[str],
    calibrated: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The acceptance JSON. ``measured``: steps, step_s (warm mean), generation_s, training_s, peak_memory_gib,
    memory_kind; ``predicted``: step_s, generation_s, training_s, train_memory_gib, vllm_memory_gib (plan.json);
    ``calibrated``: each calibration's memory and weight sync against the model (:func:`calibration_summaries`).
    Ratios are measured ÷ predicted; None where either side is missing."""

    def ratio(m: float | None, p: float | None) -> float | None:
        return m / p if m is not None and p else None

    m, p = dict(measured or {}), dict(predicted or {})
    colocated = (p.get("train_memory_gib") or 0.0) + (p.get("vllm_memory_gib") or 0.0) or None
    elapsed = sum(float(ph.get("seconds", 0.0)) for ph in phases)
    return {
        "schema": SCHEMA,
        "device": device,
        "versions": dict(versions),
        "budget_s": budget_s,
        "elapsed_s": round(elapsed, 1),
        "within_budget": elapsed <= budget_s,
        "phases": [dict(ph) for ph in phases],
        "calibrations": sorted(calibrations),
        "calibrated": [dict(c) for c in calibrated or []],
        "run": {"model": RUN_MODEL, "steps": RUN_STEPS, "measured": m or None, "predicted": p or None},
        "comparison": {
            "step_s": ratio(m.get("step_s"), p.get("step_s")),
            "generation_s": ratio(m.get("generation_s"), p.get("generation_s")),
            "training_s": ratio(m.get("training_s"), p.get("training_s")),
            # a colocated trainer's CUDA peak holds vLLM's share too (same process): compared with both
            "peak_memory_vs_train": ratio(m.get("peak_memory_gib"), p.get("train_memory_gib")),
            "peak_memory_vs_train_and_vllm": ratio(m.get("peak_memory_gib"), colocated),
        },
    }


def calibration_summaries(folder: Path) -> list[dict[str, Any]]:
    """What each calibration in ``folder`` measured against the model, read by grpo-launch's own reader: the
    training step's peak memory against the memory model's tensors (with and without activation checkpointing),
    and the weight sync (its path, its seconds, and the table's within a node, where it is NCCL's)."""
    from grpo_launch.planning.calibration import step_peak_points
    from grpo_launch.probe.calibration import read_calibration

    out = []
    for path in sorted(folder.rglob("*.json")):
        t = read_calibration(path).terms
        peaks = [{"checkpointing": ckpt, "measured_gib": measured / 2**30, "predicted_gib": predicted / 2**30,
                  "ratio": measured / predicted} for ckpt, predicted, measured in step_peak_points(t)]  # fmt: skip
        out.append({"file": path.name, "device": t.device, "step_peak": peaks, "sync_s": t.sync_s,
                    "sync_path": t.sync_path or None})  # fmt: skip
    return out


def _run_values(run_dir: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(measured, predicted) of a run directory, read by the launcher's own reader; (None, None) without steps."""
    from grpo_launch.errors import GrpoLaunchError
    from grpo_launch.rundir.measured import measure
    from grpo_launch.rundir.view import RunView

    try:
        m = measure(RunView.load(run_dir, strict=False))
    except (GrpoLaunchError, OSError) as exc:
        print(f"gpu_acceptance: no measurement in {run_dir}: {exc}")
        return None, None
    measured = {
        "steps": m.steps,
        "step_s": m.step_s,
        "generation_s": m.generation_s,
        "training_s": m.training_s,
        "peak_memory_gib": m.peak_memory_bytes / 2**30 if m.peak_memory_bytes else None,
        "memory_kind": m.memory_kind,
        "mean_completion_len": m.mean_completion_len,
    }
    predicted = None
    if m.prediction is not None:
        pr = m.prediction
        predicted = {"step_s": pr.step_s, "generation_s": pr.trainer_generation_s, "training_s": pr.training_s,
                     "train_memory_gib": pr.train_memory_gib}  # fmt: skip
        plan = json.loads((run_dir / "plan.json").read_text())
        vllm = (plan.get("estimate") or {}).get("vllm_memory_per_gpu_gib") or {}
        predicted["vllm_memory_gib"] = vllm.get("total")
    return measured, predicted


def report(out: Path, path: Path) -> int:
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
    measured, predicted = _run_values(out / "run") if (out / "run").exists() else (None, None)
    cache = out / "cache"  # XDG_CACHE_HOME of the calibrate phases
    calibrations = [str(p.relative_to(out)) for p in cache.rglob("*.json")] if cache.exists() else []
    calibrated = calibration_summaries(cache) if cache.exists() else []
    doc = build_report(device=device, versions=versions, phases=phases, budget_s=BUDGET_S, measured=measured,
                       predicted=predicted, calibrations=calibrations, calibrated=calibrated)  # fmt: skip
    path.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"gpu_acceptance: wrote {path}")
    print(json.dumps(doc["comparison"], indent=1))
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["check"]:
        return check()
    if argv[:1] == ["assets"] and len(argv) == 2:
        return assets(Path(argv[1]))
    if argv[:1] == ["report"] and len(argv) == 3:
        return report(Path(argv[1]), Path(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
