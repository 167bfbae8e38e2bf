"""AMD GPUs (ROCm): planned with --gpus (MI250X/MI300X/MI325X are in the table), probed through amdsmi where NVML
finds no NVIDIA driver (a stand-in reader here, as NVML's is: no AMD GPU or driver on this machine), and started
with the visibility variables ROCm's torch and vLLM read, checked by their own code."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest

from grpo_launch.errors import ProbeError
from grpo_launch.probe.local import NvmlDevice, probe_local
from grpo_launch.render.processes import all_processes

from .conformance.grid import VLLM_PY
from .helpers import ROOT, plan_recipe, require_vllm

MI300X = [NvmlDevice(i, "AMD Instinct MI300X", 192 * 2**30, f"uuid-{i}") for i in range(8)]


def no_nvml():
    raise RuntimeError("NVML Shared Library Not Found")


def test_amd_gpus_are_probed_through_amdsmi_with_rocms_visibility():
    t = probe_local({}, read=no_nvml, read_amd=lambda: MI300X, hostname="mi")
    assert (t.source, t.num_gpus, t.planning_gpu_spec.name, t.is_rocm) == ("amdsmi", 8, "MI300X", True)
    # torch on ROCm prefers HIP_VISIBLE_DEVICES to CUDA_VISIBLE_DEVICES
    t = probe_local({"HIP_VISIBLE_DEVICES": "4,5"}, read=no_nvml, read_amd=lambda: MI300X)
    assert [g.visible_id for g in t.hosts[0].gpus] == ["4", "5"]
    with pytest.raises(ProbeError, match=r"HIP_VISIBLE_DEVICES.*differ"):
        probe_local(
            {"HIP_VISIBLE_DEVICES": "0,1", "CUDA_VISIBLE_DEVICES": "2,3"}, read=no_nvml, read_amd=lambda: MI300X
        )
    t = probe_local({}, read=no_nvml, read_amd=lambda: [])  # neither vendor: CPU, with NVML's reason
    assert t.is_cpu and "NVML unavailable" in t.warnings[0]


def _vllm_sync_function():
    """vLLM's own _sync_hip_cuda_env_vars, taken from vllm/platforms/rocm.py in .venv-vllm (the module itself
    cannot be imported without a ROCm torch)."""
    where = "import importlib.util as u; print(u.find_spec('vllm').submodule_search_locations[0])"
    out = subprocess.run([str(VLLM_PY), "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    tree = ast.parse(Path(out, "platforms", "rocm.py").read_text())
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "_sync_hip_cuda_env_vars"]
    namespace: dict = {}
    exec(compile(ast.Module([fn], []), "vllm/platforms/rocm.py", "exec"), namespace)
    return namespace


def test_every_process_on_amd_gpus_passes_vllms_and_torchs_visibility_checks():
    require_vllm()
    import torch

    plan = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "8xMI300X", "launch.vllm=server")
    namespace = _vllm_sync_function()
    for spec in all_processes(plan):
        env = spec.launch_env
        assert env["HIP_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"], spec.name
        fake_os = mock.MagicMock(environ=dict(env))
        namespace["os"] = fake_os
        namespace["_sync_hip_cuda_env_vars"]()  # vLLM raises ValueError on inconsistent variables
        with mock.patch.dict(os.environ, env), mock.patch.object(torch.version, "hip", "6.2"):
            assert torch.cuda._parse_visible_devices() == [int(g) for g in spec.gpus]
    # The same check catches the inconsistency a parent's HIP_VISIBLE_DEVICES would have caused.
    namespace["os"] = mock.MagicMock(environ={"HIP_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "CUDA_VISIBLE_DEVICES": "4"})
    with pytest.raises(ValueError, match="Inconsistent"):
        namespace["_sync_hip_cuda_env_vars"]()
    nvidia = plan_recipe(ROOT / "recipes" / "qwen7b-math.yaml", "8xH100-80GB", "launch.vllm=server")
    assert not any("HIP_VISIBLE_DEVICES" in s.launch_env for s in all_processes(nvidia))


def test_the_remote_shim_picks_from_the_rocm_list_and_keeps_both_variables_equal():
    code = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], os.environ.get('HIP_VISIBLE_DEVICES'))"
    env = {k: v for k, v in os.environ.items() if not k.endswith("VISIBLE_DEVICES")}
    run = lambda extra: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "grpo_launch.node.shim", "--gpus", "1,2", "--", sys.executable, "-c", code],
        capture_output=True, text=True, cwd=ROOT, env={**env, **extra}, check=True).stdout.split()  # fmt: skip
    assert run({"HIP_VISIBLE_DEVICES": "4,5,6,7"}) == ["5,6", "5,6"]
    assert run({"ROCR_VISIBLE_DEVICES": "0,1,2,3"}) == ["1,2", "1,2"]  # Slurm's AMD gres sets ROCR
    assert run({"CUDA_VISIBLE_DEVICES": "4,5,6,7"}) == ["5,6", "None"]  # NVIDIA: as before
