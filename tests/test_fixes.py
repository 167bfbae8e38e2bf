"""Fixes that really fix: every in-recipe fix a refusal prints, applied as the `key=value` overrides it prints,
plans (the refusal re-plans each before showing it); when none plans on its own, the ones shown get past this
problem and say what comes next ("; then: …")."""

from __future__ import annotations

import pytest

from grpo_launch.errors import PlanError

from .helpers import ROOT, plan_recipe

CASES = [
    ("recipes/qwen7b-math.yaml", "2xRTX4090", ()),
    ("recipes/qwen7b-math.yaml", "1xA10G", ()),
    ("recipes/qwen7b-math.yaml", "4xL20-48GB", ("launch.offload=none", "launch.vllm=colocate")),
    ("recipes/llama70b.yaml", "8xA100-40GB", ()),
    ("recipes/qwen3-30b-a3b.yaml", "4xH100-80GB", ("launch.vllm=colocate", "launch.offload=none")),
    ("recipes/qwen1.5b.yaml", "4xH100-80GB", ("launch.vllm_gpus=4",)),
    ("recipes/qwen1.5b.yaml", "4xL20-48GB", ("per_device_eval_batch_size=3", "do_eval=true", "eval_strategy=steps")),
]


def _plan(recipe_path: str, gpus: str, overrides):
    return plan_recipe(ROOT / recipe_path, gpus, *overrides)


@pytest.mark.parametrize(("recipe", "gpus", "overrides"), CASES, ids=lambda v: str(v))
def test_every_fix_shown_plans(recipe, gpus, overrides):
    try:
        _plan(recipe, gpus, overrides)
    except PlanError as exc:
        fixes = [f for f in exc.fixes if f.in_recipe]
        assert exc.fixes, exc.render()
        for fix in fixes:
            if "; then: " not in fix.reason:
                _plan(recipe, gpus, (*overrides, *fix.overrides()))  # raises if the fix does not plan
                continue
            with pytest.raises(PlanError) as after:
                _plan(recipe, gpus, (*overrides, *fix.overrides()))
            assert after.value.message != exc.message or after.value.problems != exc.problems
            assert after.value.message.rstrip(":")[:60] in fix.reason
    else:
        pytest.fail(f"{recipe} on {gpus} {overrides} now plans as it is: it shows no fix any more; replace the case "
                    "with one the planner refuses")  # fmt: skip


def test_a_fix_that_does_not_plan_is_not_shown():
    """7B on 2 × RTX 4090 with vLLM colocated: raising vLLM's share would starve training; only what plans stays."""
    with pytest.raises(PlanError) as e:
        _plan("recipes/qwen7b-math.yaml", "2xRTX4090", ())
    settings = {f.setting for f in e.value.fixes}
    assert "launch.vllm_gpu_memory_utilization" not in settings and "launch.vllm" in settings


def _numbers(line: str) -> list[float]:
    import re

    return [float(x) for x in re.findall(r"-?\d+(?:\.\d+)?", line)]


def test_explain_shows_the_vllm_arithmetic_of_a_refusal_and_it_adds_up():
    """vLLM refused on 2 × RTX 4090: the arithmetic is share × GPU − weights − overhead = room for the KV cache,
    and the fix dropped because it leaves training too little is listed with what it then fails with."""
    with pytest.raises(PlanError) as e:
        _plan("recipes/qwen7b-math.yaml", "2xRTX4090", ())
    memory, kv, least, *rest = e.value.explain
    share, gib, total, weights, _tp, overhead, room = _numbers(memory)
    assert abs(share * gib - total) < 0.06 and abs(total - weights - overhead - room) < 0.06 and room < 0
    assert _numbers(kv)[1] > 0 and "0.00 sequences fit" in kv
    need = _numbers(least)[0]
    assert need > share and any(f"launch.vllm_gpu_memory_utilization={need:.2f}: " in r for r in rest)
    assert "(grpo-launch plan --explain shows the arithmetic)" in e.value.render()
    assert "The arithmetic" in e.value.render(explain=True) and memory in e.value.render(explain=True)


def test_explain_shows_the_training_settings_tried_nearest_first():
    with pytest.raises(PlanError) as e:
        _plan("recipes/qwen7b-math.yaml", "1xRTX4090", ("launch.vllm=off", "launch.offload=none"))
    budget_line, *rest = e.value.explain
    budget = _numbers(budget_line)[-1]
    margin = [line for line in rest if line.startswith("margin: ")]
    tried = [line for line in rest if line not in margin]
    assert "95%" in margin[0] and "trl #3456" in margin[0] and any("fragmentation" in m for m in margin)
    totals = [float(line.split(" = ")[-1].split(" GiB")[0]) for line in tried]
    assert tried and totals == sorted(totals) and all(t > budget for t in totals)
    for line, t in zip(tried, totals, strict=True):
        over = _numbers(line.split("over by ")[1])[0]
        assert abs(over - (t - budget)) < 0.11, line


def test_explain_names_every_split_the_search_refused():
    with pytest.raises(PlanError) as e:
        _plan("recipes/llama70b.yaml", "4xA100-80GB", ())
    assert "vLLM (colocate) does not fit" in e.value.message  # the one split whose weights fit a GPU
    splits = [line.split(":")[0] for line in e.value.explain if line.startswith("split ")]
    # Every server 4 A100s could host, each named with the weights that keep it out (pipelines of the largest TP
    # that fits included).
    assert splits == [
        "split server on 1 GPU(s) (TP 1)",
        "split server on 2 GPU(s) (TP 1 × DP 2)",
        "split server on 2 GPU(s) (TP 2)",
        "split server on 2 GPU(s) (TP 1 × PP 2)",
        "split server on 3 GPU(s) (TP 1 × DP 3)",
        "split server on 3 GPU(s) (TP 1 × PP 3)",
    ]


def test_plan_explain_prints_the_arithmetic_of_a_refusal(capsys):
    from grpo_launch.cli import main

    recipe = str(ROOT / "recipes" / "qwen7b-math.yaml")
    assert main(["plan", recipe, "--gpus", "2xRTX4090", "--explain", "--no-write"], environ={}) == 2
    err = capsys.readouterr().err
    assert "The arithmetic (nearest candidates first):" in err and "for the KV cache" in err
