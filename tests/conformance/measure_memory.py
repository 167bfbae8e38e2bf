"""Measure the peak memory of real training micro-batches on CPU (run as a script, one process for all points).

argv[1]: a JSON list of points: Qwen2 dimensions (vocab, h, i, layers, heads, kv_heads), batch, prompt, completion,
ckpt; with ``experts`` and ``top_k`` a Qwen3-MoE of those dimensions (``i`` is then each expert's width); with
``head_dim`` alone a dense Qwen3 (per-head q/k norms, heads × head_dim wider than h, as Qwen3-0.6B's). For each
point the model is built in float32, TRL 1.16's fused LM head is added as GRPOTrainer adds it (log-probs and
entropy, ``trl.trainer.utils.add_fused_lm_head``), the gradients are allocated (steady state after a first step),
and one forward + backward runs on a left-padded batch scored on the completion tokens, with the GRPO loss's shape
(the log-probs; the entropy is a metric, outside the loss, as in TRL's default).

The peak is the process's resident-set high-water mark (VmHWM), reset before each point through
/proc/self/clear_refs, minus the resident set just before the forward. Large allocations go straight to mmap
(MALLOC_MMAP_THRESHOLD_ is set by the caller), so a freed tensor leaves the resident set at once.

Prints one JSON line: a list of {"params", "peak_bytes"} in the order of the points.
"""

from __future__ import annotations

import gc
import json
import os
import sys

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from trl.trainer.utils import add_fused_lm_head

from grpo_launch.probe.bench_memory import high_water_mark, reset_high_water_mark
from grpo_launch.probe.bench_memory import resident_bytes as resident


def measure(point: dict) -> dict:
    torch.manual_seed(0)
    dims = {
        "vocab_size": point["vocab"],
        "hidden_size": point["h"],
        "intermediate_size": point["i"],
        "num_hidden_layers": point["layers"],
        "num_attention_heads": point["heads"],
        "num_key_value_heads": point["kv_heads"],
        "max_position_embeddings": 8192,
        "tie_word_embeddings": True,
    }
    if point.get("experts"):  # a Qwen3-MoE: every layer sparse
        from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

        moe = {
            "num_experts": point["experts"],
            "num_experts_per_tok": point["top_k"],
            "moe_intermediate_size": point["i"],
        }
        config = Qwen3MoeConfig(**dims, **moe, head_dim=point["h"] // point["heads"])
        model = Qwen3MoeForCausalLM(config).float().train()
    elif point.get("head_dim"):  # a dense Qwen3 whose heads × head_dim is not the hidden size (Qwen3-0.6B's kind)
        from transformers import Qwen3Config, Qwen3ForCausalLM

        model = Qwen3ForCausalLM(Qwen3Config(**dims, head_dim=point["head_dim"])).float().train()
    else:
        model = Qwen2ForCausalLM(Qwen2Config(**dims)).float().train()
    if point["ckpt"]:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    batch, prompt, completion = point["batch"], point["prompt"], point["completion"]
    ids = torch.randint(0, point["vocab"], (batch, prompt + completion))
    mask = torch.ones_like(ids)
    mask[0, : prompt // 4] = 0  # a left-padded prompt: the batch carries a padding mask, as GRPO's do
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :-completion] = -100
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    gc.collect()
    reset_high_water_mark()
    base = resident()
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    (-out.log_probs.sum()).backward()
    peak = high_water_mark() - base
    params = sum(p.numel() for p in model.parameters())
    del model, out, ids, mask, labels
    gc.collect()
    return {"params": params, "peak_bytes": peak}


def main() -> None:
    torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))
    print(json.dumps([measure(p) for p in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
