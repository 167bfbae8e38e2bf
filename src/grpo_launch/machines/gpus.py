"""The GPU table: memory, dense bf16 peak and memory bandwidth of the GPUs people train on, and the names
NVML and ``--gpus`` give them. ``GIB`` is the one byte unit the package counts memory in."""

from __future__ import annotations

import re

from grpo_launch.spec import frozen

GIB = 1024**3


@frozen
class GpuSpec:
    """One GPU model: the memory its driver reports (GiB), dense bf16 tensor peak (half the sparse figure
    datasheets lead with; fp16 for parts without bf16), memory bandwidth, the size it is sold as, and its datasheet."""

    name: str
    memory_gib: float
    bf16_tflops: float  # dense
    bandwidth_tbs: float
    nominal_gb: int = 0  # the size in its name ("80GB"): a --gpus suffix of that size means this entry
    source: str = ""
    nvlink: bool = True  # a GPU-to-GPU fabric (NVLink, Infinity Fabric); else PCIe: NCCL's all-reduce, not vLLM's
    bf16: bool = True  # bf16 arithmetic (Ampere / CDNA2 and later); else training and vLLM run in fp16
    vendor: str = "nvidia"  # nvidia | amd (ROCm: HIP_VISIBLE_DEVICES must match CUDA_VISIBLE_DEVICES for vLLM)


GPU_SPECS: tuple[GpuSpec, ...] = (
    GpuSpec("H100-80GB", 79.6, 989.0, 3.35, 80,
            "NVIDIA H100 datasheet, SXM5: 80 GB HBM3, 3.35 TB/s, BF16 1,979 TF sparse"),
    GpuSpec("H100-PCIe", 79.6, 756.0, 2.0, 80, "NVIDIA H100 datasheet, PCIe: 80 GB HBM2e, 2 TB/s, BF16 1,513 TF sparse",
            nvlink=False),
    GpuSpec("H100-NVL", 93.0, 835.0, 3.9, 94, "NVIDIA H100 datasheet, NVL: 94 GB HBM3, 3.9 TB/s, BF16 1,671 TF sparse",
            nvlink=False),
    GpuSpec("H800", 79.6, 989.0, 3.35, 80, "NVIDIA H800 SXM5: the H100 SXM5 die and memory (H100 datasheet)"),
    GpuSpec("GH200", 95.0, 989.0, 4.0, 96, "NVIDIA GH200 Grace Hopper datasheet: 96 GB HBM3, 4 TB/s, 989 TF BF16"),
    GpuSpec("H200", 139.8, 989.0, 4.8, 141, "NVIDIA H200 datasheet, SXM: 141 GB HBM3e, 4.8 TB/s, BF16 1,979 TF sparse"),
    GpuSpec("H20", 95.6, 148.0, 4.0, 96, "NVIDIA H20 product brief: 96 GB HBM3, 4.0 TB/s, BF16 148 TF"),
    GpuSpec("B200", 178.0, 2250.0, 8.0, 180,
            "NVIDIA DGX B200 datasheet: 1,440 GB, 64 TB/s, 72 PF FP8 sparse for 8 GPUs"),
    GpuSpec("GB200", 184.0, 2500.0, 8.0, 186,
            "NVIDIA GB200 NVL72 datasheet: 13.4 TB HBM3e, 576 TB/s, 360 PF FP16/BF16 sparse for 72 GPUs"),
    GpuSpec("A100-80GB", 79.2, 312.0, 2.0, 80, "NVIDIA A100 datasheet, SXM 80GB: HBM2e 2,039 GB/s, BF16 624 TF sparse"),
    GpuSpec("A100-40GB", 39.4, 312.0, 1.55, 40, "NVIDIA A100 datasheet, 40GB: HBM2 1,555 GB/s, BF16 624 TF sparse"),
    GpuSpec("A800", 79.2, 312.0, 2.0, 80, "NVIDIA A800 80GB: the A100 80GB die and memory (A100 datasheet)"),
    GpuSpec("A40", 44.5, 149.7, 0.696, 48, "NVIDIA A40 datasheet: 48 GB GDDR6, 696 GB/s, BF16 299.4 TF sparse",
            nvlink=False),
    GpuSpec("L20", 44.5, 119.5, 0.86, 48, "NVIDIA L20 product brief: 48 GB GDDR6, 864 GB/s, BF16 119.5 TF",
            nvlink=False),
    GpuSpec("L40S", 44.5, 362.0, 0.86, 48, "NVIDIA L40S datasheet: 48 GB GDDR6, 864 GB/s, BF16 733 TF sparse",
            nvlink=False),
    GpuSpec("L40", 44.5, 181.0, 0.86, 48, "NVIDIA L40 datasheet: 48 GB GDDR6, 864 GB/s, BF16 362 TF sparse",
            nvlink=False),
    GpuSpec("L4", 22.0, 121.0, 0.3, 24, "NVIDIA L4 datasheet: 24 GB GDDR6, 300 GB/s, BF16 242 TF sparse", nvlink=False),
    GpuSpec("A6000", 47.5, 155.0, 0.77, 48, "NVIDIA RTX A6000 datasheet: 48 GB GDDR6, 768 GB/s, 309.7 TF tensor sparse",
            nvlink=False),
    GpuSpec("RTX6000-Ada", 47.5, 364.0, 0.96, 48,
            "NVIDIA RTX 6000 Ada datasheet: 48 GB GDDR6, 960 GB/s, FP8 1,457 TF sparse", nvlink=False),
    GpuSpec("A10G", 22.0, 70.0, 0.6, 24, "AWS EC2 G5 (A10G): 24 GB GDDR6, 600 GB/s", nvlink=False),
    GpuSpec("A10", 22.0, 125.0, 0.6, 24,
            "NVIDIA A10 datasheet: 24 GB GDDR6, 600 GB/s, BF16 250 TF sparse", nvlink=False),
    GpuSpec("RTX4090", 23.6, 165.0, 1.0, 24,
            "NVIDIA Ada architecture whitepaper, RTX 4090: 24 GB, 1,008 GB/s, 165.2 TF",
            nvlink=False),
    GpuSpec("RTX5090", 31.4, 209.5, 1.79, 32,
            "NVIDIA RTX Blackwell architecture whitepaper, RTX 5090: 32 GB GDDR7, 1,792 GB/s, FP16 419 TF sparse",
            nvlink=False),
    GpuSpec("RTX3090", 23.6, 71.0, 0.94, 24, "NVIDIA Ampere GA102 whitepaper, RTX 3090: 24 GB, 936 GB/s, 71 TF FP16",
            nvlink=False),
    GpuSpec("V100-32GB", 31.7, 125.0, 0.9, 32, "NVIDIA V100 datasheet, SXM2: 32 GB HBM2, 900 GB/s, 125 TF FP16 tensor",
            bf16=False),
    GpuSpec("V100-16GB", 15.8, 125.0, 0.9, 16, "NVIDIA V100 datasheet, SXM2: 16 GB HBM2, 900 GB/s, 125 TF FP16 tensor",
            bf16=False),
    GpuSpec("T4", 15.0, 65.0, 0.32, 16, "NVIDIA T4 datasheet: 16 GB GDDR6, 320 GB/s, 65 TF FP16 mixed precision",
            nvlink=False, bf16=False),
    # AMD Instinct: a ROCm device per GCD (an MI250X is two).
    GpuSpec("MI250X", 63.9, 191.5, 1.6, 64,
            "AMD Instinct MI250X datasheet: 128 GB HBM2e, 3.2 TB/s, 383 TF BF16 over its two GCDs", vendor="amd"),
    GpuSpec("MI300X", 191.5, 1307.4, 5.3, 192, "AMD Instinct MI300X datasheet: 192 GB HBM3, 5.3 TB/s, 1,307.4 TF BF16",
            vendor="amd"),
    GpuSpec("MI325X", 255.5, 1307.4, 6.0, 256, "AMD Instinct MI325X datasheet: 256 GB HBM3E, 6 TB/s, 1,307.4 TF BF16",
            vendor="amd"),
)  # fmt: skip


# NVML names ("NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "NVIDIA GeForce RTX 4090") → table names.
_GPU_ALIASES: tuple[tuple[str, str], ...] = (
    (r"gb200", "GB200"),  # before B200
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
    (r"\ba40\b", "A40"),
    (r"5090", "RTX5090"),
    (r"v100.*16", "V100-16GB"),
    (r"v100", "V100-32GB"),
    (r"\bt4\b", "T4"),
    (r"mi250", "MI250X"),
    (r"mi300", "MI300X"),
    (r"mi325", "MI325X"),
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


def find_sold_as(model: str, size_gb: float) -> GpuSpec | None:
    """The table entry for ``model`` sold with ``size_gb`` GB: the family's entry of that size where there is one
    (``H100-94GB`` is the H100 NVL, not the 80 GB SXM part the name alone means), else the name's entry."""
    named = find_gpu_spec(f"{model}-{size_gb:g}GB") or find_gpu_spec(model)
    if named is not None and named.nominal_gb == size_gb:
        return named
    family = model.lower().split("-")[0]
    sized = [s for s in GPU_SPECS if s.nominal_gb == size_gb and s.name.lower().split("-")[0] == family]
    return sized[0] if len(sized) == 1 else named


def sold_sizes(model: str) -> tuple[int, ...]:
    """The sizes (GB) that GPUs called ``model`` are sold with: its own entry's and those of the entries of its
    family (``H100``: the 80 GB SXM and PCIe parts and the 94 GB NVL). A ``--gpus`` size in GB outside these is a
    typo (``8xH100-800GB``), not a GPU: no product of that name has it."""
    family = model.lower().split("-")[0]
    named = find_gpu_spec(model)
    sizes = {s.nominal_gb for s in GPU_SPECS if s.name.lower().split("-")[0] == family}
    if named is not None:
        sizes.add(named.nominal_gb)
    return tuple(sorted(sizes))
