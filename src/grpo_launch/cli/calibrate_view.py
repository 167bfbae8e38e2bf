"""What ``grpo-launch calibrate`` prints once it has measured: each measured term in words (beside the memory
model's where it has one), what was not measured and why, the files written, and what ``plan`` will take from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from grpo_launch.cli.tables import Section, print_sections
from grpo_launch.planning.measured_scales import activation_points, step_peak_points


def show(record: Any, model: Any, paths: list[Path]) -> None:
    terms, key = record.terms, record.key
    at = {k: int(v) for k, v in record.at}
    print_sections(
        [
            Section(f"calibration of {model.name} on {terms.device} ({key.dtype}) in {record.seconds:.0f} s"),
            Section("measured", rows=tuple((line,) for line in measured_lines(terms, model, at)), table=False),
            Section("not measured", rows=tuple((line,) for line in record.not_measured), table=False),
            Section("written", rows=tuple((str(p),) for p in paths), table=False),
            Section(f"plan uses it for: {', '.join(record.measured_terms())}", style="cyan"),
        ]
    )


def measured_lines(t: Any, model: Any, at: dict[str, int]) -> list[str]:
    lines = [
        f"decode ({path}): " + ", ".join(f"batch {b}: {s * 1000:.1f} ms/step" for b, s in points)
        for path, points in (
            ("transformers generate", t.decode),
            ("continuous batching", t.cb_decode),
            ("vLLM", t.vllm_decode),
        )
        if points
    ]
    if t.prefill_s:
        lines.append(f"prefill ({t.prefill_batch or 'one micro-batch of'} prompts): {t.prefill_s * 1000:.1f} ms")
    head = "TRL's fused LM head" if t.fused_head else "torch's log-softmax over the whole logits"
    rates = [
        (f"training step ({head}, no distributed engine)", t.train_tokens_per_s),
        ("with activation checkpointing", t.train_tokens_per_s_ckpt),
        ("forward alone", t.forward_tokens_per_s),
    ]
    shown = [f"{what}: {rate:,.0f} tokens/s" for what, rate in rates if rate]  # 0: not measured (named below)
    if shown:
        lines.append("; ".join(shown))
    for backend, ckpt, rate in t.backend_train:
        lines.append(
            f"training step through {backend}{' with activation checkpointing' if ckpt else ''}: {rate:,.0f} tokens/s"
        )
    if t.imports_s:
        lines.append(f"imports (torch, transformers, TRL): {t.imports_s:.1f} s")
    if t.load_s is not None:
        what = f"{t.load_bytes / 1e9:.2f} GB from disk" if t.load_bytes else "an initialisation, not a load"
        lines.append(f"model load: {t.load_s:.1f} s ({what})")
    if t.save_bytes_per_s:
        lines.append(f"disk write (the weights as safetensors, with fsync): {t.save_bytes_per_s / 1e9:.2f} GB/s")
    if t.warmup_decode_s_per_step is not None:
        lines.append(f"first generation's warm-up: {t.warmup_decode_s_per_step * 1000:.1f} ms per decode step")
    if t.warmup_training_s is not None:
        lines.append(f"first training step's warm-up: {t.warmup_training_s:.2f} s")
    if t.cuda_init_s is not None:
        lines.append(f"CUDA's start in a fresh process: {t.cuda_init_s:.1f} s")
    if t.process_group_s is not None:
        lines.append(f"a process group's start (world size 1): {t.process_group_s:.2f} s")
    if t.deepspeed_init_s is not None:
        lines.append(f"DeepSpeed's engine start: {t.deepspeed_init_s:.1f} s")
    if t.engine_start_s is not None:
        lines.append(f"vLLM start-up: {t.engine_start_s:.1f} s")
    if t.peak_memory_bytes:
        lines.append(
            f"peak memory of the training step: {t.peak_memory_bytes / 2**30:.2f} GiB; with activation "
            f"checkpointing {(t.peak_memory_bytes_ckpt or 0) / 2**30:.2f} GiB"
        )
    for ckpt, predicted, measured in step_peak_points(t):
        used = (
            ""
            if t.device != "cpu"
            else ": a CPU resident set with the libraries, not what the GPU estimate counts (not used)"
        )
        lines.append(
            f"training step's peak memory{' (checkpointing)' if ckpt else ''} (fused LM head, AdamW): "
            f"{measured / 2**30:.3f} GiB; the memory model {predicted / 2**30:.3f} GiB "
            f"(× {measured / predicted:.2f}){used}"
        )
    if t.overhead_steps:
        lines.append(
            f"TRL's own time per step ({t.overhead_steps} real steps): generation + "
            f"{t.overhead_generation_s * 1000:.0f} ms, training + {t.overhead_training_s * 1000:.0f} ms"
        )
    point = (at.get("per_device_train_batch_size", 1), at.get("prompt_len", 1), at.get("completion_len", 1))
    for ckpt, modelled, measured in activation_points(model, t, *point):
        lines.append(
            f"activation memory of one micro-batch{' (checkpointing)' if ckpt else ''}: "
            f"{measured / 2**20:,.1f} MiB; the memory model {modelled / 2**20:,.1f} MiB "
            f"(× {measured / modelled:.2f})"
        )
    if t.sync_s is not None:
        caveat = "" if t.sync_path == "nccl" else " (not TRL's path, which needs CUDA: never used for a GPU plan)"
        lines.append(
            f"weight sync trainer → server over {t.sync_path}: {t.sync_s * 1000:,.1f} ms for the whole model" + caveat
        )
    if t.threads:
        lines.append(f"threads per process: {t.threads} (as the run's OMP_NUM_THREADS)")
    return lines
