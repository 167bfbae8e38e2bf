"""What the mutation run over planning/layout.py and planning/placement.py found unpinned (docs/mutation-testing.md):
a refusal's exact text (its message, every problem, the fixes in rank order with their reasons), the fixes' costs,
the layout's reasons for each choice, the planned sizes reaching the trainer, and placement's decisions, server
fields and refusals. The layout cases were worked out from TRL's batch rules (layout.py's docstring), each one's
arithmetic in its comment; the placement texts pin what the planner says, each read against the case's numbers (the
weight shares, the GPUs). All run the real planner (solve_layout, allowed_splits, unfit_servers, the whole plan);
nothing is faked."""

from __future__ import annotations

import pytest

from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import Gpu, Host, Topology, parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning.batch_layout import LayoutRequest, solve_layout
from grpo_launch.planning.plan_types import Trace
from grpo_launch.planning.splits.allowed import allowed_splits
from grpo_launch.planning.splits.refusals import NoGpuLeftForTraining, unfit_servers
from grpo_launch.recipe import build_recipe

from .helpers import plan_recipe

QWEN15 = "Qwen/Qwen2.5-1.5B-Instruct"
LLAMA405 = "meta-llama/Llama-3.1-405B-Instruct"
HEAD = "no valid batch layout for {} training processes:"


def _refusal(n: int, req: dict, **kw) -> PlanError:
    with pytest.raises(PlanError) as info:
        solve_layout(n, LayoutRequest(**req), **kw)
    return info.value


@pytest.mark.parametrize(
    ("n", "req", "kw", "text", "fixes"),
    [
        # 20 over 3 processes: no per-device batch divides it; the next multiple of lcm(1×3, 8) = 24 is the fix.
        (3, dict(generation_batch_size=20), {}, [
            HEAD.format(3), "  - generation_batch_size=20 is not divisible by the 3 training processes",
            "Nearest valid alternatives:", "  1. set generation_batch_size=24"], [(0, 0.182)]),
        # 24 is not a multiple of 16: lcm(4×2, 16) = 16 gives 16 or 32 (32 nearer in log); 24's divisor nearest 16
        # is 12 (the algorithm changes, rank 2, +0.5).
        (2, dict(per_device=4, generation_batch_size=24, num_generations=16), {}, [
            HEAD.format(2), "  - generation_batch_size=24 is not divisible by num_generations=16",
            "Nearest valid alternatives:", "  1. set generation_batch_size=32", "  2. set generation_batch_size=16",
            "  3. set num_generations=12"], [(0, 0.288), (0, 0.405), (2, 0.788)]),
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
            "the last on a policy 7 step(s) old)"], [(0, 1.386), (1, 1.386), (2, 0.788), (3, 1.0), (3, 2.386)]),
        # 2×3×5 = 30: steps of 4 or 8 (multiples of 8/gcd(6, 8) = 4 around 5), per-device 8 (8×3×5 = 120), groups
        # 6 or 10; neither 4 nor 8 is a multiple of the recipe's accumulation 3, so no off-policy fix.
        (3, dict(per_device=2, grad_accum=3, steps_per_generation=5, num_generations=8), dict(colocate_n=3), [
            HEAD.format(3),
            "  - generation batch 2×3 processes×5 steps_per_generation = 30 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=4 with gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  2. set steps_per_generation=8 with gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 10"],
         [(0, 0.223), (0, 0.47), (1, 1.386), (2, 0.723)]),
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
            "the last on a policy 1 step(s) old)"], [(0, 0.223), (0, 0.47), (1, 1.386), (2, 0.723), (3, 1.47)]),
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
            "completions from a policy 3 step(s) old)"], [(0, 1.386), (1, 1.386), (2, 0.788), (3, 0.9), (3, 1.0)]),
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
            "completions from a policy 1 step(s) old)"], [(0, 0.288), (0, 0.405), (1, 0.693), (2, 0.618), (3, 1.0)]),
        # Eval: 3×3 = 9 is not a multiple of the 8 generations: per-device eval 8 (9's nearest multiple of 8/gcd(3,
        # 8)), or num_generations_eval 9 (9's divisor nearest 8).
        (3, dict(eval_on=True, per_device_eval=3, num_generations=8), {}, [
            HEAD.format(3), "  - global eval batch 3×3 processes = 9 is not divisible by the num_generations (8)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=8", "  2. set num_generations_eval=9"],
         [(1, 0.981), (2, 1.118)]),
        (3, dict(eval_on=True, per_device_eval=3, num_generations=8, num_generations_eval=4), {}, [
            HEAD.format(3), "  - global eval batch 3×3 processes = 9 is not divisible by the num_generations_eval (4)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=4", "  2. set num_generations_eval=3"],
         [(1, 0.288), (2, 1.288)]),
        # A pinned batch the trainers cannot take: the nearest batches they take, and a per-device batch that
        # divides each trainer's share (issue 36: named, never applied).
        (3, dict(num_generations=8), dict(completions=20), [
            HEAD.format(3), "  - 20 completions (2 prompts × 8) do not split over 3 processes",
            "Nearest valid alternatives:", "  1. set launch.prompts_per_step=3 (3 trainers take it evenly (a different "
            "batch))"], [(1, 0.405)]),
        (4, dict(per_device=3, num_generations=8), dict(completions=32), [
            HEAD.format(4),
            "  - 32 completions over 4 processes are 8 each, not a whole number of per_device_train_batch_size=3",
            "Nearest valid alternatives:",
            "  1. set launch.prompts_per_step=3 (4 trainers take it evenly (a different batch))",
            "  2. set launch.prompts_per_step=6 (4 trainers take it evenly (a different batch))",
            "  3. set per_device_train_batch_size=2 (8 completions per trainer)"],
         [(1, 0.288), (1, 0.405), (1, 0.405)]),
        (1, dict(per_device=3, num_generations=8), dict(completions=32), [
            "no valid batch layout for 1 training process:",
            "  - 32 completions over 1 processes are 32 each, not a whole number of per_device_train_batch_size=3",
            "Nearest valid alternatives:",
            "  1. set launch.prompts_per_step=3 (1 trainer takes it evenly (a different batch))",
            "  2. set launch.prompts_per_step=6 (1 trainer takes it evenly (a different batch))",
            "  3. set per_device_train_batch_size=2 (32 completions per trainer)"],
         [(1, 0.288), (1, 0.405), (1, 0.405)]),
        # 5×2 = 10 and groups of 4: the even per-device eval batch nearest 5 is 4 (a tie with 6 goes down), and
        # 10's divisor nearest 4 is 5.
        (2, dict(eval_on=True, per_device_eval=5, num_generations_eval=4), {}, [
            HEAD.format(2), "  - global eval batch 5×2 processes = 10 is not divisible by the num_generations_eval (4)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=4", "  2. set num_generations_eval=5"],
         [(1, 0.223), (2, 1.223)]),
        # A divisor of 2 is a group of 2; a global eval batch of 1 has no divisor of at least 2 to offer.
        (1, dict(eval_on=True, per_device_eval=2, num_generations=3), {}, [
            "no valid batch layout for 1 training process:",
            "  - global eval batch 2×1 processes = 2 is not divisible by the num_generations (3)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=3", "  2. set num_generations_eval=2"],
         [(1, 0.405), (2, 1.405)]),
        (1, dict(eval_on=True, per_device_eval=1, num_generations=2), {}, [
            "no valid batch layout for 1 training process:",
            "  - global eval batch 1×1 processes = 1 is not divisible by the num_generations (2)",
            "Nearest valid alternatives:", "  1. set per_device_eval_batch_size=2"], [(1, 0.693)]),
        # 2×3×9 = 54: accumulation 8 or 12 (the multiples of 4 around 9), per-device 8, groups 9 or 6, a lag of
        # 8/gcd(54, 8) = 4 generations of 9 steps.
        (3, dict(per_device=2, grad_accum=9, num_generations=8), {}, [
            HEAD.format(3),
            "  - global batch 2×3 processes×9 gradient_accumulation_steps = 54 is not divisible by num_generations=8, "
            "and a generation that served more than one optimizer step would train off policy",
            "Nearest valid alternatives:", "  1. set gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  2. set gradient_accumulation_steps=12 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 9 (a different group size)",
            "  5. set steps_per_generation=36 (off policy: one generation serves 4 optimizer steps, the last trains on "
            "completions from a policy 3 step(s) old)"], [(0, 0.118), (0, 0.288), (1, 1.386), (2, 0.618), (3, 1.0)]),
        # The same with steps_per_generation 9 (accumulation TRL's 1): each rhythm on policy, or off policy with
        # its lag of 8 or 12 steps.
        (3, dict(per_device=2, steps_per_generation=9, num_generations=8), {}, [
            HEAD.format(3),
            "  - generation batch 2×3 processes×9 steps_per_generation = 54 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=8 with gradient_accumulation_steps=8 (one generation per optimizer step)",
            "  2. set steps_per_generation=12 with gradient_accumulation_steps=12 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 9",
            "  5. set steps_per_generation=8 (off policy: one generation serves 8 optimizer steps of 6 completions, "
            "the last on a policy 7 step(s) old)",
            "  6. set steps_per_generation=12 (off policy: one generation serves 12 optimizer steps of 6 completions, "
            "the last on a policy 11 step(s) old)"],
         [(0, 0.118), (0, 0.288), (1, 1.386), (2, 0.618), (3, 1.118), (3, 1.288)]),
        # 6 completions, groups of 4: the nearest groups are 3 and 2 (a tie of 2 with 6 goes down).
        (3, dict(per_device=1, grad_accum=2, num_generations=4), {}, [
            HEAD.format(3),
            "  - global batch 1×3 processes×2 gradient_accumulation_steps = 6 is not divisible by num_generations=4, "
            "and a generation that served more than one optimizer step would train off policy",
            "Nearest valid alternatives:", "  1. set gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  2. set per_device_train_batch_size=2", "  3. set num_generations=2 or 3 (a different group size)",
            "  4. set steps_per_generation=4 (off policy: one generation serves 2 optimizer steps, the last trains on "
            "completions from a policy 1 step(s) old)"], [(0, 0.693), (1, 0.693), (2, 0.788), (3, 1.0)]),
        (3, dict(per_device=1, steps_per_generation=2, num_generations=4), {}, [
            HEAD.format(3),
            "  - generation batch 1×3 processes×2 steps_per_generation = 6 is not divisible by num_generations=4",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=4 with gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  2. set per_device_train_batch_size=2", "  3. set num_generations=2 or 3",
            "  4. set steps_per_generation=4 (off policy: one generation serves 4 optimizer steps of 3 completions, "
            "the last on a policy 3 step(s) old)"], [(0, 0.693), (1, 0.693), (2, 0.788), (3, 1.693)]),
        # steps_per_generation 8 is the recipe's accumulation: on policy as it is; 4 moves the accumulation too.
        (3, dict(per_device=2, grad_accum=8, steps_per_generation=5, num_generations=8), {}, [
            HEAD.format(3),
            "  - generation batch 2×3 processes×5 steps_per_generation = 30 is not divisible by num_generations=8",
            "Nearest valid alternatives:",
            "  1. set steps_per_generation=4 with gradient_accumulation_steps=4 (one generation per optimizer step)",
            "  2. set steps_per_generation=8 (one generation per optimizer step)",
            "  3. set per_device_train_batch_size=8", "  4. set num_generations=6 or 10"],
         [(0, 0.223), (0, 0.47), (1, 1.386), (2, 0.723)]),
        # 20 is not a multiple of 4×2 = 8: the next multiple of lcm(8, 3) is 24; no group size helps while 8 does
        # not divide 20.
        (2, dict(per_device=4, generation_batch_size=20, num_generations=3), {}, [
            HEAD.format(2), "  - generation_batch_size=20 is not divisible by the global batch 4×2 = 8",
            "Nearest valid alternatives:", "  1. set generation_batch_size=24"], [(0, 0.182)]),
        # Per-device unset: 10 fits one process (10 per device) but not groups of 3: 9 or 12 (multiples of lcm(1,
        # 3)), or groups of 2 (of 10's divisors 2, 5 and 10, the nearest 3).
        (1, dict(generation_batch_size=10, num_generations=3), {}, [
            "no valid batch layout for 1 training process:",
            "  - generation_batch_size=10 is not divisible by num_generations=3",
            "Nearest valid alternatives:", "  1. set generation_batch_size=9", "  2. set generation_batch_size=12",
            "  3. set num_generations=2"], [(0, 0.105), (0, 0.182), (2, 0.905)]),
        # num_generations unset (TRL's 8) and 20 not a multiple of it: a group size of 10 is offered too.
        (1, dict(generation_batch_size=20), {}, [
            "no valid batch layout for 1 training process:",
            "  - generation_batch_size=20 is not divisible by num_generations=8",
            "Nearest valid alternatives:", "  1. set generation_batch_size=24", "  2. set generation_batch_size=16",
            "  3. set num_generations=10"], [(0, 0.182), (0, 0.223), (2, 0.723)]),
        (0, dict(), {}, ["no GPU is left for training", "Use more GPUs, or launch.vllm=colocate."], []),
        (2, dict(generation_batch_size=16, steps_per_generation=2), {}, [
            "generation_batch_size and steps_per_generation are both set; TRL accepts only one of them",
            "Remove one: generation_batch_size = per_device_train_batch_size × processes × steps_per_generation."], []),
    ],
)  # fmt: skip
def test_a_layout_refusal_names_every_problem_and_ranks_the_fixes(n, req, kw, text, fixes):
    """``fixes``: each fix's (rank, cost), in the order shown: the rank says what it changes (0 the batch rhythm, 1
    the per-device batch, 2 the algorithm, 3 the hardware or policy lag), so the refusal module can merge the fixes of
    several problems in one order."""
    err = _refusal(n, req, **kw)
    assert err.render().splitlines() == text
    assert [(f.rank, round(f.cost, 3)) for f in err.fixes] == fixes
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
        # A share below TRL's default per-device 8: 32 completions over 8 processes are 4 each, 4 over 4 are 1 each.
        (8, dict(num_generations=8), dict(completions=32),
         dict(per_device_train_batch_size=4, gradient_accumulation_steps=1, generation_batch_size=32),
         ["per_device_train_batch_size=4: 32 completions over 8 processes"]),
        (4, dict(num_generations=2), dict(completions=4),
         dict(per_device_train_batch_size=1, gradient_accumulation_steps=1, generation_batch_size=4),
         ["per_device_train_batch_size=1: 4 completions over 4 processes"]),
        # Eval on 4 processes, groups of 8: any even per-device eval batch works, so TRL's 8 stays (no reason).
        (4, dict(eval_on=True), {}, dict(per_device_eval_batch_size=8), []),
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


def test_a_per_device_share_below_trls_default_plans():
    """4 prompts × 8 generations per step on 8 colocated GPUs: 4 completions each. The per-device search once stopped
    short of a share below TRL's default 8 and refused "per_device_train_batch_size=None" (which also hid colocate
    from the split search, so launch.vllm unset picked a 4-GPU server instead)."""
    plan = plan_recipe({"model_name_or_path": QWEN15, "num_generations": 8,
                        "launch": {"prompts_per_step": 4, "vllm": "colocate"}}, "8xH100-80GB")  # fmt: skip
    assert plan.vllm.mode == "colocate" and plan.train.num_processes == 8
    assert (plan.layout.per_device_train_batch_size, plan.layout.gradient_accumulation_steps) == (4, 1)
    searched = plan_recipe({"model_name_or_path": QWEN15, "num_generations": 8, "launch": {"prompts_per_step": 4}},
                           "8xH100-80GB")  # fmt: skip
    colocated = [c for c in searched.candidates if c.mode == "colocate" and c.trainers == 8]
    assert colocated and not [c for c in colocated if c.rejected]


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
              tensor_parallel_size=1, data_parallel_size=1, pipeline_parallel_size=1, gpu_memory_utilization=0.9,
              port=8000, max_model_len=1024, max_prompt_length=512),
         []),
        # A tensor-parallel size alone asks for a server (of that size).
        ({"launch": {"vllm_tensor_parallel_size": 2}}, "4xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 2, "2 server GPU(s) as TP 2"),
          ("server_gpus", "localhost:2,3", "server on 2 GPU(s) (TP 2)")],
         dict(mode="server", gpus=("2", "3")), []),
        # Two hosts: the server host's own address, bound on every interface; launch's utilization taken as is.
        ({"launch": {"vllm_gpu_memory_utilization": 0.6, "vllm_gpus": 1}}, "2x2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "1 server GPU(s) as TP 1"),
          ("server_gpus", "node1:1", "server on 1 GPU(s) (TP 1), 1 GPU(s) idle elsewhere")],
         dict(host="node1", address="node1", bind_host="0.0.0.0", gpus=("1",), gpu_memory_utilization=0.6), []),
        # A mixture of experts served as TP 1 × DP 4 over two hosts: experts spread (expert parallelism). (4 server
        # GPUs pinned: the default batch, 16 prompts, is one that 12 trainers cannot take evenly.)
        ({"launch": {"vllm": "server", "vllm_gpus": 4}}, "2x8xH100-80GB", "Qwen/Qwen3-30B-A3B",
         [("vllm_tensor_parallel_size", 1, "4 server GPU(s) as TP 1 × DP 4 with expert parallelism"),
          ("vllm_data_parallel_size", 4, "Qwen3-30B-A3B is a mixture of experts: the 128 experts spread over all 4 "
           "GPUs (16.4 GiB of weights per GPU), a KV cache per rank"),
          ("server_gpus", "node0:6,7 node1:6,7", "server spread over 2 hosts (2 GPU(s) each, TP 1 × DP 4)"),
          ("vllm_nodes", 2, "vLLM's multi-node data parallel: the API server and 2 rank(s) on node0, 1 more host(s) "
           "run their ranks headless; TRL's weight sync reaches every rank through the API server")],
         dict(expert_parallel=True, data_parallel_size=4, gpus=("6", "7")), []),
        # Llama-3.1-405B on H200s: 2 pipeline stages over 2 whole hosts.
        ({"launch": {"vllm": "server"}}, "4x8xH200-141GB", LLAMA405,
         [("vllm_tensor_parallel_size", 8, "16 server GPU(s) as TP 8 × PP 2"),
          ("vllm_pipeline_parallel_size", 2, "no server of tensor parallelism alone holds Llama-3.1-405B (756 GiB of "
           "bf16 weights) in half of each GPU: 2 pipeline stages of TP 8, 47.2 GiB per GPU, each replica over 2 hosts"),
          ("server_gpus", f"node2:{ALL8} node3:{ALL8}", "2 whole host(s) serve (16 GPUs, TP 8 × PP 2)"),
          ("vllm_nodes", 2, "vLLM's multi-node serving (--nnodes): the API server and the first stage on node2, 1 "
           "more host(s) run their stages headless; TRL's weight sync reaches every rank through the API server")],
         dict(pipeline_parallel_size=2, expert_parallel=False), []),
        # A pinned 2-stage pipeline within one host: no "each replica over … hosts".
        ({"launch": {"vllm_gpus": 4, "vllm_pipeline_parallel_size": 2}}, "8xH100-80GB", "Qwen/Qwen2.5-7B-Instruct",
         [("vllm_tensor_parallel_size", 2, "4 server GPU(s) as TP 2 × PP 2"),
          ("vllm_pipeline_parallel_size", 2, "set in the recipe (launch.vllm_pipeline_parallel_size): 2 pipeline "
           "stages of TP 2, 3.5 GiB per GPU"),
          ("server_gpus", "localhost:4,5,6,7", "server on 4 GPU(s) (TP 2 × PP 2)")],
         dict(pipeline_parallel_size=2, data_parallel_size=1, nodes=()), []),
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
        # Colocated on both GPUs as two TP-1 engines (TP 2 is predicted alike: within the model's uncertainty the
        # fewer GPUs per engine), the recipe's utilization and sleep mode kept.
        ({"vllm_enable_sleep_mode": True, "vllm_gpu_memory_utilization": 0.5, "launch": {"vllm": "colocate"}},
         "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "colocate: 2 engine(s) of TP 1"),
          ("vllm_gpu_memory_utilization", 0.5, "vLLM shares each training GPU (colocate)"),
          ("vllm_enable_sleep_mode", True, "set in the recipe: vLLM frees its memory while the trainers train (a "
           "wake-up each step)")],
         dict(mode="colocate", tensor_parallel_size=1, gpu_memory_utilization=0.5, sleep_mode=True), []),
        # TRL's vllm_mode: colocate alone asks for colocate.
        ({"vllm_mode": "colocate"}, "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "colocate: 2 engine(s) of TP 1"),
          ("vllm_gpu_memory_utilization", 0.3, "vLLM shares each training GPU (colocate)"),
          ("vllm_enable_sleep_mode", False, "TRL's default: vLLM keeps its share while the trainers train, and the "
           "training budget leaves it")],
         dict(mode="colocate", sleep_mode=False), []),
        # A mixture of experts on a 2-GPU server: TP 1 × DP 2 spreads the experts (29.9 GiB per GPU); pinned to TP 2
        # (one replica) there is nothing to spread.
        ({"launch": {"vllm_gpus": 2}}, "4xH100-80GB", "Qwen/Qwen3-30B-A3B",
         [("vllm_tensor_parallel_size", 1, "2 server GPU(s) as TP 1 × DP 2 with expert parallelism"),
          ("vllm_data_parallel_size", 2, "Qwen3-30B-A3B is a mixture of experts: the 128 experts spread over all 2 "
           "GPUs (29.9 GiB of weights per GPU), a KV cache per rank"),
          ("server_gpus", "localhost:2,3", "server on 2 GPU(s) (TP 1 × DP 2)")],
         dict(expert_parallel=True, data_parallel_size=2), []),
        ({"launch": {"vllm_gpus": 2, "vllm_tensor_parallel_size": 2}}, "4xH100-80GB", "Qwen/Qwen3-30B-A3B",
         [("vllm_tensor_parallel_size", 2, "2 server GPU(s) as TP 2"),
          ("server_gpus", "localhost:2,3", "server on 2 GPU(s) (TP 2)")],
         dict(expert_parallel=False, data_parallel_size=1), []),
        # The API server module cannot start other hosts' engines: a server on one host, said in a notice.
        ({"launch": {"vllm_gpus": 4, "vllm_command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}},
         "2x8xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "4 server GPU(s) as TP 1 × DP 4"),
          ("vllm_data_parallel_size", 4, "4 replicas of the model, each with its own KV cache and decode batch"),
          ("server_gpus", "node1:4,5,6,7", "server on 4 GPU(s) (TP 1 × DP 4), 4 GPU(s) idle elsewhere")],
         dict(nodes=()),
         ["launch.vllm_command does not end in `serve`: a vLLM server over several hosts (which needs `vllm serve "
          "--headless` on the others) is not considered"]),
        # … on one host there is nothing to leave out, and nothing to say.
        ({"launch": {"vllm_gpus": 2, "vllm_command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}},
         "8xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "2 server GPU(s) as TP 1 × DP 2"),
          ("vllm_data_parallel_size", 2, "2 replicas of the model, each with its own KV cache and decode batch"),
          ("server_gpus", "localhost:6,7", "server on 2 GPU(s) (TP 1 × DP 2)")],
         dict(nodes=()), []),
        # Any command ending in `serve` runs a server over whole hosts.
        ({"launch": {"vllm_gpus": 16, "vllm_command": ["python3", "-m", "vllm.entrypoints.cli.main", "serve"]}},
         "3x8xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "16 server GPU(s) as TP 1 × DP 16"),
          ("vllm_data_parallel_size", 16, "16 replicas of the model, each with its own KV cache and decode batch"),
          ("server_gpus", f"node1:{ALL8} node2:{ALL8}", "2 whole host(s) serve (16 GPUs, TP 1 × DP 16)"),
          ("vllm_nodes", 2, NODE_DP.replace("2 rank(s)", "8 rank(s)"))],
         dict(host="node1"), []),
        # The recipe's own port and vLLM length.
        ({"launch": {"vllm_gpus": 1, "vllm_port": 8123, "vllm_max_model_len": 4096}}, "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "1 server GPU(s) as TP 1"),
          ("server_gpus", "localhost:1", "server on 1 GPU(s) (TP 1)")],
         dict(port=8123, max_model_len=4096, max_prompt_length=3584), []),
        # Its TP size pinned to 4: pipelines of TP 4 (8 stages over 4 hosts), not of the largest TP.
        ({"launch": {"vllm": "server", "vllm_tensor_parallel_size": 4}}, "8x8xH100-80GB", LLAMA405,
         [("vllm_tensor_parallel_size", 4, "32 server GPU(s) as TP 4 × PP 8"),
          ("vllm_pipeline_parallel_size", 8, "no server of tensor parallelism alone holds Llama-3.1-405B (756 GiB of "
           "bf16 weights) in half of each GPU: 8 pipeline stages of TP 4, 24.7 GiB per GPU, each replica over 4 hosts"),
          ("server_gpus", " ".join(f"node{i}:{ALL8}" for i in range(4, 8)), "4 whole host(s) serve (32 GPUs, TP 4 × "
           "PP 8)"),
          ("vllm_nodes", 4, NODE_PP)],
         dict(tensor_parallel_size=4, pipeline_parallel_size=8), []),
        # A pipeline size of 1 is no pipeline: colocate accepts it.
        ({"launch": {"vllm": "colocate", "vllm_pipeline_parallel_size": 1}}, "2xH100-80GB", QWEN15,
         [("vllm_tensor_parallel_size", 1, "colocate: 2 engine(s) of TP 1"),
          ("vllm_gpu_memory_utilization", 0.3, "vLLM shares each training GPU (colocate)"),
          ("vllm_enable_sleep_mode", False, "TRL's default: vLLM keeps its share while the trainers train, and the "
           "training budget leaves it")],
         dict(mode="colocate", max_model_len=1024, max_prompt_length=512), []),
        # use_vllm: false on GPUs: no vLLM at all.
        ({"use_vllm": False}, "2xH100-80GB", QWEN15, [], dict(mode="off"), []),
    ],
)  # fmt: skip
def test_placement_decides_the_server_and_says_why(values, gpus, model, decisions, vllm, notices):
    plan = plan_recipe({"model_name_or_path": model, **values}, gpus, model=find_model_shape(model))
    assert [(d.what, d.value, d.why) for d in plan.decisions if d.what in SERVER_KEYS] == decisions
    assert {k: getattr(plan.vllm, k) for k in vllm} == vllm
    assert [n for n in plan.notices if n.startswith(("vllm_", "launch.vllm"))] == notices
    assert not [w for w in plan.warnings if w.startswith("colocated vLLM")]  # every colocated engine here fits


@pytest.mark.parametrize("mode", ["server", "colocate"])
def test_without_a_model_shape_vllm_still_gets_its_lengths(mode):
    """No model shape (nothing to size vLLM's memory by): the lengths come from the recipe alone."""
    launch = {"vllm_gpus": 1} if mode == "server" else {"vllm": "colocate"}
    plan = plan_recipe({"model_name_or_path": QWEN15, "launch": launch}, "2xH100-80GB", model=None)
    assert (plan.vllm.mode, plan.vllm.max_model_len, plan.vllm.max_prompt_length) == (mode, 1024, 512)


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
        ({"launch": {"vllm_tensor_parallel_size": 5}}, "8xH100-80GB", QWEN15, [
            "the vLLM tensor-parallel size is not possible:",
            "  - vLLM cannot shard Qwen2.5-1.5B over 5 GPUs: 5 does not divide its 12 attention heads, 2 KV heads (TP "
            "must divide them or be a multiple of them), vocabulary 151936 (padded to 151936)",
            "Valid sizes here: 1, 2, 4 (or leave it unset to choose)."]),
        # No model shape: any size up to the host's GPUs.
        ({"launch": {"vllm_tensor_parallel_size": 16}}, "8xH100-80GB", None, [
            "the vLLM tensor-parallel size is not possible:",
            "  - tensor-parallel size 16 exceeds the 8 GPUs of one host (TP stays in a node)",
            "Valid sizes here: 1, 2, 3, 4, 5, 6, 7, 8 (or leave it unset to choose)."]),
        ({"launch": {"vllm": "server"}}, "1xH100-80GB", QWEN15, [
            "launch.vllm=server on a single GPU: the server would take it, leaving none to train",
            "Use launch.vllm=colocate (vLLM shares the GPU with the trainer), or more GPUs."]),
        # 16 GPUs are 2 whole hosts, but the API server module cannot start the second host's engines.
        ({"launch": {"vllm_gpus": 16, "vllm_command": ["python", "-m", "vllm.entrypoints.openai.api_server"]}},
         "3x8xH100-80GB", "Qwen/Qwen2.5-7B-Instruct", [
            "no vLLM server of 16 GPU(s) (launch.vllm_gpus) leaves whole hosts or equal trainers on 3 host(s) of 8 "
            "GPUs with a launch.vllm_command that does not end in `serve`",
            "On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per host, fewer "
            "than all of them), the same number of GPUs on every host (a multiple of the hosts), or fewer GPUs than a "
            "host has on one of them; a server over several hosts needs `vllm serve` (it starts the others headless): "
            "end launch.vllm_command in `serve`, or keep the server on one host."]),
        ({"launch": {"vllm_gpus": 9}}, "2x8xH100-80GB", QWEN15, [
            "no vLLM server of 9 GPU(s) (launch.vllm_gpus) leaves whole hosts or equal trainers on 2 host(s) of 8 GPUs",
            "On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per host, fewer "
            "than all of them), the same number of GPUs on every host (a multiple of the hosts), or fewer GPUs than a "
            "host has on one of them."]),
        # A mixture of experts that no server reaches: its reach is experts over data parallelism, not pipelines.
        ({"launch": {"vllm": "server"}}, "2x2xL20-48GB", "Qwen/Qwen3-30B-A3B", [
            "Qwen3-30B-A3B (57 GiB of bf16 weights) does not fit a vLLM server on up to 2 GPUs of 44 GiB (tensor "
            "parallel within a node of 2, experts spread over a data-parallel server)",
            "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
            "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a "
            "smaller model."]),
        # Two hosts of two GPUs (as many hosts as GPUs each, but not one GPU): the general refusal.
        ({"launch": {"vllm": "server", "vllm_gpus": 3}}, "2x2xH100-80GB", QWEN15, [
            "no vLLM server of 3 GPU(s) (launch.vllm_gpus) leaves whole hosts or equal trainers on 2 host(s) of 2 GPUs",
            "On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per host, fewer "
            "than all of them), the same number of GPUs on every host (a multiple of the hosts), or fewer GPUs than a "
            "host has on one of them."]),
        # A tensor-parallel size that takes every GPU: no server size was given, so none is named.
        ({"launch": {"vllm_tensor_parallel_size": 4}}, "4xH100-80GB", QWEN15, [
            "no vLLM server leaves whole hosts or equal trainers on 1 host(s) of 4 GPUs",
            "On several hosts the server takes whole hosts (launch.vllm_gpus a multiple of the GPUs per host, fewer "
            "than all of them), the same number of GPUs on every host (a multiple of the hosts), or fewer GPUs than a "
            "host has on one of them."]),
        # A mixture of experts fits neither way: its reach is experts over data parallelism.
        ({}, "2xL4-24GB", "Qwen/Qwen3-30B-A3B", [
            "Qwen3-30B-A3B (57 GiB of bf16 weights) does not fit vLLM on up to 1 GPUs of 22 GiB (tensor parallel "
            "within a node of 2, experts spread over a data-parallel server): not as a server (the weights take over "
            "half of each GPU) nor colocated (they take over 90% of each GPU)",
            "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
            "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a "
            "smaller model."]),
        ({"launch": {"vllm": "server", "vllm_pipeline_parallel_size": 16}}, "8xH100-80GB", QWEN15, [
            "no vLLM server of 16 pipeline stages fits 1 host(s) of 8 GPUs",
            "Each replica is TP × PP GPUs, within a host or over whole hosts, and leaves GPUs to train: change "
            "launch.vllm_pipeline_parallel_size (or launch.vllm_gpus), or leave it unset to choose."]),
        # One GPU: no server was tried, so the reach is the host's one GPU.
        ({}, "1xH100-80GB", LLAMA405, [
            "Llama-3.1-405B (756 GiB of bf16 weights) does not fit vLLM on up to 1 GPUs of 80 GiB (tensor parallel "
            "within a node of 1, pipeline stages over nodes): not as a server (the weights take over half of each "
            "GPU) nor colocated (they take over 90% of each GPU)",
            "Use GPUs with more memory, more GPUs per node, or more nodes (a dense model's server spans whole nodes as "
            "pipeline stages; a mixture of experts spreads its experts over a data-parallel server's GPUs), or a "
            "smaller model."]),
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
    assert [str(f) for f in err.fixes] == [
        "set launch.vllm_gpus=1 (a smaller server leaves GPUs to train)",
        "set launch.vllm=colocate with launch.vllm_gpus=null (vLLM shares the training GPUs)",
        "more GPUs: at least 3",
    ]
    assert [(f.setting, f.rank, f.in_recipe) for f in err.fixes] == [
        ("launch.vllm_gpus", 0, True), ("launch.vllm", 1, True), ("gpus", 3, False)]  # fmt: skip


def _topology(counts: list[int], memory: int | None = 80 * 2**30) -> Topology:
    """Hosts n0, n1, … with ``counts`` H100s each, of ``memory`` bytes (None: not known, as a probe may report)."""
    hosts = (Host(f"n{i}", tuple(Gpu(str(j), "H100", memory) for j in range(c))) for i, c in enumerate(counts))
    return Topology(hosts=tuple(hosts), source="spec")


@pytest.mark.parametrize(
    ("counts", "memory", "model", "fixes"),
    [
        # 3 GPUs: a server of 2 (TP 2 divides Qwen 1.5B's 12 heads); no model: of 2 on 2 GPUs, 1 on 2.
        ([3], 80 * 2**30, QWEN15, [("launch.vllm_gpus", 2, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
        ([2], 80 * 2**30, None, [("launch.vllm_gpus", 1, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
        # Qwen2.5-72B (135 GiB): TP 4 holds 34 GiB per GPU, within half of 80 GB.
        (
            [8],
            80 * 2**30,
            "Qwen/Qwen2.5-72B-Instruct",
            [("launch.vllm_gpus", 4, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)],
        ),
        # The largest TP size the model shards to below 8 (Qwen 1.5B's 12 heads: 4), colocate, or 9 GPUs.
        ([8], 80 * 2**30, QWEN15, [("launch.vllm_gpus", 4, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
        # No model: any smaller server (7 GPUs).
        ([8], 80 * 2**30, None, [("launch.vllm_gpus", 7, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
        # Llama-3.1-405B: no server of fewer than 8 GPUs holds its weights in half of each GPU, so none is offered…
        ([8], 80 * 2**30, LLAMA405, [("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
        # … unless the GPUs' memory is not known.
        ([8], None, LLAMA405, [("launch.vllm_gpus", 4, 0), ("launch.vllm", "colocate", 1), ("gpus", None, 3)]),
    ],
)
def test_a_server_on_every_gpu_of_one_host_is_refused_with_fixes_that_fit(counts, memory, model, fixes):
    """placement's own refusal, before the planner re-plans each fix (tests/test_fixes.py checks that step)."""
    g = counts[0]
    recipe = build_recipe({"model_name_or_path": model or QWEN15, "launch": {"vllm_gpus": g}}, [])
    with pytest.raises(NoGpuLeftForTraining) as info:
        allowed_splits(_topology(counts, memory), recipe, find_model_shape(model) if model else None, Trace())
    assert info.value.message == f"the vLLM server needs {g} GPU(s), leaving none of the {g} for training"
    assert [(f.setting, f.value, f.rank) for f in info.value.fixes] == fixes
    assert str(info.value.fixes[-1]) == f"more GPUs: at least {g + 1}"


def test_hosts_with_different_gpu_counts_get_only_splits_that_leave_equal_training_hosts():
    """2 + 4 GPUs: the 2-GPU host serves and the 4-GPU host trains, the other way round, or the 4-GPU host's 2
    extra GPUs serve beside 2 trainers on each host; every split uses all 6 GPUs. 4 + 2 + 1 allows none."""
    from grpo_launch.planning.splits.split import SplitKind

    recipe = build_recipe({"model_name_or_path": QWEN15}, [])
    splits = allowed_splits(_topology([2, 4]), recipe, find_model_shape(QWEN15), Trace())
    assert splits and all(s.idle == 0 and s.gpus == 6 for s in splits)
    assert {(s.kind, s.train_hosts, s.server_hosts, s.trainers) for s in splits} == {
        (SplitKind.NODES, (1,), (0,), 4),
        (SplitKind.NODES, (0,), (1,), 2),
        (SplitKind.SPREAD, (0, 1), (1,), 4),
    }
    with pytest.raises(PlanError) as info:
        allowed_splits(_topology([4, 2, 1]), recipe, find_model_shape(QWEN15), Trace())
    assert info.value.render().splitlines()[0] == (
        "no split of hosts with GPU counts n0=4, n1=2, n2=1 leaves training hosts with equal counts (accelerate runs "
        "the same number of processes on every machine)"
    )
    assert unfit_servers(_topology([2, 4]), find_model_shape(LLAMA405)) == []


def test_the_servers_left_out_for_their_weights_are_listed_with_their_numbers():
    """Qwen2.5-72B (135 GiB of bf16 weights) on 4 × 80 GB: every server of up to 3 GPUs holds over half of each GPU
    (--explain of a refusal lists them); with nothing to compare against (no model, no memory) none is listed."""
    model = find_model_shape("Qwen/Qwen2.5-72B-Instruct")
    assert unfit_servers(_topology([4]), model) == [
        f"split {label}: {gib} GiB of weights per GPU is over 50% of 80.0 GiB"
        for label, gib in [("server on 1 GPU(s) (TP 1)", 135.4), ("server on 2 GPU(s) (TP 1 × DP 2)", 135.4),
                           ("server on 2 GPU(s) (TP 2)", 67.7), ("server on 2 GPU(s) (TP 1 × PP 2)", 67.7),
                           ("server on 3 GPU(s) (TP 1 × DP 3)", 135.4), ("server on 3 GPU(s) (TP 1 × PP 3)", 46.5)]
    ]  # fmt: skip
    assert unfit_servers(_topology([4], None), model) == [] and unfit_servers(_topology([4]), None) == []
    assert unfit_servers(_topology([4]), find_model_shape(QWEN15)) == []  # 3 GiB fits every server


def test_weights_of_exactly_the_allowed_share_fit():
    """The weight shares are upper bounds, inclusive: Qwen2.5-1.5B's 3.08e9 bytes of bf16 weights on GPUs of exactly
    twice that fit a server of one GPU (half of each GPU), and are no unfit server; colocated at 50 % utilization,
    GPUs of four times that hold them at TP 1 (half of the share); a smaller server left for trainers too."""
    model = find_model_shape(QWEN15)
    w = int(model.weight_bytes_bf16)
    server = build_recipe({"model_name_or_path": QWEN15, "launch": {"vllm": "server", "vllm_gpus": 1}}, [])
    assert [s.server_gpus for s in allowed_splits(_topology([2], 2 * w), server, model, Trace())] == [1]
    assert unfit_servers(_topology([2], 2 * w), model) == []
    colocate = build_recipe({"model_name_or_path": QWEN15, "vllm_gpu_memory_utilization": 0.5,
                             "launch": {"vllm": "colocate"}}, [])  # fmt: skip
    trace = Trace()
    assert [s.tp for s in allowed_splits(_topology([1], 4 * w), colocate, model, trace)] == [1] and not trace.warnings
    full = build_recipe({"model_name_or_path": QWEN15, "launch": {"vllm_gpus": 2}}, [])
    with pytest.raises(NoGpuLeftForTraining) as info:
        allowed_splits(_topology([2], 2 * w), full, model, Trace())
    assert (info.value.fixes[0].setting, info.value.fixes[0].value) == ("launch.vllm_gpus", 1)


def test_a_pinned_tp_size_gets_every_pipeline_of_that_size():
    """Llama-3.1-405B on 8 × 8 H200 with TP 4 pinned: pipelines of TP 4 at every stage count that fits, including
    4 stages × 2 replicas on 32 GPUs, which unpinned would go to TP 8 (the largest TP takes each stage count)."""
    launch = {"vllm": "server", "vllm_tensor_parallel_size": 4}
    recipe = build_recipe({"model_name_or_path": LLAMA405, "launch": launch}, [])
    splits = allowed_splits(parse_gpu_spec("8x8xH200-141GB"), recipe, find_model_shape(LLAMA405), Trace())
    assert sorted({(s.tp, s.pp, s.dp) for s in splits if s.server_gpus == 32}) == [(4, 4, 2), (4, 8, 1)]


def test_colocated_engines_on_gpus_of_unknown_memory_are_all_allowed():
    recipe = build_recipe({"model_name_or_path": LLAMA405, "launch": {"vllm": "colocate"}}, [])
    splits = allowed_splits(_topology([8], None), recipe, find_model_shape(LLAMA405), Trace())
    assert splits and all(s.kind == "colocate" for s in splits) and len({s.tp for s in splits}) > 1


@pytest.mark.parametrize(
    ("model", "warning"),
    [
        ("Qwen/Qwen2.5-7B-Instruct", None),  # 7.1 GiB per GPU at TP 2: within half the 23.9 GiB share
        ("Qwen/Qwen2.5-14B-Instruct", "colocated vLLM: 13.7 GiB of weights per GPU at TP 2 is over half of the 30% "
         "vLLM share (23.9 GiB): expect a small KV cache"),
    ],
)  # fmt: skip
def test_two_colocated_gpus_warn_only_when_the_weights_crowd_the_share(model, warning):
    plan = plan_recipe({"model_name_or_path": model, "vllm_gpu_memory_utilization": 0.3,
                        "launch": {"vllm": "colocate"}}, "2xH100-80GB")  # fmt: skip
    assert plan.vllm.tensor_parallel_size == 2
    assert [w for w in plan.warnings if w.startswith("colocated vLLM")] == ([warning] if warning else [])


def test_colocated_weights_over_half_the_vllm_share_are_warned_about():
    """Qwen2.5-7B (14.2 GiB) on one 80 GB GPU with 30 % for vLLM: the weights fit the GPU but take over half of the
    23.9 GiB share, which leaves a small KV cache: planned, with a warning that says so."""
    plan = plan_recipe({"model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "vllm_gpu_memory_utilization": 0.3,
                        "launch": {"vllm": "colocate"}}, "1xH100-80GB")  # fmt: skip
    assert plan.vllm.mode == "colocate" and plan.vllm.tensor_parallel_size == 1
    assert [w for w in plan.warnings if w.startswith("colocated vLLM")] == [
        "colocated vLLM: 14.2 GiB of weights per GPU at TP 1 is over half of the 30% vLLM share (23.9 GiB): expect a "
        "small KV cache"
    ]


@pytest.mark.parametrize(
    ("recipe", "gpus"), [("qwen3-30b-a3b.yaml", "3xH100-80GB"), ("llama70b.yaml", "4x8xL40S-48GB")]
)
def test_a_losing_colocated_candidates_warning_stays_with_it(recipe, gpus):
    """Issue 41: server plans carried "colocated vLLM: … expect a small KV cache", the warning of the colocated
    split they beat; it is said only by a plan that colocates."""
    from pathlib import Path

    from grpo_launch.planning import make_plan
    from grpo_launch.recipe import load_recipe

    r = load_recipe(Path(__file__).resolve().parents[1] / "recipes" / recipe)
    plan = make_plan(parse_gpu_spec(gpus), r, find_model_shape(r.values["model_name_or_path"]))
    assert plan.vllm.mode == "server", plan.vllm.mode
    assert not [w for w in plan.warnings if w.startswith("colocated vLLM")], plan.warnings
