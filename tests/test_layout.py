"""Table-driven layout tests, each checked against TRL's own GRPOConfig."""

from __future__ import annotations

import pytest

from grpo_launch.errors import PlanError
from grpo_launch.planning.batch_layout import LayoutRequest, solve_layout
from grpo_launch.planning.step_work import off_policy_lag

from .helpers import plan_recipe
from .trl_oracle import grpo_config


@pytest.mark.parametrize(
    ("n", "req", "expect"),
    [
        # Seed case 1: 4 × L20, one for vLLM → 3 trainers, num_generations 8, per-device 1: accumulate 8.
        (3, dict(per_device=1, num_generations=8), dict(gradient_accumulation_steps=8, generation_batch_size=24)),
        # Seed case 2: single GPU: per-device batch a multiple of num_generations, or accumulation.
        (1, dict(per_device=4, num_generations=8), dict(gradient_accumulation_steps=2, generation_batch_size=8)),
        (4, dict(per_device=2, num_generations=8), dict(gradient_accumulation_steps=1, generation_batch_size=8)),
        # The recipe's own generation rhythm: steps_per_generation set, accumulation kept (its off-policy choice,
        # which the plan states as a notice: test_a_recipes_own_off_policy_rhythm_is_a_notice).
        (
            3,
            dict(per_device=1, grad_accum=2, steps_per_generation=8, num_generations=8),
            dict(gradient_accumulation_steps=2, steps_per_generation=8),
        ),
        # A split search's target: 48 completions per step over 3 processes, per-device 1 kept: accumulate 16.
        (
            3,
            dict(per_device=1, num_generations=8, completions=48),
            dict(gradient_accumulation_steps=16, steps_per_generation=16, generation_batch_size=48),
        ),
        # … and with no per-device batch set: the divisor of the 16 per process nearest TRL's 8.
        (
            3,
            dict(num_generations=8, completions=48),
            dict(per_device_train_batch_size=8, gradient_accumulation_steps=2, steps_per_generation=2),
        ),
        # Nothing set: TRL's defaults (8 per device, 8 generations) already work.
        (7, dict(), dict(per_device_train_batch_size=8, gradient_accumulation_steps=1)),
        # per-device unset with num_generations 6 on 4 GPUs: the nearest to TRL's 8 that fills whole groups is 9.
        (4, dict(num_generations=6), dict(per_device_train_batch_size=9, gradient_accumulation_steps=1)),
        # … below TRL's 8 when that is nearer: 7 × 3 processes = 21 = 3 groups of 7.
        (3, dict(num_generations=7), dict(per_device_train_batch_size=7, gradient_accumulation_steps=1)),
        # The recipe's steps_per_generation with no per-device batch: the nearest to 8 filling whole groups.
        (
            3,
            dict(steps_per_generation=2, num_generations=12),
            dict(per_device_train_batch_size=8, steps_per_generation=2, generation_batch_size=48),
        ),
        (
            5,
            dict(steps_per_generation=3, num_generations=9),
            dict(per_device_train_batch_size=9, steps_per_generation=3),
        ),
        # generation_batch_size given: per-device derived from it.
        (
            4,
            dict(generation_batch_size=64, num_generations=8),
            dict(per_device_train_batch_size=8, steps_per_generation=2),
        ),
        # Evaluation on: eval batch chosen so that eval batch × N divides by the generations.
        (3, dict(per_device=1, num_generations=8, eval_on=True), dict(per_device_eval_batch_size=8)),
        (6, dict(per_device=2, num_generations=4, eval_on=True, per_device_eval=2), dict(per_device_eval_batch_size=2)),
    ],
)
def test_layouts_are_accepted_by_trl(n, req, expect):
    req = dict(req)
    completions = req.pop("completions", None)
    layout, _why = solve_layout(n, LayoutRequest(**req), completions=completions)
    for key, value in expect.items():
        assert getattr(layout, key) == value, key
    for key, value in layout.trl_values().items():  # whole numbers, as TRL's int fields (a 2.0 would be written)
        assert type(value) is int, (key, value)
    cfg = grpo_config(
        {
            **layout.trl_values(),
            "do_eval": req.get("eval_on", False),
            "eval_strategy": "steps" if req.get("eval_on") else "no",
        },
        n,
    )
    assert cfg.generation_batch_size == layout.generation_batch_size
    assert cfg.steps_per_generation == layout.steps_per_generation


def test_accumulation_that_does_not_fill_groups_is_refused_not_made_off_policy():
    """Seed case 1 with the accumulation fixed at 2: 3 × 1 × 2 = 6 completions do not hold whole groups of 8. The
    planner once made one generation serve 4 optimizer steps (3 of them off policy) without saying so; now it
    refuses, on-policy fixes first, and names the off-policy one with its lag."""
    with pytest.raises(PlanError) as e:
        solve_layout(3, LayoutRequest(per_device=1, grad_accum=2, num_generations=8))
    text = e.value.render()
    assert "would train off policy" in text
    fixes = [str(f) for f in e.value.fixes]
    assert fixes[0].startswith("set gradient_accumulation_steps=8")
    off = next(f for f in fixes if f.startswith("set steps_per_generation="))
    assert "steps_per_generation=8" in off and "serves 4 optimizer steps" in off and "3 step(s) old" in off
    grpo_config(dict(per_device_train_batch_size=1, gradient_accumulation_steps=8, num_generations=8), 3)


@pytest.mark.parametrize(
    ("accum", "spg", "iterations", "lag"),
    [(2, 8, 1, 3), (8, 2, 1, 0), (8, 8, 1, 0), (4, 8, 1, 1), (6, 4, 1, 1), (2, 3, 1, 1), (4, 2, 2, 0), (2, 2, 2, 1)],
)
def test_off_policy_lag_counts_the_optimizer_steps_inside_a_generation(accum, spg, iterations, lag):
    """TRL 1.16 generates every steps_per_generation × num_iterations micro-batches and steps the optimizer every
    gradient_accumulation_steps: the lag is the number of optimizer steps a generation's micro-batches straddle,
    zero exactly where TRL itself sees no off-policy data (its accumulation % generate_every test)."""
    layout, _ = solve_layout(1, LayoutRequest(per_device=8, grad_accum=accum, steps_per_generation=spg,
                                              num_generations=8))  # fmt: skip
    assert off_policy_lag(layout, iterations) == lag
    assert (lag > 0) == (accum % (spg * iterations) != 0)


def test_off_policy_lag_closed_form_matches_the_count_of_trls_loop():
    """The closed form against TRL's loop counted out: every generation m of every (accumulation, generate-every)
    pair up to 24, the optimizer steps after each micro-batch j ≡ g - 1 (mod g) before the generation's last."""
    from types import SimpleNamespace

    for g in range(1, 25):
        for w in range(1, 25):
            counted = max(sum(j % g == g - 1 for j in range(m * w, m * w + w - 1)) for m in range(g))
            layout = SimpleNamespace(gradient_accumulation_steps=g, steps_per_generation=w)
            assert off_policy_lag(layout, 1) == counted, (g, w)  # type: ignore[arg-type]


def test_a_recipes_own_off_policy_rhythm_is_a_notice():
    """Seed case 1 with steps_per_generation=8 and accumulation 2, as the recipe asks: one generation serves 4
    optimizer steps. The planner keeps the recipe's choice and says so in a notice, with the lag and the fix; an
    on-policy recipe gets no such notice."""
    values = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "per_device_train_batch_size": 1,
              "num_generations": 8, "launch": {"vllm": "server", "vllm_gpus": 1}}  # fmt: skip
    plan = plan_recipe({**values, "gradient_accumulation_steps": 2, "steps_per_generation": 8}, "4xL20-48GB")
    assert (plan.layout.gradient_accumulation_steps, plan.layout.steps_per_generation) == (2, 8)
    (notice,) = [n for n in plan.notices if n.startswith("off policy")]
    assert "up to 3 step(s) old" in notice and "set steps_per_generation=2" in notice, notice
    on_policy = plan_recipe({**values, "gradient_accumulation_steps": 8}, "4xL20-48GB")
    assert not [n for n in on_policy.notices if n.startswith("off policy")]


def test_each_choice_is_said_with_its_arithmetic():
    """The reasons solve_layout returns go into the plan's decisions: each chosen value with the sum behind it, and
    nothing for a value the recipe set or TRL's default kept."""
    _, why = solve_layout(3, LayoutRequest(per_device=1, num_generations=8), completions=48)
    assert why == ["gradient_accumulation_steps=16: 1 per device × 3 processes × 16 = 48 completions = 6 prompts × 8"]
    _, why = solve_layout(3, LayoutRequest(per_device=1, grad_accum=2, num_generations=8), completions=48)
    assert why == ["gradient_accumulation_steps=16 (the recipe says 2): 1 per device × 3 processes × 16 = 48 "
                   "completions, the 6 prompts per step every split is planned for"]  # fmt: skip
    _, why = solve_layout(3, LayoutRequest(num_generations=8), completions=48)
    assert why == ["gradient_accumulation_steps=2: 8 per device × 3 processes × 2 = 48 completions = 6 prompts × 8"]
    _, why = solve_layout(3, LayoutRequest(num_generations=8), completions=24)
    assert why == []  # TRL's defaults (8 per device, no accumulation) meet it: nothing to say
    _, why = solve_layout(3, LayoutRequest(num_generations=8), completions=72)
    assert why == ["gradient_accumulation_steps=3: 8 per device × 3 processes × 3 = 72 completions = 9 prompts × 8"]
    _, why = solve_layout(2, LayoutRequest(per_device=3, num_generations=8), completions=48)
    assert why == ["gradient_accumulation_steps=8: 3 per device × 2 processes × 8 = 48 completions = 6 prompts × 8"]
    _, why = solve_layout(3, LayoutRequest(per_device=1, num_generations=8))
    assert why == ["gradient_accumulation_steps=8: 1×3 processes is not a multiple of num_generations=8; accumulating "
                   "8 steps gives 24 completions = 3 prompts × 8"]  # fmt: skip
    _, why = solve_layout(3, LayoutRequest(num_generations=7))
    assert why == ["per_device_train_batch_size=7: 7×3 processes×1 is a multiple of 7"]
    _, why = solve_layout(4, LayoutRequest(per_device=2, num_generations=8, grad_accum=1))
    assert why == []


def test_the_recipes_layout_values_are_read_as_trl_reads_them():
    req = LayoutRequest.from_values({"per_device_train_batch_size": "auto", "gradient_accumulation_steps": 4,
                                     "generation_batch_size": 64, "num_generations": 8, "do_eval": True,
                                     "eval_strategy": "steps", "per_device_eval_batch_size": 2,
                                     "num_generations_eval": 4})  # fmt: skip
    assert req == LayoutRequest(per_device=None, grad_accum=4, generation_batch_size=64, num_generations=8,
                                eval_on=True, per_device_eval=2, num_generations_eval=4)  # fmt: skip
    assert LayoutRequest.from_values({"do_eval": True}).eval_on is False  # TRL's eval_strategy default is "no"
    assert LayoutRequest.from_values({"eval_strategy": "steps"}).eval_on is False
    assert LayoutRequest.from_values({"steps_per_generation": 2}).steps_per_generation == 2
    layout, _ = solve_layout(3, LayoutRequest(per_device=1, num_generations=8, eval_on=True))
    assert layout.trl_values()["per_device_eval_batch_size"] == layout.per_device_eval_batch_size == 8
    plain, _ = solve_layout(3, LayoutRequest(per_device=1, num_generations=8))
    assert "per_device_eval_batch_size" not in plain.trl_values()


GA, PD, NG, SPG = (
    "gradient_accumulation_steps",
    "per_device_train_batch_size",
    "num_generations",
    "steps_per_generation",
)


@pytest.mark.parametrize(
    ("n", "req", "colocate_n", "fixes"),
    [
        (3, dict(per_device=1, grad_accum=12), 4,
         [(GA, 16, 0), (GA, 8, 0), (PD, 2, 1), (NG, 6, 2), ("launch.vllm", "colocate", 3), (SPG, 24, 3)]),
        (5, dict(per_device=2, grad_accum=3), 8,
         [(GA, 4, 0), (PD, 8, 1), (NG, 6, 2), ("launch.vllm", "colocate", 3), (SPG, 12, 3)]),
        (3, dict(per_device=1, grad_accum=2), 3, [(GA, 8, 0), (PD, 4, 1), (NG, 3, 2), (SPG, 8, 3)]),
    ],
)  # fmt: skip
def test_the_on_policy_fixes_are_the_nearest_whole_groups(n, req, colocate_n, fixes):
    """Each fix of a batch that does not fill whole groups of 8 (ranked on policy first, then by how far it moves
    the recipe): the accumulations either side of the recipe's that fill them, the nearest per-device batch, the
    divisors of the batch nearest 8 as the group size, colocated vLLM where its process count fills them, and last
    the off-policy rhythm with its lag. Each is checked by TRL too (test_fixes.py plans every fix shown)."""
    with pytest.raises(PlanError) as e:
        solve_layout(n, LayoutRequest(num_generations=8, **req), colocate_n=colocate_n)
    got = [(*f.assignments()[0], f.rank) for f in e.value.fixes]
    assert got == fixes
    for fix in e.value.fixes:
        key, value = fix.assignments()[0]
        if key == "gradient_accumulation_steps":
            assert (req["per_device"] * n * value) % 8 == 0
        if key == "steps_per_generation":
            assert str(value // req["grad_accum"] - 1) + " step(s) old" in str(fix)


def test_a_target_that_does_not_split_is_refused():
    with pytest.raises(PlanError, match=r"64 completions .* do not split over 7 processes"):
        solve_layout(7, LayoutRequest(num_generations=8), completions=64)


def test_explicit_values_are_kept():
    layout, _ = solve_layout(5, LayoutRequest(per_device=3, grad_accum=4, num_generations=4))
    assert (layout.per_device_train_batch_size, layout.gradient_accumulation_steps, layout.num_generations) == (3, 4, 4)
    assert layout.generation_batch_size % 4 == 0


def test_impossible_layout_lists_problem_and_ranked_alternatives():
    # Seed case 1 with everything pinned: 3 trainers × 2 per device × 1 step = 6 completions, 8 generations.
    req = LayoutRequest(per_device=2, steps_per_generation=1, num_generations=8)
    with pytest.raises(PlanError) as e:
        solve_layout(3, req, colocate_n=4)
    text = e.value.render()
    assert "= 6 is not divisible by num_generations=8" in text
    assert "1. set steps_per_generation=4" in text  # keep num_generations: the nearest fix first
    assert "2. set per_device_train_batch_size=8" in text
    assert "3. set num_generations=3 or 6" in text
    assert "launch.vllm=colocate" in text  # 4 processes × 2 = 8
    # TRL agrees the original is invalid, and that the first alternative is valid.
    with pytest.raises(ValueError):
        grpo_config(dict(per_device_train_batch_size=2, steps_per_generation=1, num_generations=8), 3)
    grpo_config(dict(per_device_train_batch_size=2, steps_per_generation=4, num_generations=8), 3)


def test_every_problem_is_listed():
    with pytest.raises(PlanError) as e:
        solve_layout(
            3,
            LayoutRequest(per_device=1, steps_per_generation=1, num_generations=8, eval_on=True, per_device_eval=1),
        )
    assert len(e.value.problems) == 2


def test_both_generation_knobs_is_an_error():
    with pytest.raises(PlanError, match="only one of them"):
        solve_layout(2, LayoutRequest(generation_batch_size=16, steps_per_generation=2))


def test_generation_batch_not_divisible():
    with pytest.raises(PlanError) as e:
        solve_layout(3, LayoutRequest(per_device=2, generation_batch_size=20, num_generations=4))
    assert "generation_batch_size=12" in e.value.render() or "generation_batch_size=24" in e.value.render()
