"""A batch that cannot work is refused naming its key, and every fix shown plans: a per-device batch no GPU's
memory holds, and a batch larger than the training set (TRL's own sampler the oracle of how many steps it trains).
The real planner, the rows as ``grpo-launch plan`` finds them (counted in the tiny local file, the table's count
for NuminaMath-TIR), offline."""

from __future__ import annotations

import pytest

from grpo_launch.cli import main
from grpo_launch.errors import PlanError
from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.models.builtin import find_model_shape
from grpo_launch.planning import make_plan
from grpo_launch.planning.plan_types import Runtime
from grpo_launch.probe.dataset import dataset_rows
from grpo_launch.recipe import load_recipe

from .helpers import ROOT, TINY_RECIPE, ensure_tiny_assets

QWEN = str(ROOT / "recipes" / "qwen1.5b.yaml")
OFFLINE = {"HF_HUB_OFFLINE": "1"}
ITERATED = (
    "per_device_train_batch_size=8",
    "gradient_accumulation_steps=8",
    "num_iterations=4",
    "steps_per_generation=2",
)


def _plan(recipe: str, gpus: str, *overrides: str):
    """As ``grpo-launch plan RECIPE --gpus GPUS`` plans it: with the training set's rows it finds offline."""
    loaded = load_recipe(recipe, list(overrides))
    rows, source = dataset_rows(loaded.values, str(ROOT), OFFLINE)
    runtime = Runtime(dataset_rows=rows, dataset_rows_source=source)
    topology = parse_gpu_spec(gpus, cpu_processes=loaded.launch.num_processes)
    model = None if topology.is_cpu else find_model_shape(str(loaded.get("model_name_or_path")))
    return make_plan(topology, loaded, model, runtime=runtime)


def _refused(recipe: str, gpus: str, *overrides: str) -> PlanError:
    with pytest.raises(PlanError) as err:
        _plan(recipe, gpus, *overrides)
    return err.value


def _every_fix_plans(err: PlanError, recipe: str, gpus: str, *overrides: str) -> None:
    fixes = [f for f in err.fixes if f.in_recipe]
    assert fixes, err.render()
    for fix in fixes:
        assert "; then: " not in fix.reason, err.render()
        _plan(recipe, gpus, *overrides, *fix.overrides())  # raises if the fix shown does not plan


def test_a_per_device_batch_no_gpu_holds_is_refused_naming_the_key_and_every_fix_plans():
    """``per_device_train_batch_size=100000`` on 8 × H100: the refusal named only the memory, and its fixes
    (another prompts per step) were refused again when applied. The key is named in every split's problem, and
    the per-device batch that fits is offered (the same batch over more accumulation dropped: it is more prompts
    than the 72,441 rows)."""
    err = _refused(QWEN, "8xH100-80GB", "per_device_train_batch_size=100000")
    assert all("per_device_train_batch_size=100000" in p for p in err.problems), err.render()
    assert any(f.setting == "per_device_train_batch_size" for f in err.fixes)
    _every_fix_plans(err, QWEN, "8xH100-80GB", "per_device_train_batch_size=100000")


def test_a_free_batchs_alternatives_plan_when_applied(tmp_path):
    """A recipe that leaves its batch free gets the default batch (per-device × GPUs): at 100000 per device its
    refusal offered launch.prompts_per_step=37500 and others, each refused again when applied."""
    import yaml

    free = tmp_path / "free.yaml"
    values = {"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "num_generations": 8,
              "dataset_name": "AI-MO/NuminaMath-TIR", "max_completion_length": 1024}  # fmt: skip
    free.write_text(yaml.safe_dump(values))
    err = _refused(str(free), "8xH100-80GB", "per_device_train_batch_size=100000")
    assert all("per_device_train_batch_size=100000" in p for p in err.problems if "fit" in p), err.render()
    _every_fix_plans(err, str(free), "8xH100-80GB", "per_device_train_batch_size=100000")


def test_on_one_gpu_the_memory_refusal_names_the_per_device_batch():
    err = _refused(QWEN, "1xH100-80GB", "per_device_train_batch_size=100000")
    assert "per_device_train_batch_size=100000" in err.message
    _every_fix_plans(err, QWEN, "1xH100-80GB", "per_device_train_batch_size=100000")


def test_a_batch_larger_than_the_training_set_is_refused_with_the_rows_and_the_nearest_batch(monkeypatch, capsys):
    """The tiny recipe at 100000 completions per device: 50,000 prompts per step against 256 rows planned with no
    word, and TRL trained 0 steps. The plan's command counts the rows with max_steps set too."""
    ensure_tiny_assets()
    monkeypatch.chdir(ROOT)
    argv = ["plan", TINY_RECIPE, "max_steps=1", "per_device_train_batch_size=100000", "--no-write"]
    assert main(argv, environ=OFFLINE) == 2
    said = capsys.readouterr().err
    assert "50000 prompts" in said and "256 rows" in said and "per_device_train_batch_size" in said
    err = _refused(TINY_RECIPE, "cpu", "max_steps=1", "per_device_train_batch_size=100000")
    assert [(f.setting, f.value) for f in err.fixes] == [("per_device_train_batch_size", 512)]  # 256 prompts × 4 / 2
    _every_fix_plans(err, TINY_RECIPE, "cpu", "max_steps=1", "per_device_train_batch_size=100000")


def test_a_pinned_batch_larger_than_the_training_set_is_refused():
    """``launch.prompts_per_step=80000`` against NuminaMath-TIR's 72,441 rows promised "1 steps"."""
    err = _refused(QWEN, "8xH100-80GB", "launch.prompts_per_step=80000")
    assert all("72441 rows" in p for p in err.problems if "needs" in p), err.render()
    assert ("launch.prompts_per_step", 72441) in [(f.setting, f.value) for f in err.fixes]
    _every_fix_plans(err, QWEN, "8xH100-80GB", "launch.prompts_per_step=80000")
    assert _plan(QWEN, "8xH100-80GB", "launch.prompts_per_step=72441").layout.num_processes == 8


@pytest.mark.parametrize(
    ("rows", "overrides"),
    [
        (256, ("per_device_train_batch_size=512",)),  # exactly the rows: one step
        (255, ("per_device_train_batch_size=512",)),  # one row short: 0 steps
        (300, ("per_device_train_batch_size=8", "gradient_accumulation_steps=40", "steps_per_generation=10")),
        (150, ("per_device_train_batch_size=8", "gradient_accumulation_steps=40", "steps_per_generation=10")),
        (100, ITERATED),  # one round serves spg × num_iterations micro-steps: 8 prompts a step
        (7, ITERATED),
        (64, ("per_device_train_batch_size=4", "steps_per_generation=32", "gradient_accumulation_steps=4")),
        (63, ("per_device_train_batch_size=4", "steps_per_generation=32", "gradient_accumulation_steps=4")),
    ],
)
def test_the_refusal_agrees_with_trls_sampler(rows, overrides):
    """TRL's ``RepeatSampler`` (the sampler ``GRPOTrainer`` trains on) and transformers' accumulation are the
    oracle: the plan is refused exactly when the sampler's indices hold no whole optimizer step (one dataloader
    step takes a generation batch of indices over all processes; an optimizer step, gradient_accumulation_steps of
    them)."""
    from trl.trainer.utils import RepeatSampler

    recipe = load_recipe(TINY_RECIPE, [*overrides, f"launch.dataset_rows={rows}"])
    try:
        plan = make_plan(parse_gpu_spec("cpu", cpu_processes=2), recipe, None)
    except PlanError as exc:
        assert "rows" in exc.message, exc.render()
        refused = True
        plan = make_plan(parse_gpu_spec("cpu", cpu_processes=2), load_recipe(TINY_RECIPE, list(overrides)), None)
    else:
        refused = False
    lay = plan.layout
    iterations = int(recipe.values.get("num_iterations") or 1)
    sampler = RepeatSampler(list(range(rows)), mini_repeat_count=lay.num_generations,
                            batch_size=lay.generation_batch_size // lay.num_generations,
                            repeat_count=iterations * lay.steps_per_generation, shuffle=False)  # fmt: skip
    optimizer_steps = len(sampler) // (lay.generation_batch_size * lay.gradient_accumulation_steps)
    assert refused == (optimizer_steps == 0), (rows, overrides, len(sampler))
