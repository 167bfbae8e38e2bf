"""The key ledger (issue 41): every key of a recipe is given to TRL's configs, read by the training entry or by
open-r1's rewards, or named in one notice with the reason. Walked over every field of TRL's GRPOConfig (from the
installed TRL) and every key of open-r1's five GRPO recipes as published."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from grpo_launch.recipe import build_recipe, trl_schema
from grpo_launch.recipe.launch import LaunchSettings
from grpo_launch.recipe.ledger import ENTRY_KEYS, NOBODY, key_use, ledger

from .helpers import ROOT

OPEN_R1 = json.loads((ROOT / "tests" / "golden" / "open_r1_grpo_recipes.json").read_text())["recipes"]


def test_every_grpo_config_field_goes_to_grpo_config():
    trl = pytest.importorskip("trl")
    for f in dataclasses.fields(trl.GRPOConfig):
        if f.init:
            assert key_use(f.name, asynchronous=False, vllm_off=False, open_r1_rewards=False) == ("GRPOConfig", True)


def test_the_entry_reads_every_key_the_ledger_says_it_reads():
    """ENTRY_KEYS against the entry's source: each is looked up there by name (a key the entry stopped reading, or
    one it reads that the ledger does not know, fails here)."""
    source = "".join(p.read_text() for p in (ROOT / "src" / "grpo_launch" / "train").glob("*.py"))
    read = set(re.findall(r"""(?:script|settings|values)(?:\.get\(|\[)["']([a-z_]+)["']""", source))
    assert ENTRY_KEYS - {"dataset_streaming"} <= read | {"reward_model_name_or_path"}, ENTRY_KEYS - read
    trl = set(trl_schema.GRPO_CONFIG) | set(trl_schema.MODEL_CONFIG)  # TRL's, read back from the values
    assert not read - ENTRY_KEYS - trl, read - ENTRY_KEYS - trl


@pytest.mark.parametrize("name", sorted(OPEN_R1))
def test_every_key_of_open_r1s_recipes_is_accounted_for(name):
    raw = OPEN_R1[name]
    recipe = build_recipe(raw, [])
    uses = ledger(recipe.values, recipe.launch)
    unused = {k for k, (_, used) in uses.items() if not used}
    # open-r1's own scripts read these; removed keys were migrated with their own notice before the ledger.
    assert unused <= {"benchmarks", "callbacks", "hub_model_revision", "wandb_entity", "wandb_project",
                      "code_eval_scoring_mode", "code_eval_test_batch_size", "code_language"}, unused  # fmt: skip
    assert not [k for k, (where, _) in uses.items() if where == NOBODY], uses
    said = [n for n in recipe.notices if n.startswith("not used by this run")]
    assert bool(said) == bool(unused) and all(k in said[0] for k in unused), (said, unused)
    for key in set(raw) - set(recipe.values):  # dropped by a migration: its notice names it
        assert any(key in n for n in recipe.notices), (key, recipe.notices)


def test_async_and_open_r1_reward_keys_follow_the_run():
    launch = LaunchSettings()
    values = {"max_staleness": 2, "cosine_min_value_wrong": 0.0, "beta": 0.04, "reward_funcs": ["cosine"]}
    uses = ledger(values, launch)
    assert uses["max_staleness"][1] is False and uses["beta"] == ("GRPOConfig", True)
    assert uses["cosine_min_value_wrong"][1] is True  # cosine resolves through open-r1's registry
    asynchronous = ledger(values, dataclasses.replace(launch, mode="async"))
    assert asynchronous["max_staleness"] == ("AsyncGRPOConfig", True) and asynchronous["beta"][1] is False


@pytest.mark.parametrize("launch", [{}, {"vllm": "colocate"}])
def test_server_settings_a_colocated_engine_ignores_are_named(launch):
    """``launch.vllm_extra_args`` and ``launch.vllm_env`` vanished when vLLM was colocated (chosen by ``auto`` or
    pinned), while vLLM off names them: the plan says they are not used, and indeed nothing it starts carries them."""
    from grpo_launch.enums import VllmMode
    from grpo_launch.render.processes import all_processes

    from .helpers import plan_recipe

    plan = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", 'launch.vllm_extra_args=["--enforce-eager"]',
                       "launch.vllm_env={VLLM_LOGGING_LEVEL: DEBUG}",
                       *(f"launch.{k}={v}" for k, v in launch.items()))  # fmt: skip
    assert plan.vllm.mode == VllmMode.COLOCATE
    said = [n for n in plan.notices if n.startswith("not used by this run")]
    assert said and "launch.vllm_extra_args" in said[0] and "launch.vllm_env" in said[0], plan.notices
    started = all_processes(plan)
    assert not any("--enforce-eager" in p.argv for p in started)
    assert not any("VLLM_LOGGING_LEVEL" in p.env for p in started)
    server = plan_recipe(ROOT / "recipes" / "qwen1.5b.yaml", "8xH100-80GB", "launch.vllm=server",
                         'launch.vllm_extra_args=["--enforce-eager"]')  # fmt: skip
    assert not [n for n in server.notices if "launch.vllm_extra_args" in n]
