"""What the mutation run over planning/layout.py and planning/placement.py found unpinned (docs/mutation-testing.md):
a refusal's exact text (its message, every problem, the fixes in rank order with their reasons), the fixes' costs,
the layout's reasons for each choice, the planned sizes reaching the trainer, and placement's decisions, server
fields and refusals. Every expected value below was worked out from TRL's batch rules (layout.py's docstring) and
the case's numbers, as each comment shows; all run the real planner, nothing is faked."""

from __future__ import annotations

import pytest

from grpo_launch.errors import PlanError
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning.layout import LayoutRequest, solve_layout

from .helpers import plan_recipe

QWEN15 = "Qwen/Qwen2.5-1.5B-Instruct"
LLAMA405 = "meta-llama/Llama-3.1-405B-Instruct"
HEAD = "no valid batch layout for {} training processes:"


def _refusal(n: int, req: dict, **kw) -> PlanError:
    with pytest.raises(PlanError) as info:
        solve_layout(n, LayoutRequest(**req), **kw)
    return info.value


@pytest.mark.parametrize(
    ("n", "req", "kw", "text", "costs"),
    [
        # 20 over 3 processes: no per-device batch divides it; the next multiple of lcm(1×3, 8) = 24 is the fix.
        (3, dict(generation_batch_size=20), {}, [
            HEAD.format(3), "  - generation_batch_size=20 is not divisible by the 3 training processes",
            "Nearest valid alternatives:", "  1. set generation_batch_size=24"], [0.182]),
        # 24 is not a multiple of 16: lcm(4×2, 16) = 16 gives 16 or 32 (32 nearer in log); 24's divisor nearest 16
        # is 12 (the algorithm changes, rank 2, +0.5).
        (2, dict(per_device=4, generation_batch_size=24, num_generations=16), {}, [
            HEAD.format(2), "  - generation_batch_size=24 is not divisible by num_generations=16",
            "Nearest valid alternatives:", "  1. set generation_batch_size=32", "  2. set generation_batch_size=16",
            "  3. set num_generations=12"], [0.288, 0.405, 0.788]),
        # 1×3×2 = 6 completions per generation, groups of 8: steps_per_generation 8 (with the accumulation, on
        # policy), per-device 4 (4×3×2 = 24), group 6 or 3 (divisors of 6 nearest 8), colocate on 4 (1×4×2 = 8),
        # or 8 steps off policy (accumulation stays 1: a lag of 8).
        (3, dict(per_device=1, steps_per_generation=2, num_generations=8), dict(colocate_n=4), [
            HEAD.format(3),
            "  - generation batch 1×3 processes×2 steps_per_generation = 6 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=8 with gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  2. set per_device_train_batch_size=4", "  3. set num_generations=3 or 6",
            "  4. set launch.vllm=colocate (use colocated vLLM: 4 training processes)",
            "  5. set steps_per_generation=8 (off policy: one generation serves 8 optimizer steps of 3 completions, "
            "the last on a policy 7 step(s) old)"], [1.386, 1.386, 0.788, 1.0, 2.386]),
        # 2×3×5 = 30: steps of 4 or 8 (multiples of 8/gcd(6, 8) = 4 around 5), per-device 8 (8×3×5 = 120), groups
        # 6 or 10; neither 4 nor 8 is a multiple of the recipe's accumulation 3, so no off-policy fix.
        (3, dict(per_device=2, grad_accum=3, steps_per_generation=5, num_generations=8), dict(colocate_n=3), [
            HEAD.format(3),
            "  - generation batch 2×3 processes×5 steps_per_generation = 30 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=4 with gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  2. set steps_per_generation=8 with gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 10"],
         [0.223, 0.47, 1.386, 0.723]),
        # steps_per_generation equal to the recipe's accumulation (4 = 4): on policy with nothing else to change,
        # and a steps_per_generation that is the accumulation's multiple (8 = 2 × 4) also off policy, lag 2.
        (3, dict(per_device=2, grad_accum=4, steps_per_generation=5, num_generations=8), {}, [
            HEAD.format(3),
            "  - generation batch 2×3 processes×5 steps_per_generation = 30 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=4 (one generation per optimizer step)",
            "  2. set steps_per_generation=8 with gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 10",
            "  5. set steps_per_generation=8 (off policy: one generation serves 2 optimizer steps of 24 completions, "
            "the last on a policy 1 step(s) old)"], [0.223, 0.47, 1.386, 0.723, 1.47]),
        # 1×3×2 = 6 per step, groups of 8: accumulate 8 (on policy), per-device 4, groups 3 or 6, colocate on 4,
        # or one generation of 8/gcd(6, 8) = 4 steps (off policy, lag 3).
        (3, dict(per_device=1, grad_accum=2, num_generations=8), dict(colocate_n=4), [
            HEAD.format(3),
            "  - global batch 1×3 processes×2 gradient_accumulation_steps = 6 is not divisible by num_generations=8, "
            "and a generation that served more than one optimizer step would train off policy",
            "Nearest valid alternatives:", "  1. set gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  2. set per_device_train_batch_size=4", "  3. set num_generations=3 or 6 (a different group size)",
            "  4. set launch.vllm=colocate (use colocated vLLM: 4 training processes)",
            "  5. set steps_per_generation=8 (off policy: one generation serves 4 optimizer steps, the last trains on "
            "completions from a policy 3 step(s) old)"], [1.386, 1.386, 0.788, 0.9, 1.0]),
        # 2×3×6 = 36: accumulation 8 or 4 (multiples of 8/gcd(6, 8) = 4 around 6), per-device 4, groups 9 or 6
        # (36's divisors nearest 8), a lag of 8/gcd(36, 8) = 2.
        (3, dict(per_device=2, grad_accum=6, num_generations=8), dict(colocate_n=3), [
            HEAD.format(3),
            "  - global batch 2×3 processes×6 gradient_accumulation_steps = 36 is not divisible by num_generations=8, "
            "and a generation that served more than one optimizer step would train off policy",
            "Nearest valid alternatives:", "  1. set gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  2. set gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=4", "  4. set num_generations=6 or 9 (a different group size)",
            "  5. set steps_per_generation=12 (off policy: one generation serves 2 optimizer steps, the last trains on "
            "completions from a policy 1 step(s) old)"], [0.288, 0.405, 0.693, 0.618, 1.0]),
        # Eval: 3×3 = 9 is not a multiple of the 8 generations: per-device eval 8 (9's nearest multiple of 8/gcd(3,
        # 8)), or num_generations_eval 9 (9's divisor nearest 8).
        (3, dict(eval_on=True, per_device_eval=3, num_generations=8), {}, [
            HEAD.format(3), "  - global eval batch 3×3 processes = 9 is not divisible by the num_generations (8)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=8", "  2. set num_generations_eval=9"],
         [0.981, 1.118]),
        (3, dict(eval_on=True, per_device_eval=3, num_generations=8, num_generations_eval=4), {}, [
            HEAD.format(3), "  - global eval batch 3×3 processes = 9 is not divisible by the num_generations_eval (4)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=4", "  2. set num_generations_eval=3"],
         [0.288, 1.288]),
        (3, dict(num_generations=8), dict(completions=20), [
            HEAD.format(3), "  - 20 completions (2 prompts × 8) do not split over 3 processes"], []),
        (4, dict(per_device=3, num_generations=8), dict(completions=32), [
            HEAD.format(4),
            "  - 32 completions over 4 processes are 8 each, not a whole number of per_device_train_batch_size=3"], []),
        (1, dict(per_device=3, num_generations=8), dict(completions=32), [
            "no valid batch layout for 1 training process:",
            "  - 32 completions over 1 processes are 32 each, not a whole number of per_device_train_batch_size=3"],
         []),
        (0, dict(), {}, ["no GPU is left for training", "Use more GPUs, or launch.vllm=colocate."], []),
        (2, dict(generation_batch_size=16, steps_per_generation=2), {}, [
            "generation_batch_size and steps_per_generation are both set; TRL accepts only one of them",
            "Remove one: generation_batch_size = per_device_train_batch_size × processes × steps_per_generation."], []),
    ],
)  # fmt: skip
def test_a_layout_refusal_names_every_problem_and_ranks_the_fixes(n, req, kw, text, costs):
    err = _refusal(n, req, **kw)
    assert err.render().splitlines() == text
    assert [round(f.cost, 3) for f in err.fixes] == costs
    assert all(f.in_recipe and f.setting for f in err.fixes)


@pytest.mark.parametrize(
    ("n", "req", "kw", "expect", "why"),
    [
        # The user's generation batch: 24 over 2 × 3 per device = 4 steps per generation (an int, as TRL needs).
        (2, dict(per_device=3, generation_batch_size=24, num_generations=8), {},
         dict(per_device_train_batch_size=3, gradient_accumulation_steps=1, steps_per_generation=4,
              generation_batch_size=24, generation_batch_size_given=True), []),
        # 48 completions over 3: 16 each; the recipe's accumulation 3 does not divide 16, so 8 per device × 2.
        (3, dict(grad_accum=3, num_generations=8), dict(completions=48),
         dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=2,
              generation_batch_size=48),
         ["gradient_accumulation_steps=2 (the recipe says 3): 8 per device × 3 processes × 2 = 48 completions, the 6 "
          "prompts per step every split is planned for"]),
        # 36 over 3 = 12 each: the divisor of 12 nearest TRL's 8 is 6, accumulate 2.
        (3, dict(num_generations=6), dict(completions=36),
         dict(per_device_train_batch_size=6, gradient_accumulation_steps=2, steps_per_generation=2),
         ["gradient_accumulation_steps=2: 6 per device × 3 processes × 2 = 36 completions = 6 prompts × 6",
          "per_device_train_batch_size=6: 36 completions over 3 processes"]),
        # 32 over 2 = 16 each, the recipe's accumulation 4 divides it: 4 per device.
        (2, dict(grad_accum=4, num_generations=8), dict(completions=32),
         dict(per_device_train_batch_size=4, gradient_accumulation_steps=4, steps_per_generation=4),
         ["per_device_train_batch_size=4: 32 completions over 2 processes"]),
        # 1 × 3 processes: the least accumulation filling groups of 8 is 8.
        (3, dict(per_device=1, num_generations=8), {},
         dict(gradient_accumulation_steps=8, steps_per_generation=8, generation_batch_size=24),
         ["gradient_accumulation_steps=8: 1×3 processes is not a multiple of num_generations=8; accumulating 8 steps "
          "gives 24 completions = 3 prompts × 8"]),
        # One process, groups of 16: per-device 16 for training and for evaluation.
        (1, dict(num_generations=16, eval_on=True), {},
         dict(per_device_train_batch_size=16, per_device_eval_batch_size=16, num_generations_eval=None),
         ["per_device_train_batch_size=16: 16×1 processes×1 is a multiple of 16",
          "per_device_eval_batch_size=16: 16×1 processes is a multiple of 16"]),
        # The recipe's eval group: 4 × 3 = 12 is a multiple of 6, kept and passed on.
        (3, dict(eval_on=True, per_device_eval=4, num_generations_eval=6), {},
         dict(per_device_eval_batch_size=4, num_generations_eval=6, generation_batch_size_given=False), []),
    ],
)  # fmt: skip
def test_a_layout_choice_states_its_reason(n, req, kw, expect, why):
    layout, reasons = solve_layout(n, LayoutRequest(**req), **kw)
    got = {k: getattr(layout, k) for k in expect}
    assert got == expect and all(type(v) is type(expect[k]) for k, v in got.items())
    assert reasons == why
    values = layout.trl_values()
    assert ("generation_batch_size" in values) is layout.generation_batch_size_given
    assert ("steps_per_generation" in values) is not layout.generation_batch_size_given


def test_the_planned_accumulation_reaches_the_trainer():
    """Seed case 1 (4 × L20, vLLM on one GPU): the plan accumulates 8 steps, and that is what the trainer reads, under
    TRL's own key names only."""
    plan = plan_recipe({"model_name_or_path": QWEN15, "num_generations": 8, "per_device_train_batch_size": 1,
                        "launch": {"vllm_gpus": 1}}, "4xL20-48GB")  # fmt: skip
    values = plan.trainer_values
    assert (values["gradient_accumulation_steps"], values["steps_per_generation"]) == (8, 8)
    assert values["per_device_train_batch_size"] == 1 and values["num_generations"] == 8
    assert not [k for k in values if k != k.lower()]


SERVER_KEYS = ("vllm_tensor_parallel_size", "vllm_pipeline_parallel_size", "vllm_data_parallel_size", "server_gpus",
               "vllm_nodes", "vllm_gpu_memory_utilization", "vllm_enable_sleep_mode")  # fmt: skip
NODE_DP = ("vLLM's multi-node data parallel: the API server and 2 rank(s) on node1, 1 more host(s) run their ranks "
           "headless; TRL's weight sync reaches every rank through the API server")  # fmt: skip
NODE_PP = ("vLLM's multi-node serving (--nnodes): the API server and the first stage on node4, 3 more host(s) run "
           "their stages headless; TRL's weight sync reaches every rank through the API server")  # fmt: skip
ALL8 = "0,1,2,3,4,5,6,7"


@pytest.mark.parametrize(
    ("values", "gpus", "model", "decisions", "vllm", "notices"),
    [
        # Seed case 1: the server on the last GPU, on this host only (loopback address and bind).
        ({"num_generations": 8, "per_device_train_batch_size": 1, "launch": {"vllm_gpus": 1}}, "4xL20-48GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "1 server GPU(s) as TP 1"),
          ("server_gpus", "localhost:3", "server on 1 GPU(s) (TP 1)")],
         dict(mode="server", host="localhost", address="127.0.0.1", bind_host="127.0.0.1", gpus=("3",), nodes=(),
              tensor_parallel_size=1, data_parallel_size=1, pipeline_parallel_size=1, gpu_memory_utilization=0.9),
         []),
        # TRL's vllm_tensor_parallel_size and vllm_gpu_memory_utilization move to the server, each said.
        ({"vllm_gpu_memory_utilization": 0.7, "vllm_tensor_parallel_size": 2, "launch": {"vllm": "server",
          "vllm_gpus": 2}}, "4xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 2, "2 server GPU(s) as TP 2"),
          ("server_gpus", "localhost:2,3", "server on 2 GPU(s) (TP 2)")],
         dict(mode="server", gpus=("2", "3"), tensor_parallel_size=2, gpu_memory_utilization=0.7),
         ["vllm_tensor_parallel_size=2: used as the vLLM server's --tensor-parallel-size",
          "vllm_gpu_memory_utilization=0.7: moved to the vLLM server's --gpu-memory-utilization (TRL only reads it "
          "in colocate mode)"]),
        # Two whole hosts serve as TP 4 × DP 4: the first host's address, bound on every interface.
        ({"launch": {"vllm": "server", "vllm_gpus": 16}}, "3x8xH100-80GB", "Qwen/Qwen2.5-7B-Instruct",
         [("vllm_tensor_parallel_size", 4, "16 server GPU(s) as TP 4 × DP 4"),
          ("vllm_data_parallel_size", 4, "4 replicas of the model, each with its own KV cache and decode batch"),
          ("server_gpus", f"node1:{ALL8} node2:{ALL8}", "2 whole host(s) serve (16 GPUs, TP 4 × DP 4)"),
          ("vllm_nodes", 2, NODE_DP)],
         dict(host="node1", address="node1", bind_host="0.0.0.0", data_parallel_size=4, expert_parallel=False),
         []),
        # Llama-3.1-405B: TP 8 alone does not hold it in half a GPU; 4 pipeline stages over 4 whole hosts.
        ({"use_peft": True, "num_generations": 8, "max_completion_length": 1024, "per_device_train_batch_size": 1,
          "max_prompt_length": 512}, "8x8xH100-80GB", LLAMA405,
         [("vllm_tensor_parallel_size", 8, "32 server GPU(s) as TP 8 × PP 4"),
          ("vllm_pipeline_parallel_size", 4, "no server of tensor parallelism alone holds Llama-3.1-405B (756 GiB of "
           "bf16 weights) in half of each GPU: 4 pipeline stages of TP 8, 24.2 GiB per GPU, each replica over 4 hosts"),
          ("server_gpus", " ".join(f"node{i}:{ALL8}" for i in range(4, 8)), "4 whole host(s) serve (32 GPUs, TP 8 × "
           "PP 4)"),
          ("vllm_nodes", 4, NODE_PP)],
         dict(host="node4", address="node4", bind_host="0.0.0.0", pipeline_parallel_size=4, data_parallel_size=1),
         []),
        # Colocated on both GPUs as one TP-2 engine, the recipe's utilization and sleep mode kept.
        ({"vllm_enable_sleep_mode": True, "vllm_gpu_memory_utilization": 0.5, "launch": {"vllm": "colocate"}},
         "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 2, "colocate: 1 engine(s) of TP 2"),
          ("vllm_gpu_memory_utilization", 0.5, "vLLM shares each training GPU (colocate)"),
          ("vllm_enable_sleep_mode", True, "set in the recipe: vLLM frees its memory while the trainers train (a "
           "wake-up each step)")],
         dict(mode="colocate", tensor_parallel_size=2, gpu_memory_utilization=0.5, sleep_mode=True), []),
        # TRL's vllm_mode: colocate alone asks for colocate.
        ({"vllm_mode": "colocate"}, "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 2, "colocate: 1 engine(s) of TP 2"),
          ("vllm_gpu_memory_utilization", 0.3, "vLLM shares each training GPU (colocate)"),
          ("vllm_enable_sleep_mode", False, "TRL's default: vLLM keeps its share while the trainers train, and the "
           "training budget leaves it")],
         dict(mode="colocate", sleep_mode=False), []),
        # use_vllm: false on GPUs: no vLLM at all.
        ({"use_vllm": False}, "2xH100-80GB", QWEN15, [], dict(mode="off"), []),
    ],
)  # fmt: skip
def test_placement_decides_the_server_and_says_why(values, gpus, model, decisions, vllm, notices):
    plan = plan_recipe({"model_name_or_path": model, **values}, gpus, model=find_model_shape(model))
    assert [(d.what, d.value, d.why) for d in plan.decisions if d.what in SERVER_KEYS] == decisions
    assert {k: getattr(plan.vllm, k) for k in vllm} == vllm
    assert [n for n in plan.notices if n.startswith("vllm_")] == notices


@pytest.mark.parametrize(
    ("values", "gpus", "model", "text"),
    [
        ({"use_vllm": False, "launch": {"vllm": "server"}}, "2xH100-80GB", QWEN15, [
            "the recipe sets use_vllm: false but launch.vllm=server",
            "Remove one of them: use_vllm: true with launch.vllm, or launch.vllm=off."]),
        ({"vllm_mode": "colocate", "launch": {"vllm": "server"}}, "2xH100-80GB", QWEN15, [
            "the recipe sets vllm_mode: colocate but launch.vllm=server",
            "Keep one: grpo-launch writes vllm_mode for the trainer from launch.vllm."]),
        ({"vllm_mode": "server"}, "cpu", QWEN15, [
            "vLLM server mode needs CUDA GPUs, and this topology has none",
            "On CPU, generate with transformers: launch.vllm=off (or use_vllm: false). To plan for GPUs from here, "
            "pass --gpus, e.g. --gpus 4xL20-48GB."]),
        ({"launch": {"vllm": "colocate", "vllm_pipeline_parallel_size": 2}}, "8xH100-80GB", QWEN15, [
            "launch.vllm_pipeline_parallel_size=2 with colocated vLLM: TRL's colocate mode runs tensor parallelism "
            "only", "Drop launch.vllm_pipeline_parallel_size, or use launch.vllm=server."]),
        ({"launch": {"vllm_gpus": 3, "vllm_tensor_parallel_size": 2}}, "8xH100-80GB", QWEN15, [
            "launch.vllm_gpus=3 is not a multiple of the tensor-parallel size 2",
            "A server of TP × DP GPUs: set launch.vllm_gpus to a multiple of the TP size, or leave one unset."]),
        ({"launch": {"vllm_gpus": 4, "vllm_pipeline_parallel_size": 2}}, "8xH100-80GB", None, [
            "no vLLM server of 2 pipeline stages fits 1 host(s) of 8 GPUs as 4 GPU(s)",
            "Each replica is TP × PP GPUs, within a host or over whole hosts, and leaves GPUs to train: change "
            "launch.vllm_pipeline_parallel_size (or launch.vllm_gpus), or leave it unset to choose."]),
        ({"launch": {"vllm_tensor_parallel_size": 16}}, "8xH100-80GB", QWEN15, [
            "the vLLM tensor-parallel size is not possible:",
            "  - tensor-parallel size 16 exceeds the 8 GPUs of one host (TP stays in a node)",
            "  - vLLM cannot shard Qwen2.5-1.5B over 16 GPUs: 16 does not divide its 12 attention heads",
            "Valid sizes here: 1, 2, 4 (or leave it unset to choose)."]),
        ({"launch": {"vllm": "server"}}, "2x8xH100-80GB", LLAMA405, [
            "Llama-3.1-405B (756 GiB of bf16 weights) does not fit a vLLM server on up to 14 GPUs of 80 GiB (tensor "
            "parallel within a node of 8, pipeline stages over nodes)",
            "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
            "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a "
            "smaller model."]),
        ({}, "2x8xH100-80GB", LLAMA405, [
            "Llama-3.1-405B (756 GiB of bf16 weights) does not fit vLLM on up to 14 GPUs of 80 GiB (tensor parallel "
            "within a node of 8, pipeline stages over nodes): not as a server (the weights take over half of each "
            "GPU) nor colocated (they take over 90% of each GPU)",
            "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
            "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a "
            "smaller model."]),
    ],
)  # fmt: skip
def test_a_placement_refusal_names_the_key_and_the_fix(values, gpus, model, text):
    with pytest.raises(PlanError) as info:
        plan_recipe({"model_name_or_path": model or QWEN15, **values}, gpus,
                     model=find_model_shape(model) if model else None)  # fmt: skip
    assert info.value.render().splitlines() == text


def test_a_server_taking_every_gpu_offers_a_smaller_one_and_more_gpus():
    """2 × H100 with launch.vllm_gpus=2: nothing would train. A 1-GPU server fits the 1.5B model's weights in half a
    GPU (rank 0), and 3 GPUs is the least that leaves one to train (a change outside the recipe)."""
    with pytest.raises(PlanError) as info:
        plan_recipe({"model_name_or_path": QWEN15, "launch": {"vllm_gpus": 2}}, "2xH100-80GB")
    err = info.value
    assert err.message == "the vLLM server needs 2 GPU(s), leaving none of the 2 for training"
    assert [str(f) for f in err.fixes] == ["set launch.vllm_gpus=1 (a smaller server leaves GPUs to train)",
                                           "more GPUs: at least 3"]  # fmt: skip
    assert [(f.setting, f.rank, f.in_recipe) for f in err.fixes] == [("launch.vllm_gpus", 0, True), ("gpus", 3, False)]
