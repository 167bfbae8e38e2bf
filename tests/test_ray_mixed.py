"""Mixed GPU types on a real Ray cluster (issue 38): h1 reports an H20 and h2 an H100 through the pynvml stand-in
keyed by each node's host name (scripts/ray_hosts.sh; NVML needs a GPU). The Ray backend's probe reads each node's
model, the plan serves on the H20 node and trains on the H100 node, and the Ray backend places each process there.
The first test has the processes print where they run (the planned GPU plan itself); the second runs the
training: vLLM's CPU build serves on h1 and TRL's GRPOTrainer trains on h2 through it (tests/cpu_server_trainer.py:
TRL's NCCL weight transfer made a no-op, since NCCL needs CUDA). Ray's placement groups, actors and GPU assignment
are real.

Skipped without root, Ray, iproute2 or sshd, unless GRPO_LAUNCH_REQUIRE_RAY=1 (CI), which fails instead.
"""

from __future__ import annotations

import os
import sys
import time

import pytest

from .helpers import ROOT, ensure_tiny_assets, ray_cluster
from .test_ray_placement import PLACED, run_placed

pytestmark = [pytest.mark.ray, pytest.mark.slow]
MODELS = {"h1": ("NVIDIA H20", 102641664000), "h2": ("NVIDIA H100 80GB HBM3", 85520809984)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ray_cluster(tmp_path_factory.mktemp("ray-mixed"), 2, 2, models=MODELS) as address:
        yield address


@pytest.mark.extended
def test_the_h20_node_serves_the_h100_node_trains_and_each_process_runs_on_its_roles_node(cluster, tmp_path):
    from grpo_launch.backends.ray import RayBackend
    from grpo_launch.models.builtin import find_model_shape
    from grpo_launch.planning import make_plan
    from grpo_launch.planning.plan_types import Runtime
    from grpo_launch.probe.local import probe_local
    from grpo_launch.recipe import load_recipe

    t0 = time.monotonic()
    backend = RayBackend(cluster)
    topology = backend.probe(os.environ, probe_local(os.environ))
    assert [(h.name, {g.name for g in h.gpus}) for h in topology.hosts] == [
        ("h1", {"NVIDIA H20"}),
        ("h2", {"NVIDIA H100 80GB HBM3"}),
    ]
    recipe = load_recipe(ROOT / "recipes" / "qwen1.5b.yaml", ["launch.vllm=server"])
    shape = find_model_shape(str(recipe.get("model_name_or_path")))
    plan = make_plan(topology, recipe, shape, runtime=Runtime(run_dir=str(tmp_path / "run"), python=sys.executable))
    said = (plan.split, topology, [(c.label, c.per_prompt_s, c.rejected) for c in plan.candidates])
    assert plan.vllm.host == "h1" and [(h.name, h.machine_rank) for h in plan.train.hosts] == [("h2", 0)], said
    assert "H20 serves vLLM" in {d.what: d.why for d in plan.decisions}["gpu_types"]
    assert plan.vllm.address == "10.77.0.11"  # the trainers reach the server at the H20 node's address
    specs, outputs = run_placed(backend, plan, "mixedtest")
    where = {}
    for spec in specs:
        out = outputs[spec.name]
        (name, node, _, _, ray_ids) = PLACED.search(out).groups()
        assert (name, node) == (spec.name, spec.host)
        assert f"CVD={ray_ids} on {spec.host}" in out  # the process sees exactly Ray's GPUs on its own node
        where[spec.role] = {*where.get(spec.role, set()), node}
    assert {str(r): n for r, n in where.items()} == {"vllm": {"h1"}, "train": {"h2"}}, where
    print(f"mixed Ray placement: {time.monotonic() - t0:.0f} s")


def combined_python(tmp_path) -> str:
    """A venv of the vLLM environment's Python that also reaches the trainers' environment's Ray: TRL's server mode
    needs vLLM where it trains, and the launcher joins the cluster with the Ray its nodes run (.venv's; both
    environments are the same CPython and torch)."""
    import subprocess

    from .helpers import VLLM_PY

    root = tmp_path / "combined"
    subprocess.run([str(VLLM_PY), "-m", "venv", "--without-pip", "--symlinks", str(root)], check=True, timeout=60)
    site = "import site; print(site.getsitepackages()[0])"
    sites = [subprocess.run([py, "-c", site], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
             for py in (str(VLLM_PY), sys.executable)]  # fmt: skip
    target = next((root / "lib").glob("python3*/site-packages"))
    (target / "00-combined.pth").write_text("import site; " + "; ".join(f"site.addsitedir({s!r})" for s in sites))
    return str(root / "bin" / "python")


@pytest.mark.extended
@pytest.mark.vllm
def test_a_mixed_run_trains_with_the_h20_node_serving_and_the_h100_node_training(cluster, tmp_path):
    """The whole run on the real cluster: the plan serves on h1 (the H20) and trains on h2 (the H100); the vLLM
    server runs on h1 and the trainers on h2 (the runner's placement lines and the trainers' own), the trainers
    generate through h1's server and train (the saved weights differ from the model they started from), and
    nothing is left running."""
    import json
    import subprocess

    import yaml
    from safetensors.torch import load_file

    from .helpers import TRAINER_LINE, free_port, leftovers, require_vllm
    from .test_ray_cluster import PLACED
    from .test_slurm_cluster import dedicated_node_recipe

    require_vllm()
    tiny = ensure_tiny_assets()
    run = tmp_path / "run"
    recipe = dedicated_node_recipe(tmp_path / "recipe.yaml", tiny, free_port(), vllm_gpus=2, dp_here=1)
    values = yaml.safe_load(recipe.read_text())
    values["launch"] |= {"train_module": "tests.cpu_server_trainer", "main_process_port": free_port(),
                         "train_env": {"ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"}}  # fmt: skip
    values |= {"max_steps": 2, "learning_rate": 1e-3, "bf16": False, "gradient_checkpointing": False,
               "reward_funcs": ["digits"], "dataset_name": str(tiny / "data" / "train.jsonl"),
               "dataset_prompt_column": "prompt", "dataset_answer_column": "answer", "max_completion_length": 48,
               "num_generations": 2, "per_device_train_batch_size": 2, "save_strategy": "no", "report_to": "none",
               "output_dir": str(run / "output")}  # fmt: skip
    recipe.write_text(yaml.safe_dump(values))
    argv = [combined_python(tmp_path), "-m", "grpo_launch", str(recipe), "--ray", cluster, "--run-dir", str(run),
            "--network-interface", "eth0"]  # fmt: skip
    t0 = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=480, cwd=ROOT, env=dict(os.environ))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    plan = json.loads((run / "plan.json").read_text())
    why = {d["what"]: d["why"] for d in plan["decisions"]}
    assert "H20 serves vLLM" in why["gpu_types"] and "trains" in why["gpu_types"], why.get("gpu_types")
    assert plan["vllm"]["host"] == "h1" and {h["name"] for h in plan["train"]["hosts"]} == {"h2"}
    placed = {name: node for name, node, _, _ in PLACED.findall(out)}
    assert placed.get("vllm") == "h1" and {n for k, n in placed.items() if k.startswith("train")} == {"h2"}, placed
    every = out + "".join(p.read_text() for p in (run / "logs").glob("train-*.log"))
    assert {node for *_, node in TRAINER_LINE.findall(every)} == {"h2"}, every[-3000:]
    assert "step 2/2 done" in out, out[-3000:]
    before = load_file(str(tiny / "model" / "model.safetensors"))
    after = load_file(str(run / "output" / "model.safetensors"))
    assert [k for k in before if k in after and not (before[k].float() == after[k].float()).all()], "no weight moved"
    assert leftovers(run, within=15.0) == []
    print(f"mixed Ray run: {time.monotonic() - t0:.0f} s")
