"""Topology probing. NVML itself needs an NVIDIA driver, which CI machines lack: those tests pass a fake NVML
reader (a list of NvmlDevice) in place of pynvml — the real reader runs on this machine and must fall back."""

from __future__ import annotations

import pytest

from grpo_launch.backends.hostfile import parse_hostfile, probe_hostfile
from grpo_launch.backends.slurm.allocation import expand_nodelist, probe_slurm, srun_spec
from grpo_launch.errors import ProbeError
from grpo_launch.machines.gpus import GPU_SPECS, find_gpu_spec
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.probe.local import NvmlDevice, parse_cuda_visible_devices, probe_local
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT

GIB = 1024**3
FOUR_L20 = [NvmlDevice(i, "NVIDIA L20", 48 * GIB, f"GPU-aaaa000{i}-1111-2222-3333-444455556666") for i in range(4)]


def fake(devices):
    return lambda: list(devices)


def test_all_gpus_without_cvd():
    t = probe_local({}, read=fake(FOUR_L20), hostname="box")
    assert t.num_gpus == 4 and t.hosts[0].gpus[0].name == "NVIDIA L20" and t.source == "nvml"


def test_cvd_indices_keep_the_users_tokens():
    t = probe_local({"CUDA_VISIBLE_DEVICES": "2,0"}, read=fake(FOUR_L20), hostname="box")
    assert [g.visible_id for g in t.hosts[0].gpus] == ["2", "0"]
    assert t.hosts[0].gpus[0].uuid == FOUR_L20[2].uuid


def test_cvd_uuid_prefix_and_mig():
    mig = NvmlDevice(0, "NVIDIA A100-SXM4-80GB", 80 * GIB, "GPU-bbbb", mig=(("MIG-1234abcd-0000", 10 * GIB),))
    t = probe_local(
        {"CUDA_VISIBLE_DEVICES": "GPU-aaaa0001,MIG-1234abcd-0000"}, read=fake([*FOUR_L20[:2], mig]), hostname="b"
    )
    assert [g.visible_id for g in t.hosts[0].gpus] == ["GPU-aaaa0001", "MIG-1234abcd-0000"]
    assert t.hosts[0].gpus[1].memory_bytes == 10 * GIB


@pytest.mark.parametrize("value", ["abc", "0,0", "1;2", "0,,1", "GPU-", "-3"])
def test_garbage_cvd(value):
    with pytest.raises(ProbeError, match="CUDA_VISIBLE_DEVICES"):
        parse_cuda_visible_devices(value)


def test_cvd_out_of_range():
    with pytest.raises(ProbeError, match="names GPU 7, but this machine has 4"):
        probe_local({"CUDA_VISIBLE_DEVICES": "7"}, read=fake(FOUR_L20), hostname="box")


def test_empty_cvd_is_cpu():
    assert probe_local({"CUDA_VISIBLE_DEVICES": ""}, read=fake(FOUR_L20)).is_cpu


def test_nvml_failure_falls_back_with_a_warning():
    def broken():
        raise RuntimeError("driver not loaded")

    t = probe_local({}, read=broken)
    assert t.is_cpu and "NVML unavailable" in t.warnings[0]
    t = probe_local({"CUDA_VISIBLE_DEVICES": "0,1"}, read=broken)
    assert t.num_gpus == 2 and "unknown GPU model" in t.warnings[0]


def test_real_nvml_on_this_machine_never_raises():
    """The real pynvml path: on a machine without a driver it must fall back, not raise."""
    t = probe_local({})
    assert t.hosts and (t.num_gpus > 0 or t.warnings)


@pytest.mark.parametrize(
    ("spec", "hosts", "per", "mem"),
    [
        ("4xFOO-48GB", 1, 4, 48e9 / 2**30),  # GB as written: 10^9 bytes
        ("4xL20-48GB", 1, 4, 44.5),  # a table GPU at the size it is sold as: NVML's memory
        ("4xFOO-24GiB", 1, 4, 24),
        ("8xH100-80GB", 1, 8, 79.6),  # the table's part at its nominal size: NVML's memory
        ("2x8xH100-80GB", 2, 8, 79.6),
        ("8xH100", 1, 8, 79.6),
        ("8xA100-40GB", 1, 8, 39.4),  # the 40 GB part, not the 80 GB one at 40
        ("8xH100-PCIe", 1, 8, 79.6),
        ("8xA800-80GB", 1, 8, 79.2),  # the A800's name carries no size: its sold size still means the entry
        ("4xH20-96GB", 1, 4, 95.6),
        ("8xH100-80GiB", 1, 8, 80),  # GiB is a measurement, read as written
        ("8xV100-16GB", 1, 8, 15.8),
        ("4xFOO-48GB@150TF@0.9TBs", 1, 4, 48e9 / 2**30),  # a GPU the table lacks, with its speed
        ("4xFOO-48GB@150TF", 1, 4, 48e9 / 2**30),  # its peak only: the bandwidth is lent, and said
    ],
)
def test_gpu_spec(spec, hosts, per, mem):
    t = parse_gpu_spec(spec)
    assert len(t.hosts) == hosts and t.gpus_per_host == (per,) * hosts
    assert abs(t.hosts[0].gpus[0].memory_gib - mem) < 0.1


@pytest.mark.parametrize("gpu", GPU_SPECS, ids=lambda g: g.name)
def test_every_table_gpu_at_its_sold_size_keeps_its_memory(gpu):
    """Users write the size a GPU is sold as (8xA800-80GB): it must never plan less memory than the table's entry."""
    assert gpu.nominal_gb and gpu.source
    for model in {gpu.name, gpu.name.removesuffix(f"-{gpu.nominal_gb}GB")}:
        got = parse_gpu_spec(f"2x{model}-{gpu.nominal_gb}GB").hosts[0].gpus[0]
        assert find_gpu_spec(got.name) == gpu and got.memory_gib == pytest.approx(gpu.memory_gib, abs=0.01)


@pytest.mark.parametrize("gpu", GPU_SPECS, ids=lambda g: g.name)
def test_a_family_name_with_a_sold_size_means_that_sizes_entry(gpu):
    """Issue 41: ``8xH100-94GB`` planned an "H100-80GB 88 GiB" with SXM compute; the README says a sold size means
    its table entry: the family's name with the size (H100 + 94 GB) is the H100 NVL, wherever one entry has it."""
    family = gpu.name.split("-")[0]
    same = [g for g in GPU_SPECS if g.name.split("-")[0] == family and g.nominal_gb == gpu.nominal_gb]
    if len(same) != 1:
        pytest.skip(f"{family} at {gpu.nominal_gb} GB is {len(same)} entries")
    got = parse_gpu_spec(f"8x{family}-{gpu.nominal_gb}GB").hosts[0].gpus[0]
    assert find_gpu_spec(got.name) == gpu, (family, gpu.nominal_gb, got.name)
    assert got.memory_gib == pytest.approx(gpu.memory_gib, abs=0.01)


@pytest.mark.parametrize(
    "spec",
    [
        "lots",
        "4x",
        "x8xH100",
        "0xH100-80GB",
        "4xMysteryGPU",
        "2x100xH100-80GB",
        "2x2x8xH100",
        "2x4x8xA100-80GB",
        "4xFOO-48GB@0.9TBs",
        "4xH100-80GB@989TF@3.35TBs",
        "4xFOO-48GB@0TF@1TBs",
    ],
)
def test_nonsense_gpu_spec(spec):
    with pytest.raises(ProbeError):
        parse_gpu_spec(spec)


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ("8xH100-800GB", "no H100 is sold with 800 GB; H100 GPUs have 80 GB or 94 GB"),
        ("8xH100-8GB", "no H100 is sold with 8 GB; H100 GPUs have 80 GB or 94 GB"),
        ("8xA100-48GB", "no A100 is sold with 48 GB; A100 GPUs have 40 GB or 80 GB"),
        ("2x8xA100-48GB", "no A100 is sold with 48 GB"),
        ("8xH100-94GiB", "no H100-80GB has 94 GiB"),
        ("8xH100-0.001GB", "GPU memory must be between 1 and"),
        ("8xFOO-0.001GB", "GPU memory must be between 1 and"),
        ("8xH100-80GB+8xH20-80GB", "no H20 is sold with 80 GB; H20 GPUs have 96 GB"),
    ],
)
def test_a_memory_no_product_of_that_name_has_is_refused_naming_the_sizes(spec, named):
    """``8xH100-800GB`` planned an "H100-80GB 745 GiB", ``8xA100-48GB`` an "A100-80GB" of 45 GiB and
    ``8xH100-0.001GB`` failed later as "GPUs of 0 GiB": a size in GB is the one the product is sold as, and any
    other is refused with the spec and the sizes that exist."""
    with pytest.raises(ProbeError) as err:
        parse_gpu_spec(spec)
    assert spec in err.value.message and named in err.value.message
    if "sold" in named:
        assert err.value.hint is not None and "-80GB" in err.value.hint + err.value.message


def test_a_measured_memory_in_gib_up_to_the_products_is_read_as_written():
    """GiB is what nvidia-smi reports (a MIG slice reports less): read as written, never more than the product."""
    assert parse_gpu_spec("8xH100-40GiB").hosts[0].gpus[0].memory_gib == 40
    assert parse_gpu_spec("8xFOO-800GB").hosts[0].gpus[0].memory_bytes == 800e9  # a GPU the table lacks: as written


def test_slurm_allocation():
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_GPUS_ON_NODE": "4"}
    local = probe_local({}, read=fake(FOUR_L20), hostname="gpu01")
    t = probe_slurm(env, local=local, scontrol=no_scontrol, steps=no_steps)
    assert [h.name for h in t.hosts] == ["gpu01", "gpu02", "gpu03"] and t.gpus_per_host == (4, 4, 4)
    assert t.hosts[1].gpus[0].name == "NVIDIA L20"
    other = {**env, "SLURM_GPUS_ON_NODE": "", "SLURM_GPUS_PER_NODE": "h100:8"}
    assert probe_slurm(other, scontrol=no_scontrol, steps=no_steps).gpus_per_host == (8,) * 3


def no_scontrol(args):
    return None


def no_steps(gpus, **_):
    """No node answers its probe step (as where srun cannot start one)."""
    return {}, [f"{n}: cannot start srun" for n in gpus]


def reports(**by_node):
    """Fake per-node probe steps (the real ones run in tests/test_slurm_cluster.py): node → (model, GiB) or None."""

    def steps(gpus, **_):
        out = {}
        for node, count in gpus.items():
            model = by_node.get(node)
            if model:
                out[node] = {"node": node, "cpus": 64, "memory_bytes": 512 * GIB,
                             "gpus": [[model[0], int(model[1] * GIB)]] * count}  # fmt: skip
        return out, [f"{n}: no report" for n in gpus if n not in out]

    return steps


def test_slurm_nodes_report_their_own_gpus_and_memory():
    """Each node's report sets its GPU model; the smallest memory is planned, with a warning naming the nodes; host
    RAM is the smallest of the node's RAM, RealMemory and the job's --mem."""
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "8",
           "SLURM_MEM_PER_NODE": "102400"}  # fmt: skip
    t = probe_slurm(env, scontrol=no_scontrol, steps=reports(gpu01=("NVIDIA H100 80GB HBM3", 79.6),
                                                             gpu02=("NVIDIA A100-SXM4-40GB", 39.4)))  # fmt: skip
    assert [h.gpus[0].name for h in t.hosts] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    assert abs(t.min_gpu_memory_bytes / GIB - 39.4) < 1e-6 and t.planning_gpu_name == "NVIDIA A100-SXM4-40GB"
    assert [h.memory_bytes for h in t.hosts] == [100 * GIB] * 2 and [h.cpus for h in t.hosts] == [64, 64]
    assert any("differ (gpu01: NVIDIA H100" in w and "gpu02: NVIDIA A100" in w for w in t.warnings)
    per_cpu = {**env, "SLURM_MEM_PER_NODE": "", "SLURM_MEM_PER_CPU": "1024", "SLURM_JOB_CPUS_PER_NODE": "16(x2)"}
    t = probe_slurm(per_cpu, scontrol=no_scontrol, steps=reports(gpu01=("H100", 80), gpu02=("H100", 80)))
    assert [h.memory_bytes for h in t.hosts] == [16 * GIB] * 2 and [h.cpus for h in t.hosts] == [16, 16]
    assert not t.warnings


def test_slurm_node_without_report_is_assumed_like_this_one_with_a_warning():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "4"}
    local = probe_local({}, read=fake(FOUR_L20), hostname="gpu01")
    t = probe_slurm(env, local=local, scontrol=no_scontrol, steps=reports(gpu01=("NVIDIA L20", 44.5)))
    assert [h.gpus[0].name for h in t.hosts] == ["NVIDIA L20"] * 2
    assert any("could not probe every node with srun (gpu02: no report)" in w for w in t.warnings)


def test_slurm_node_seeing_fewer_gpus_than_allocated_is_named():
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[01-02]", "SLURM_GPUS_ON_NODE": "4"}

    def steps(gpus, **_):
        good = {"cpus": 8, "memory_bytes": GIB, "gpus": [["NVIDIA L20", 44 * GIB]] * 4}
        return {"gpu01": good, "gpu02": {**good, "gpus": good["gpus"][:3]}}, []

    with pytest.raises(ProbeError, match="4 GPU\\(s\\) on gpu02, but a step there sees 3"):
        probe_slurm(env, scontrol=no_scontrol, steps=steps)


# Captured from Slurm 22.05 (`scontrol show job -d`, `scontrol show node -o`), trimmed.
JOB_D = """JobId=12 JobName=grpo-qwen
   NumNodes=3 NumCPUs=96 NumTasks=3 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
     Nodes=gpu[01-02] CPU_IDs=0-31 Mem=0 GRES=gpu:h100:8(IDX:0-7)
     Nodes=gpu03 CPU_IDs=0-31 Mem=0 GRES=gpu:h100:4(IDX:0-3)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""
NODES_O = (
    "NodeName=gpu01 Arch=x86_64 CoresPerSocket=16 NodeAddr=10.0.0.1 NodeHostName=gpu01 Version=22.05.8\n"
    "NodeName=gpu02 Arch=x86_64 CoresPerSocket=16 NodeAddr=10.0.0.2 NodeHostName=gpu02 Version=22.05.8\n"
)


def test_slurm_reads_addresses_cpus_and_gpus_of_every_node():
    env = {
        "SLURM_JOB_ID": "12",
        "SLURM_JOB_NODELIST": "gpu[01-02]",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_JOB_CPUS_PER_NODE": "32(x2)",
    }
    answers = {"job": JOB_D.replace("Nodes=gpu03 CPU_IDs=0-31 Mem=0 GRES=gpu:h100:4(IDX:0-3)\n", ""), "node": NODES_O}
    t = probe_slurm(env, scontrol=lambda args: answers[args[1]], steps=no_steps)
    assert [(h.name, h.addr, h.cpus, len(h.gpus)) for h in t.hosts] == [
        ("gpu01", "10.0.0.1", 32, 8),
        ("gpu02", "10.0.0.2", 32, 8),
    ]


def test_slurm_heterogeneous_nodes_are_refused_by_name():
    env = {"SLURM_JOB_ID": "12", "SLURM_JOB_NODELIST": "gpu[01-03]", "SLURM_GPUS_ON_NODE": "8"}
    with pytest.raises(ProbeError, match=r"different GPU counts: gpu01=8, gpu02=8, gpu03=4") as e:
        probe_slurm(env, scontrol=lambda args: JOB_D if args[1] == "job" else None, steps=no_steps)
    assert "--gpus-per-node" in str(e.value)


HET_ENV = {  # sbatch -w gpu01 --gres=gpu:4 : -w gpu[02-03] --gres=gpu:8, as a real one sets it (test_slurm_cluster)
    "SLURM_JOB_ID": "12",
    "SLURM_JOB_NODELIST": "gpu01",
    "SLURM_GPUS_ON_NODE": "4",
    "SLURM_HET_SIZE": "2",
    "SLURM_JOB_NODELIST_HET_GROUP_0": "gpu01",
    "SLURM_JOB_NODELIST_HET_GROUP_1": "gpu[02-03]",
}
HET_JOB_D = """JobId=12 HetJobId=12 HetJobOffset=0 JobName=grpo-qwen
     Nodes=gpu01 CPU_IDs=0-31 Mem=0 GRES=gpu:4(IDX:0-3)
JobId=13 HetJobId=12 HetJobOffset=1 JobName=grpo-qwen
     Nodes=gpu[02-03] CPU_IDs=0-31 Mem=0 GRES=gpu:8(IDX:0-7)
"""


def test_a_heterogeneous_job_is_every_component_s_nodes_each_probed_in_its_component():
    """Failed before: only component 0's nodes (SLURM_JOB_NODELIST) were read, and its GPU counts had to match."""
    seen = {}

    def steps(gpus, groups=None):
        seen.update(groups or {})
        return {n: {"node": n, "cpus": 32, "memory_bytes": 64 * GIB,
                    "gpus": [[("NVIDIA H20" if n == "gpu01" else "NVIDIA H100 80GB HBM3"), 96 * GIB]] * c}
                for n, c in gpus.items()}, []  # fmt: skip

    t = probe_slurm(HET_ENV, scontrol=lambda args: HET_JOB_D if args[1] == "job" else None, steps=steps)
    assert [(h.name, len(h.gpus), h.gpus[0].name) for h in t.hosts] == [
        ("gpu01", 4, "NVIDIA H20"),
        ("gpu02", 8, "NVIDIA H100 80GB HBM3"),
        ("gpu03", 8, "NVIDIA H100 80GB HBM3"),
    ]
    assert seen == {"gpu01": 0, "gpu02": 1, "gpu03": 1}
    step = srun_spec(ProcessSpec("train@gpu02", ("python",), host="gpu02"), python="py", gpus_on_node=8,
                     cpus_on_node=None, het_group=1)  # fmt: skip
    assert step.argv[:2] == ("srun", "--het-group=1")
    first = srun_spec(ProcessSpec("vllm", ("vllm",), host="gpu01"), python="py", gpus_on_node=4, cpus_on_node=None)
    assert not any(a.startswith("--het-group") for a in first.argv)


def test_a_heterogeneous_component_of_uneven_nodes_is_refused():
    one = "Nodes=gpu[02-03] CPU_IDs=0-31 Mem=0 GRES=gpu:8(IDX:0-7)"
    uneven = HET_JOB_D.replace(one, "Nodes=gpu02 GRES=gpu:8(IDX:0-7)\n     Nodes=gpu03 GRES=gpu:6(IDX:0-5)")
    with pytest.raises(ProbeError, match="different GPU counts"):
        probe_slurm(HET_ENV, scontrol=lambda args: uneven if args[1] == "job" else None, steps=no_steps)


def test_a_heterogeneous_job_without_scontrol_reads_each_component_s_gpus_per_node():
    """Failed before: without scontrol every component was given this node's count (gpu02/03 with 4 GPUs, not 8).
    The variables are those a real `sbatch -w n1 --gpus-per-node=2 : -w n2 --gpus-per-node=4` job sets on the test
    cluster (SLURM_GPUS_PER_NODE_HET_GROUP_k); `--gres=gpu:N` sets none, and then the count is refused, not guessed."""
    env = {**HET_ENV, "SLURM_GPUS_PER_NODE_HET_GROUP_0": "4", "SLURM_GPUS_PER_NODE_HET_GROUP_1": "h100:8"}
    t = probe_slurm(env, scontrol=no_scontrol, steps=no_steps)
    assert [(h.name, len(h.gpus)) for h in t.hosts] == [("gpu01", 4), ("gpu02", 8), ("gpu03", 8)]
    with pytest.raises(ProbeError, match=r"component 1 .* gpu02") as e:
        probe_slurm(HET_ENV, scontrol=no_scontrol, steps=no_steps)
    assert "--gpus-per-node" in e.value.hint


def test_a_heterogeneous_job_s_components_each_have_their_own_cpus_and_memory_limit():
    """Failed before: component 0's SLURM_MEM_PER_NODE capped every node's RAM (gpu02/03 at 1500 MB, not 32000) and
    its SLURM_JOB_CPUS_PER_NODE was not read at all. A real het job sets the plain variables to component 0's and
    each component's as <variable>_HET_GROUP_k (captured on the test cluster: SLURM_MEM_PER_NODE_HET_GROUP_1, ...)."""
    env = {**HET_ENV, "SLURM_JOB_CPUS_PER_NODE": "16", "SLURM_MEM_PER_NODE": "1500",
           "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_0": "16", "SLURM_MEM_PER_NODE_HET_GROUP_0": "1500",
           "SLURM_JOB_CPUS_PER_NODE_HET_GROUP_1": "32(x2)", "SLURM_MEM_PER_NODE_HET_GROUP_1": "32000"}  # fmt: skip
    reports = {n: {"node": n, "cpus": 64, "memory_bytes": 64 * GIB, "gpus": [["NVIDIA H100 80GB HBM3", 80 * GIB]] * c}
               for n, c in {"gpu01": 4, "gpu02": 8, "gpu03": 8}.items()}  # fmt: skip
    t = probe_slurm(env, scontrol=lambda args: HET_JOB_D if args[1] == "job" else None,
                    steps=lambda gpus, **_: (reports, []))  # fmt: skip
    assert [(h.name, h.cpus, h.memory_bytes) for h in t.hosts] == [
        ("gpu01", 16, 1500 * 2**20),
        ("gpu02", 32, 32000 * 2**20),
        ("gpu03", 32, 32000 * 2**20),
    ]


def test_not_in_slurm():
    with pytest.raises(ProbeError, match="not inside a Slurm allocation"):
        probe_slurm({})


def test_bad_nodelist():
    with pytest.raises(ProbeError, match="gpu\\[01-"):
        expand_nodelist("gpu[01-")


def test_hostfile(tmp_path):
    text = "# cluster\nnode1 slots=8\n\nnode2 slots=8  # second\n"
    assert parse_hostfile(text) == [("node1", 8), ("node2", 8)]
    f = tmp_path / "hosts"
    f.write_text(text)
    assert probe_hostfile(f).gpus_per_host == (8, 8)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1 slots=8\nnode1 slots=8\n", "hostfile:2: host 'node1' is listed twice"),
        ("node1 slots=x\n", "hostfile:1: slots must be an integer from 1 to 1024"),
        ("node1\n", "hostfile:1: 'node1' has no slots"),
        ("bad_host! slots=2\n", "hostfile:1: 'bad_host!' is not a valid host name"),
        ("node1 gpus=2\n", "hostfile:1: cannot read 'gpus=2'"),
        ("# nothing\n", "lists no hosts"),
    ],
)
def test_bad_hostfile(text, message):
    with pytest.raises(ProbeError, match=message):
        parse_hostfile(text)


def test_hostfile_lines_may_name_their_gpus(tmp_path):
    """Planning offline for hosts with GPUs this machine lacks: ``node1 slots=8 gpu=H100-80GB``."""
    f = tmp_path / "hosts"
    f.write_text("node1 slots=8 gpu=H100-80GB\nnode2 slots=8 gpu=H100-80GB\n")
    t = probe_hostfile(f, cpu=True)
    assert t.gpus_per_host == (8, 8) and t.gpu_name == "H100-80GB" and t.min_gpu_memory_bytes > 79 * 2**30
    f.write_text("node1 slots=8 gpu=H100-80GB\nnode2 slots=8 gpu=L20\n")
    mixed = probe_hostfile(f, cpu=True)
    assert mixed.planning_gpu_name == "L20" and abs(mixed.min_gpu_memory_bytes / 2**30 - 44.5) < 1
    assert "differ (node1: H100-80GB, node2: L20)" in mixed.warnings[0]
    f.write_text("node1 slots=8 gpu=H100-80GB\nnode2 slots=8\n")
    with pytest.raises(ProbeError, match="node2 name no GPU model"):
        probe_hostfile(f, cpu=True)
    f.write_text("node1 slots=8\n")
    cpu = probe_hostfile(f, cpu=True)
    assert cpu.is_cpu and "names no GPU model" in cpu.warnings[0]
    f.write_text("node1 slots=8 gpu=FOO\n")
    with pytest.raises(ProbeError, match="unknown GPU model"):
        probe_hostfile(f, cpu=True)


def test_gpus_and_hostfile_together_are_refused(tmp_path, capsys):
    from grpo_launch.cli import main

    f = tmp_path / "hosts"
    f.write_text("node1 slots=8\n")
    recipe = str(ROOT / "recipes" / "qwen1.5b.yaml")
    assert main(["plan", recipe, "--hostfile", str(f), "--gpus", "8xH100", "--no-write"], environ={}) == 2
    assert "--gpus and --hostfile" in capsys.readouterr().err


def test_slurm_job_end_time():
    import time

    from grpo_launch.backends.slurm.allocation import job_end_time, parse_end_time

    text = "JobId=7 JobName=x JobState=RUNNING StartTime=2026-11-22T09:00:00 EndTime=2026-11-22T10:00:00 Deadline=N/A"
    assert parse_end_time(text) == time.mktime((2026, 11, 22, 10, 0, 0, 0, 0, -1))
    assert parse_end_time("JobId=7 EndTime=Unknown") is None
    assert job_end_time("7", scontrol=lambda args: text if args == ["show", "job", "-o", "7"] else None) is not None
    assert job_end_time("7", scontrol=lambda args: None) is None


def test_a_peak_without_bandwidth_borrows_the_nearest_table_gpus_and_says_so():
    t = parse_gpu_spec("4xFOO-48GB@150TF")
    spec = t.planning_gpu_spec
    assert spec.bf16_tflops == 150 and spec.bandwidth_tbs == find_gpu_spec("A40").bandwidth_tbs  # A40: 149.7 TF
    assert any("bandwidth assumed: A40's" in w and "@150TF@<TB/s>TBs" in w for w in t.warnings)
    assert parse_gpu_spec("4xFOO-48GB@150TF@1.2TBs").planning_gpu_spec.bandwidth_tbs == 1.2
    assert not parse_gpu_spec("4xFOO-48GB@150TF@1.2TBs").warnings


def test_well_known_datasets_forecast_offline_with_their_source(tmp_path):
    """Issue 41: qwen1.5b.yaml's whole-run forecast was "unknown" offline (NuminaMath-TIR's rows came only from the
    Hub). The table's counts against what their sources publish: NuminaMath-TIR's train plus its 99-row test split
    is the Hub's "72.5k rows"; MATH's train split is 7,500 (Hendrycks et al. 2021); GSM8K's, "7.5K training
    problems" (Cobbe et al. 2021), is the card's 7,473."""
    from grpo_launch.probe.dataset import KNOWN_ROWS, dataset_rows

    offline = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    rows, source = dataset_rows({"dataset_name": "AI-MO/NuminaMath-TIR"}, str(tmp_path), offline)
    assert rows is not None and abs(rows + 99 - 72_500) <= 50 and "72,441" in source
    math_rows, _ = dataset_rows({"dataset_name": "DigitalLearningGmbH/MATH-lighteval"}, str(tmp_path), offline)
    assert math_rows == 7_500
    gsm, _ = dataset_rows({"dataset_name": "openai/gsm8k", "dataset_config": "main"}, str(tmp_path), offline)
    assert gsm is not None and abs(gsm - 7_500) / 7_500 < 0.01
    assert all(source for _, source in KNOWN_ROWS.values())
    unknown, why = dataset_rows({"dataset_name": "someone/unknown"}, str(tmp_path), offline)
    assert unknown is None and "offline" in why
