"""Memory and step-time estimates, and the choices made from them, against published configurations and the
user reports in ../shared/cases/seed-cases.md. Numbers are estimates: the tests check orders and decisions that
published runs settle (fits / OOM / bottleneck), not exact seconds."""

from __future__ import annotations

import dataclasses

import pytest

from grpo_launch.enums import DistBackend, Offload
from grpo_launch.errors import PlanError
from grpo_launch.machines.gpus import GIB, find_gpu_spec
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.planning.cost.memory import train_memory, vllm_memory
from grpo_launch.planning.cost.steptime import generation_time
from grpo_launch.planning.cost.workload import Workload
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.recipe import build_recipe

from .helpers import plan_recipe

QWEN7 = "Qwen/Qwen2.5-7B-Instruct"
WORK = Workload(
    prompt_len=512, completion_len=1024, completions=64, num_generations=8, per_device=4, gradient_checkpointing=False
)


def plan(values: dict, spec: str):
    return plan_recipe(values, spec)


def test_memory_orders_every_saving():
    m = find_model_shape(QWEN7)
    ddp = train_memory(m, 8, DistBackend.DDP, Offload.NONE, WORK).total
    z2 = train_memory(m, 8, DistBackend.ZERO2, Offload.NONE, WORK).total
    z3 = train_memory(m, 8, DistBackend.ZERO3, Offload.NONE, WORK).total
    off = train_memory(m, 8, DistBackend.ZERO3, Offload.OPTIMIZER, WORK).total
    off_all = train_memory(m, 8, DistBackend.ZERO3, Offload.OPTIMIZER_PARAMS, WORK).total
    assert ddp > z2 > z3 > off > off_all
    ck = train_memory(
        m, 8, DistBackend.ZERO2, Offload.NONE, dataclasses.replace(WORK, gradient_checkpointing=True)
    ).total
    assert ck < z2
    lora = train_memory(m, 1, DistBackend.DDP, Offload.NONE, dataclasses.replace(WORK, lora=True)).total
    assert lora < train_memory(m, 1, DistBackend.DDP, Offload.NONE, WORK).total / 3
    # Model states of full fine-tuning under DDP: 16 bytes per parameter (7.6B → ~113 GiB).
    states = train_memory(m, 1, DistBackend.DDP, Offload.NONE, WORK)
    assert (states.weights + states.gradients + states.optimizer) / GIB == pytest.approx(16 * 7.62e9 / GIB, rel=1e-6)


def test_seed_case_4_generation_is_the_bottleneck_of_long_completions():
    """Seed case 4 (open-r1, 25-minute steps): 4096-token completions × 16 generations make generation the
    bottleneck; parameter offload is not chosen when it is not needed, and forcing it makes the step slower."""
    values = {
        "model_name_or_path": QWEN7,
        "num_generations": 16,
        "per_device_train_batch_size": 1,
        "max_prompt_length": 512,
        "max_completion_length": 4096,
    }
    chosen = plan(values, "4xH100-80GB")
    assert chosen.estimate.step.bottleneck == "generation"
    assert chosen.train.offload != "optimizer+params"
    forced = plan(
        {**values, "launch": {"backend": "zero3", "offload": "optimizer+params", "vllm": "server"}}, "4xH100-80GB"
    )
    per_prompt = lambda p: p.estimate.step.total_s / (p.layout.completions_per_optimizer_step / 16)  # noqa: E731
    assert per_prompt(forced) > per_prompt(chosen)
    shorter = plan({**values, "max_completion_length": 1024}, "4xH100-80GB")
    assert per_prompt(shorter) < per_prompt(chosen) / 2


def test_trl_docs_72b_on_four_training_nodes_and_one_vllm_node():
    """TRL's GRPO docs run Qwen2.5-72B on 5 nodes of 8 × H100: 4 train, 1 serves vLLM with TP 8. That layout plans
    (ZeRO-3; "within memory" is the planner's own acceptance, not asserted again), and what the planner chooses
    at the same batch predicts a step no longer than it. Both are pinned at 20 prompts per step (160 completions),
    a batch that the docs' 32 trainers and every GPU (40) both take evenly."""
    values = {
        "model_name_or_path": "Qwen/Qwen2.5-72B-Instruct",
        "num_generations": 8,
        "per_device_train_batch_size": 1,
        "max_prompt_length": 512,
        "max_completion_length": 1024,
        "gradient_checkpointing": True,
    }
    prompts = 20
    chosen = plan({**values, "launch": {"prompts_per_step": prompts}}, "5x8xH100-80GB")
    docs = plan({**values, "launch": {"vllm_gpus": 8, "vllm_tensor_parallel_size": 8, "prompts_per_step": prompts}},
                "5x8xH100-80GB")  # fmt: skip
    assert docs.vllm.mode == "server" and docs.vllm.tensor_parallel_size == 8 and docs.vllm.host == "node4"
    assert docs.train.num_processes == 32 and docs.train.backend == "zero3"
    assert docs.layout.completions_per_optimizer_step == chosen.layout.completions_per_optimizer_step
    assert chosen.estimate.step.total_s <= docs.estimate.step.total_s


def test_open_r1_small_model_on_one_node_needs_no_offload():
    """open-r1 trains Qwen2.5-1.5B GRPO on one 8 × H100 node with ZeRO-2 and no offload."""
    p = plan(
        {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "num_generations": 16, "max_completion_length": 1024},
        "8xH100-80GB",
    )
    assert p.train.offload == "none" and p.train.backend in ("ddp", "zero2")


def test_full_7b_on_one_24gb_gpu_is_refused_with_the_nearest_fixes():
    """A known OOM: full-parameter GRPO of a 7B model on one 24 GB GPU (16 B/param of model states alone).
    ZeRO-3 with parameter offload keeps only the gathered largest layer on the GPU (DeepSpeed's own estimate), so the
    training side alone would fit; the colocated vLLM's 30 % share cannot hold 14 GiB of bf16 weights."""
    values = {"model_name_or_path": QWEN7, "num_generations": 4, "per_device_train_batch_size": 4}
    with pytest.raises(PlanError) as e:
        plan(values, "1xA10G")
    text = e.value.render()
    assert "vLLM (colocate) does not fit" in text and "more GPUs" in text
    with pytest.raises(PlanError) as e:
        plan({**values, "launch": {"vllm": "off", "offload": "none"}}, "1xA10G")
    assert "does not fit on 1 training GPU(s) of 22 GiB" in e.value.render()
    offloaded = plan({**values, "launch": {"vllm": "off"}}, "1xA10G")
    assert offloaded.train.backend == "zero3" and offloaded.train.offload == "optimizer+params"


def test_seed_case_3_memory_pressure_turns_on_checkpointing_and_offload_only_when_needed():
    """Seed case 3: raising the batch on one machine hit OOM until gradient checkpointing and offload were on. One
    topology (8 × H100, a 1-GPU server, 7 trainers), one model and length; only the per-device batch grows. Each
    saving appears at the batch that needs it, and each is needed there: without it the same plan does not fit."""
    base = {"model_name_or_path": QWEN7, "num_generations": 4, "max_completion_length": 1024,
            "launch": {"vllm": "server", "vllm_gpus": 1}}  # fmt: skip

    def at(batch: int, **more):
        return plan({**base, "per_device_train_batch_size": batch, **more}, "8xH100-80GB")

    small, mid, big = at(1), at(4), at(64)
    assert small.train.num_processes == mid.train.num_processes == big.train.num_processes == 7
    assert (small.train.gradient_checkpointing, small.train.offload) == (False, "none")
    assert (mid.train.gradient_checkpointing, mid.train.offload) == (True, "none")
    assert big.train.gradient_checkpointing is True and big.train.offload != "none"
    assert big.trainer_values["gradient_checkpointing"] is True
    with pytest.raises(PlanError, match="does not fit"):  # the mid batch without checkpointing, same backend
        at(4, gradient_checkpointing=False, launch={**base["launch"], "backend": mid.train.backend.value})
    with pytest.raises(PlanError, match="does not fit"):  # the big batch without offload
        at(64, launch={**base["launch"], "offload": "none"})


def test_vllm_sizing_covers_the_round_and_respects_the_kv_cache():
    m = find_model_shape(QWEN7)
    sized = vllm_memory(m, Parallelism(1), 80 * GIB, WORK, share=None)
    assert sized.max_num_seqs == 64 and sized.max_model_len == 1536
    tight = vllm_memory(
        m, Parallelism(1), 24 * GIB, dataclasses.replace(WORK, completions=4096, completion_len=8192), share=None
    )
    assert tight is not None and tight.max_num_seqs < 4096
    assert (tight.weights_per_gpu + tight.max_num_seqs * tight.kv_per_seq) <= 0.9 * 24 * GIB
    assert (
        vllm_memory(find_model_shape("Qwen/Qwen2.5-72B-Instruct"), Parallelism(1), 80 * GIB, WORK, share=None) is None
    )


def test_generation_time_grows_with_completion_length_and_shrinks_with_tp():
    m, gpu = find_model_shape(QWEN7), find_gpu_spec("H100")
    short, _ = generation_time(m, gpu, Parallelism(1), 64, WORK)
    long, why = generation_time(m, gpu, Parallelism(1), 64, dataclasses.replace(WORK, completion_len=4096))
    assert long > 3 * short and "memory-bound" in why
    tp2, _ = generation_time(m, gpu, Parallelism(2), 64, WORK)
    assert tp2 < short


def test_plan_shows_the_estimate_and_explains_it(capsys, tmp_path):
    from grpo_launch.cli import main

    from .helpers import ROOT

    recipe = str(ROOT / "recipes" / "qwen1.5b.yaml")
    assert main(["plan", recipe, "--gpus", "4xL20-48GB", "--no-write", "--explain"], environ={}) == 0
    out = capsys.readouterr().out
    assert "Estimate per optimizer step" in out and "bottleneck" in out and "memory per training GPU" in out
    assert "training: " in out and "TFLOP/s" in out and "split=" in out


def _with_host_ram(spec: str, gib: float):
    import dataclasses as dc

    topo = parse_gpu_spec(spec)
    return dc.replace(topo, hosts=tuple(dc.replace(h, memory_bytes=int(gib * GIB)) for h in topo.hosts))


def test_offload_must_fit_the_hosts_ram():
    """ZeRO-3 with full offload moves the model states to host RAM: 18 B/param × DeepSpeed's 1.5 buffer for a 7B
    model (≈ 190 GiB per node). A plan that needs more than the node has is refused with fixes; the need is shown."""
    values = {"model_name_or_path": QWEN7, "num_generations": 4, "per_device_train_batch_size": 4}
    recipe = build_recipe({**values, "launch": {"vllm": "off"}})
    model = find_model_shape(QWEN7)
    with pytest.raises(PlanError) as e:
        make_plan(_with_host_ram("1xA10G", 64), recipe, model)
    assert "host RAM per node" in e.value.render() and "more nodes" in e.value.render()
    ok = make_plan(_with_host_ram("1xA10G", 512), recipe, model)
    assert ok.train.offload == "optimizer+params"
    assert ok.estimate.host_memory_per_node_gib == pytest.approx(18 * model.params * 1.5 / GIB, rel=0.01)
    assert any("host RAM" in d.why for d in ok.decisions if d.what == "backend")


def test_plan_json_has_the_estimate_as_data(tmp_path):
    import json

    from grpo_launch.render import render_files

    p = plan_recipe(
        {"model_name_or_path": QWEN7, "launch": {"offload": "optimizer"}}, "4xL20-48GB", run_dir=str(tmp_path)
    )
    est = json.loads(render_files(p)["plan.json"])["estimate"]
    mem = est["memory_per_training_gpu_gib"]
    assert mem["total"] == pytest.approx(p.estimate.train_memory_gib)
    assert {"weights", "gradients", "optimizer", "activations", "lm_head", "overhead"} <= set(mem)
    assert est["time_s"]["step"] == pytest.approx(p.estimate.step.total_s) and est["host_memory_per_node_gib"] > 0
    tp = p.vllm.tensor_parallel_size  # Qwen2.5-7B: 28 layers × 4 KV heads × 128 × 2 (K, V) × 2 bytes, split over TP
    assert est["vllm_memory_per_gpu_gib"]["kv_bytes_per_token_per_gpu"] == 28 * 2 * 2 * 128 * max(1, 4 // tp)


def test_host_memory_is_read_from_meminfo_and_slurm():
    from grpo_launch.backends.slurm.allocation import parse_node_memory
    from grpo_launch.probe.local import parse_meminfo

    assert parse_meminfo("MemTotal:       24574472 kB\nMemFree: 1 kB\n") == 24574472 * 1024
    assert parse_meminfo("garbage") is None
    line = "NodeName=n1 Arch=x86_64 CPUTot=2 RealMemory=2000 NodeAddr=127.0.0.1"
    assert parse_node_memory(line) == {"n1": 2000 * 1024 * 1024}


def test_time_and_cost_of_the_whole_run_before_launch(tmp_path):
    """open-r1 #251: a run took about 9 h against about 3 h claimed. The plan says it up front: steps from
    max_steps or epochs × rows ÷ prompts per step, hours at the predicted step, GPU-hours over every GPU held."""
    base = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "num_generations": 8}
    p = plan({**base, "max_steps": 500, "launch": {"gpu_hour_price": 2.0}}, "8xH100-80GB")
    t = p.estimate.total
    # every step, plus the first start (the time to first step less the first step's own generation)
    assert t.steps == 500 and t.hours == pytest.approx((500 * p.estimate.step.total_s + p.estimate.restart_s) / 3600)
    assert p.estimate.restart_s == pytest.approx(p.estimate.startup_s - p.estimate.step.generation_s)
    assert t.gpu_hours == pytest.approx(8 * t.hours) and t.price == pytest.approx(2.0 * t.gpu_hours)
    q = plan({**base, "num_train_epochs": 2, "launch": {"dataset_rows": 1000}}, "8xH100-80GB")
    prompts = q.layout.completions_per_optimizer_step / q.layout.num_generations
    assert q.estimate.total.steps == -(-2 * 1000 // int(prompts)) and q.estimate.total.price is None
    assert plan(base, "8xH100-80GB").estimate.total is None  # neither max_steps nor rows: unknown


def test_rows_are_counted_from_a_local_file(tmp_path):
    from grpo_launch.probe.dataset import count_rows

    (tmp_path / "d.jsonl").write_text('{"a": 1}\n{"a": 2}\n\n{"a": 3}\n')
    (tmp_path / "d.csv").write_text("prompt,answer\nx,1\ny,2\n")
    assert count_rows("d.jsonl", str(tmp_path)) == 3 and count_rows("d.csv", str(tmp_path)) == 2
    assert count_rows("org/hub-dataset", str(tmp_path)) is None


def test_step_time_counts_trls_old_logprob_forward():
    """TRL 1.16 runs an extra forward over the completions for the old log-probs whenever vLLM generates
    (importance-sampling correction, on by default) or a generation serves several optimizer steps; it costs
    2·P FLOPs per token, a third of the forward + backward."""
    base = {"model_name_or_path": QWEN7, "num_generations": 8, "launch": {"vllm": "server"}}
    on = plan(base, "8xH100-80GB")
    off = plan({**base, "vllm_importance_sampling_correction": False}, "8xH100-80GB")
    assert off.estimate.step.old_logprobs_s == 0.0
    from grpo_launch.planning.cost.constants import TRAIN_MFU

    mfu = TRAIN_MFU["H100"].value
    tokens = on.layout.completions_per_optimizer_step * (512 + 512)  # default prompt bound + TRL's completion length
    flops = 2 * on.model.params * tokens
    expected = flops / (on.train.num_processes * find_gpu_spec("H100").bf16_tflops * 1e12 * mfu)
    assert on.estimate.step.old_logprobs_s == pytest.approx(expected, rel=1e-6)
    assert on.estimate.step.total_s > off.estimate.step.total_s


# vLLM's custom all-reduce on 8 × H100 (NVLink), sglang PR #2904 (github.com/sgl-project/sglang/pull/2904), the
# "vllm" table: (TP, bytes) → µs.
PR_2904_VLLM_ALLREDUCE_US = {
    (2, 512): 9.5, (4, 512): 9.1, (8, 512): 10.1,
    (2, 32768): 8.7, (4, 32768): 9.2, (8, 32768): 11.8,
    (2, 262144): 12.9, (4, 262144): 20.6, (8, 262144): 24.1,
    (2, 524288): 17.7, (4, 524288): 26.9, (8, 524288): 30.4,
    (2, 1048576): 26.6, (4, 1048576): 40.2, (8, 1048576): 45.0,
}  # fmt: skip


@pytest.mark.parametrize(("tp", "nbytes"), list(PR_2904_VLLM_ALLREDUCE_US))
def test_tp_allreduce_time_matches_the_published_measurement(tp, nbytes):
    """The decode step's TP all-reduces (two per layer) cost what vLLM's kernel measured, within 25 %."""
    from grpo_launch.planning.cost.steptime import allreduce_time

    measured = PR_2904_VLLM_ALLREDUCE_US[(tp, nbytes)] * 1e-6
    assert allreduce_time(tp, nbytes) == pytest.approx(measured, rel=0.25)


# vLLM's own all-reduce benchmark (benchmarks/kernels/benchmark_device_communicators.py, in CUDA graphs), H100 TP 4,
# the best of vLLM's size dispatch: PR #24111 (15 µs at 1 MB, 29 µs at 4 MB) and PR #24532 (14 µs, 28 µs).
VLLM_LARGE_ALLREDUCE_US = {"vllm PR #24111": (15.0, 29.0), "vllm PR #24532": (14.0, 28.0)}


@pytest.mark.parametrize("source", list(VLLM_LARGE_ALLREDUCE_US))
def test_a_large_tp_allreduce_grows_as_vllm_measured_past_one_mib(source):
    """Issue 39: a decode batch of hundreds of sequences all-reduces MiBs (512 × 3584 × 2 B = 3.5 MiB for a 7B).
    Past 1 MiB vLLM leaves its one-shot kernel for two-shot / symmetric-memory all-reduces: the time from 1 to 4 MiB
    grows as vLLM's benchmark measured (14 µs over 3 MiB), within 15 %; the one-shot slope charged 96 µs."""
    from grpo_launch.planning.cost.steptime import allreduce_time

    at_1mb, at_4mb = VLLM_LARGE_ALLREDUCE_US[source]
    predicted = allreduce_time(4, 4 * 2**20) - allreduce_time(4, 2**20)
    assert predicted == pytest.approx((at_4mb - at_1mb) * 1e-6, rel=0.15)


def test_tp_communication_is_charged_per_layer_and_step():
    """Decode at TP 2 costs 2 × layers all-reduces per step more than the same engine's share of memory reads."""
    from grpo_launch.planning.cost.steptime import allreduce_time

    model, gpu = find_model_shape(QWEN7), find_gpu_spec("H100")
    one, why1 = generation_time(model, gpu, Parallelism(1), 64, WORK)
    two, why2 = generation_time(model, gpu, Parallelism(2), 64, WORK)
    assert "TP all-reduces" in why2 and "TP all-reduces" not in why1
    per_step = 2 * model.layers * allreduce_time(2, 64 * model.hidden * 2)
    assert 0 < per_step < 0.005 and two < one  # half the weights to read outweighs the all-reduces at 7B


def _batch_one_itl(model_name: str, gpu_name: str) -> float:
    """Seconds per decode step of one sequence on one GPU, from generation_time (a 1-token prompt, 1000 tokens)."""
    work = Workload(prompt_len=1, completion_len=1000, completions=1, num_generations=1, per_device=1,
                    gradient_checkpointing=False)  # fmt: skip
    seconds, _ = generation_time(find_model_shape(model_name), find_gpu_spec(gpu_name), Parallelism(1), 1, work)
    return seconds / 1000


def test_a_decode_step_costs_what_vllm_v1_measured():
    """decode_step_overhead_s: vLLM's FP8 KV-cache blog (blog.vllm.ai/2026/04/22/fp8-kvcache.html, vLLM 0.19.1, one
    H100, concurrency 1) fitted Llama-3.1-8B's inter-token latency at zero context to 6.44 ms; within 15 %."""
    assert _batch_one_itl("meta-llama/Llama-3.1-8B-Instruct", "H100-80GB") == pytest.approx(6.44e-3, rel=0.15)


# Qwen2.5 speed benchmark (qwen.readthedocs.io "Speed Benchmark", vLLM 0.6.3, A100-80GB, batch 1, 2048 tokens
# from a 1-token prompt): tokens/s. The older engine spent more per step (RFC #6854: 5–13 ms of GPU bubble), so the
# V1 model may only be faster, and not by more than the V0 overhead.
QWEN25_VLLM063_A100_TOKENS_PER_S = {"Qwen2.5-0.5B": 311.55, "Qwen2.5-1.5B": 183.33, "Qwen2.5-3B": 127.61,
                                    "Qwen2.5-7B": 84.28, "Qwen2.5-14B": 46.30}  # fmt: skip


@pytest.mark.parametrize("name", list(QWEN25_VLLM063_A100_TOKENS_PER_S))
def test_the_older_vllm_was_slower_per_step_by_its_larger_overhead(name):
    measured = 1 / QWEN25_VLLM063_A100_TOKENS_PER_S[name]
    predicted = _batch_one_itl(name, "A100-80GB")
    assert predicted < measured < predicted + 0.005


# TRL's weight sync measured (bf16 bytes, seconds, between nodes): TRL PR #5892 (Qwen3-0.6B, one H100 node), TRL PR
# #5249 (Qwen2 0.5B), verl PR #116 (Llama-3-8B, the broadcast alone: no fixed cost), verl PR #7263 (27B, 2 nodes),
# TRL PR #7131 (Qwen3-32B, 16 + 16 H200).
WEIGHT_SYNC_MEASURED = [
    ("Qwen3-0.6B", 0.18, False, True),
    ("Qwen2.5-0.5B", 0.15, False, True),
    ("Llama-3.1-8B", 0.70, False, False),
    (27e9, 3.01, True, True),
    ("Qwen3-32B", 2.3, True, True),
]


@pytest.mark.parametrize(("model", "seconds", "across", "fixed"), WEIGHT_SYNC_MEASURED)
def test_weight_sync_takes_what_rl_frameworks_measured(model, seconds, across, fixed):
    """sync_fixed_s + bf16 bytes at sync_bytes_per_s_{node,net}, within 50 % of each published sync."""
    from grpo_launch.models.shape import ModelShape
    from grpo_launch.planning.cost.constants import CONSTANTS
    from grpo_launch.planning.cost.steptime import sync_time

    shape = find_model_shape(model) if isinstance(model, str) else ModelShape("27B", model, 62, 5376, 32, 16, 262144)
    predicted = sync_time(shape, across_nodes=across) - (0 if fixed else CONSTANTS["sync_fixed_s"].value)
    assert predicted == pytest.approx(seconds, rel=0.5)


# NCCL all-reduce without NVLink: (TP, bytes) → µs. nccl-tests issue #287 (4 × RTX 5090, NCCL 2.26.2), sglang-V100
# PR #2 (4 × V100 on one PCIe switch, in a CUDA graph), b12x PR #139 (16 × RTX PRO 6000, 14 and 115 KB).
PCIE_ALLREDUCE_US = [(4, 32768, 31.64), (4, 131072, 35.19), (4, 1048576, 93.45), (4, 32768, 24.2),
                     (4, 131072, 51.8), (16, 14336, 36.07), (16, 114688, 39.65)]  # fmt: skip


@pytest.mark.parametrize(("tp", "nbytes", "us"), PCIE_ALLREDUCE_US)
def test_tp_allreduce_over_pcie_matches_the_published_measurements(tp, nbytes, us):
    from grpo_launch.planning.cost.steptime import allreduce_time

    # rel 0.4: at 128 KB the two 4-GPU sources differ by 47 % between themselves (35.19 and 51.8 µs)
    assert allreduce_time(tp, nbytes, nvlink=False) == pytest.approx(us * 1e-6, rel=0.4)


def test_gpus_without_nvlink_pay_ncclss_pcie_all_reduce():
    model, work = find_model_shape(QWEN7), WORK
    nv, _ = generation_time(model, find_gpu_spec("H100-80GB"), Parallelism(4), 64, work)
    pcie_spec = dataclasses.replace(find_gpu_spec("H100-80GB"), nvlink=False)
    pcie, _ = generation_time(model, pcie_spec, Parallelism(4), 64, work)
    assert pcie > nv and not find_gpu_spec("L40S").nvlink and find_gpu_spec("A100-80GB").nvlink


# Point-to-point between pipeline stages: (bytes, seconds, across nodes). nccl-tests #293 (2 × A100, InfiniBand, 8
# B–1 KB: 20.4–20.8 µs), #214 (two A40 hosts, send/recv 4 KB: 30.74 µs); 46–48 GB/s per NDR NIC (nccl-tests #290)
# and 42–43 GB/s send/recv over EFA (the HF Smol Training Playbook) for 1 GiB; NCCL #1259: ~6 µs between two
# NVLink GPUs.
P2P_MEASURED = [(1024, 20.77e-6, True), (4096, 30.74e-6, True), (2**30, 2**30 / 47e9, True),
                (2**30, 2**30 / 42.5e9, True), (8, 6e-6, False)]  # fmt: skip


@pytest.mark.parametrize(("nbytes", "seconds", "across"), P2P_MEASURED)
def test_pipeline_sends_take_what_nccl_tests_measured(nbytes, seconds, across):
    from grpo_launch.planning.cost.steptime import p2p_time

    assert p2p_time(nbytes, across_nodes=across) == pytest.approx(seconds, rel=0.35)


def test_a_pipeline_decodes_no_faster_than_replicas_on_the_same_gpus():
    """A pipeline of PP stages keeps PP micro-batches in flight: per round each stage reads its weights PP times
    (as one TP group reads the model) and its layers' KV cache, so PP stages decode like PP replicas of TP GPUs
    (each its share of the batch), plus the stages' hops and per-micro-batch overheads; over the network more."""
    model, gpu = find_model_shape("meta-llama/Llama-3.1-70B-Instruct"), find_gpu_spec("H100-80GB")
    work = dataclasses.replace(WORK, completions=128, generation_batch=128)
    dp2, _ = generation_time(model, gpu, Parallelism(8, dp=2), 64, work)
    pp2, why = generation_time(model, gpu, Parallelism(8, 2), 128, work, pp_across_nodes=True)
    near, _ = generation_time(model, gpu, Parallelism(8, 2), 128, work, pp_across_nodes=False)
    assert "stage hops" in why and "2 micro-batches" in why
    assert dp2 < near < pp2 < 1.5 * dp2


def test_vllm_start_up_against_published_start_up_times():
    """The vLLM ready time (constants.py vllm_ready_s_*) against start-ups published with their parts: vllm #19824
    (Llama-70B TP 8: 60 s P2P check + 10 s load + 15 s Dynamo + 70 s compile + 60 s graphs = 215 s), vllm #20264 (a
    small Llama-3.2, 3.4 GiB: first response at 59 s), and for Llama-3-8B the sum of vllm #11005's engine init with
    compile (39.3 s), #10647's load of a 7B (7.3 s) and #15225's imports before the device (19 s): 65.6 s before the
    API server and the first request's warm-up, so a lower bound."""
    from grpo_launch.planning.cost.startup import vllm_ready_s

    assert vllm_ready_s(70e9) == pytest.approx(215.0, rel=0.15)
    assert vllm_ready_s(1.8e9) == pytest.approx(59.0, rel=0.3)
    assert 65.6 <= vllm_ready_s(8e9) <= 2 * 65.6
    assert vllm_ready_s(0.5e9) <= vllm_ready_s(7e9) <= vllm_ready_s(32e9) <= vllm_ready_s(405e9)


def test_time_to_first_step_is_a_term_of_its_own():
    """Paid before the first step and again on every restart: shown by the plan, in plan.json, added once to the
    whole run. A server starts while the trainers load; colocated engines start after them, in the trainers."""
    from grpo_launch.render.plan_json import plan_to_dict

    from .helpers import ROOT

    recipe = ROOT / "recipes" / "qwen7b-math.yaml"
    colocate = plan_recipe(recipe, "8xH100-80GB", "launch.vllm=colocate", "launch.dataset_rows=1200")
    server = plan_recipe(recipe, "8xH100-80GB", "launch.vllm=server", "launch.dataset_rows=1200")
    for plan in (colocate, server):
        est = plan.estimate
        assert 60 <= est.startup_s <= 300 and plan_to_dict(plan)["estimate"]["startup_s"] == est.startup_s
        steps = est.total.steps * est.step.total_s
        assert est.total.hours * 3600 == pytest.approx(steps + est.restart_s)
        assert any(line.startswith("time to first step ≈") for line in est.explain)
    assert colocate.estimate.startup_s > server.estimate.startup_s  # serial in the trainers, parallel beside them
