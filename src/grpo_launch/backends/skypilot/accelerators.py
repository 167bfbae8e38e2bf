"""SkyPilot's accelerator names (``--accelerators H100:8``) and the GPU of our table each one is, to plan memory
and step time before anything is rented. Pure: SkyPilot itself is never imported (its catalog needs the network)."""

from __future__ import annotations

import re

from grpo_launch.errors import ConfigError, short
from grpo_launch.machines.gpus import GpuSpec, find_gpu_spec
from grpo_launch.machines.topology import MAX_GPUS_PER_NODE

# SkyPilot accelerator name → the GPU table's name. The names are those of SkyPilot 0.14's catalog (schema v8:
# CATALOG_SCHEMA_VERSION in sky/skylet/constants.py), file common/accelerators.csv of
# https://github.com/skypilot-org/skypilot-catalog (catalogs/v8/common/accelerators.csv), which `sky show-gpus`
# lists. Only GPUs whose memory our table knows are here: the plan must check memory before a cluster is rented.
# SkyPilot's "A100" is the 40 GB part and "V100" the 16 GB one (their 80 GB / 32 GB parts have their own names);
# the H100 variants are all 80 GB SXM or PCIe parts (NVL: 94 GB).
SKY_ACCELERATORS: dict[str, str] = {
    "A10": "A10",
    "A10G": "A10G",
    "A100": "A100-40GB",
    "A100-80GB": "A100-80GB",
    "A100-80GB-SXM": "A100-80GB",
    "A40": "A40",
    "A6000": "A6000",
    "RTXA6000": "A6000",
    "A800": "A800",
    "B200": "B200",
    "GH200": "GH200",
    "H100": "H100-80GB",
    "H100-MEGA": "H100-80GB",
    "H100-SXM": "H100-80GB",
    "H100-NVLINK": "H100-80GB",
    "H100-NVL": "H100-NVL",
    "H200": "H200",
    "H200-SXM": "H200",
    "L4": "L4",
    "L40": "L40",
    "L40S": "L40S",
    "MI300X": "MI300X",
    "RTX3090": "RTX3090",
    "RTX4090": "RTX4090",
    "RTX5090": "RTX5090",
    "RTX6000-Ada": "RTX6000-Ada",
    "RTX6000Ada": "RTX6000-Ada",
    "T4": "T4",
    "V100": "V100-16GB",
    "V100-32GB": "V100-32GB",
}
_FORM = re.compile(r"(?P<name>[A-Za-z][A-Za-z0-9_.-]*)(?::(?P<count>[^:]*))?")
ACCELERATORS_HINT = (
    "Write NAME:COUNT with a SkyPilot accelerator name, e.g. --accelerators H100:8 (`sky show-gpus` lists them)."
)


def parse_accelerators(value: str) -> tuple[str, GpuSpec, int]:
    """``--accelerators NAME[:COUNT]`` → SkyPilot's spelling of the name, our GPU spec, and the count per node."""
    match = _FORM.fullmatch(value.strip())
    if match is None:
        raise ConfigError(f"--accelerators {short(value)} is not NAME:COUNT", hint=ACCELERATORS_HINT)
    name, count_text = match["name"], match["count"]
    sky_name = next((k for k in SKY_ACCELERATORS if k.lower() == name.lower()), None)
    if sky_name is None:
        known = ", ".join(sorted(SKY_ACCELERATORS))
        raise ConfigError(
            f"--accelerators {short(value)}: {name!r} is not a SkyPilot GPU grpo-launch can plan for",
            hint=f"e.g. --accelerators H100:8. The SkyPilot names grpo-launch knows: {known} "
            "(`sky show-gpus` lists what your clouds offer).",
        )
    count = 1
    if count_text is not None:
        if not (count_text.isascii() and count_text.isdigit()):
            raise ConfigError(
                f"--accelerators {short(value)}: the count {count_text!r} is not a whole number of GPUs per node",
                hint=f"e.g. --accelerators {sky_name}:8 (fractions of a GPU cannot train).",
            )
        count = int(count_text)
    if not 1 <= count <= MAX_GPUS_PER_NODE:
        raise ConfigError(
            f"--accelerators {short(value)}: the count must be from 1 to {MAX_GPUS_PER_NODE} GPUs per node",
            hint=f"e.g. --accelerators {sky_name}:8; leave --accelerators out for CPU nodes (a use_cpu recipe).",
        )
    spec = find_gpu_spec(SKY_ACCELERATORS[sky_name])
    assert spec is not None, sky_name  # every entry names a row of the table (tested)
    return sky_name, spec, count
