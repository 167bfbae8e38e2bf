"""The GPU table: memory, dense bf16 peak and memory bandwidth of the GPUs people train on, and the names
NVML and ``--gpus`` give them. ``GIB`` is the one byte unit the package counts memory in."""

from __future__ import annotations

import re

from grpo_launch.spec import frozen

GIB = 1024**3


@frozen
class GpuSpec:
    name: str
    memory_gib: float
    bf16_tflops: float  # dense
    bandwidth_tbs: float
    nvlink: bool = True  # the GPUs of a server talk over NVLink (else PCIe: NCCL's all-reduce, not vLLM's own)


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H100-80GB", 79.6, 989.0, 3.35),
    GpuSpec("H100-PCIe", 79.6, 756.0, 2.0, nvlink=False),
    GpuSpec("H100-NVL", 93.0, 835.0, 3.9, nvlink=False),
    GpuSpec("H800", 79.6, 989.0, 3.35),
    GpuSpec("GH200", 95.0, 989.0, 4.0),
    GpuSpec("H200", 139.8, 989.0, 4.8),
    GpuSpec("H20", 95.6, 148.0, 4.0),
    GpuSpec("B200", 178.0, 2250.0, 8.0),
    GpuSpec("A100-80GB", 79.2, 312.0, 2.0),
    GpuSpec("A100-40GB", 39.4, 312.0, 1.55),
    GpuSpec("A800", 79.2, 312.0, 2.0),
    GpuSpec("L20", 44.5, 119.5, 0.86, nvlink=False),
    GpuSpec("L40S", 44.5, 362.0, 0.86, nvlink=False),
    GpuSpec("L40", 44.5, 181.0, 0.86, nvlink=False),
    GpuSpec("L4", 22.0, 121.0, 0.3, nvlink=False),
    GpuSpec("A6000", 47.5, 155.0, 0.77, nvlink=False),
    GpuSpec("RTX6000-Ada", 47.5, 364.0, 0.96, nvlink=False),
    GpuSpec("A10G", 22.0, 70.0, 0.6, nvlink=False),
    GpuSpec("A10", 22.0, 125.0, 0.6, nvlink=False),
    GpuSpec("RTX4090", 23.6, 165.0, 1.0, nvlink=False),
    GpuSpec("RTX3090", 23.6, 71.0, 0.94, nvlink=False),
)


# NVML names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090") → table names.
_GPU_ALIASES: tuple[tuple[str, str], ...] = (
    (r"h100.*pcie", "H100-PCIe"),
    (r"h100.*nvl", "H100-NVL"),
    (r"gh200", "GH200"),
    (r"h800", "H800"),
    (r"h100", "H100-80GB"),
    (r"h200", "H200"),
    (r"h20\b", "H20"),
    (r"b200", "B200"),
    (r"a100.*40", "A100-40GB"),
    (r"a100", "A100-80GB"),
    (r"a800", "A800"),
    (r"l40s", "L40S"),
    (r"l40\b", "L40"),
    (r"l20\b", "L20"),
    (r"\bl4\b", "L4"),
    (r"rtx ?6000 ?ada|6000 ada", "RTX6000-Ada"),
    (r"a6000", "A6000"),
    (r"a10g", "A10G"),
    (r"\ba10\b", "A10"),
    (r"4090", "RTX4090"),
    (r"3090", "RTX3090"),
)


def find_gpu_spec(name: str) -> GpuSpec | None:
    """The table entry for a GPU name as NVML or a ``--gpus`` spec spells it, or None."""
    key = name.lower().replace("_", " ").replace("nvidia", "").replace("geforce", "").strip()
    by_name = {s.name.lower(): s for s in GPU_SPECS}
    if key in by_name:
        return by_name[key]
    for pattern, target in _GPU_ALIASES:
        if re.search(pattern, key):
            return by_name[target.lower()]
    return None
