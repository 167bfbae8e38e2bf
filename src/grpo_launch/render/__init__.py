"""Render: a Plan turned into what runs it (pure, no I/O). :mod:`.processes` gives the processes to start (the vLLM
server and one ``accelerate launch`` per training host), :mod:`.configs` the configuration files and
:mod:`.plan_json` the plan's record; :func:`render_files` gathers the run directory's files."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import yaml

from grpo_launch.render import plan_json
from grpo_launch.render.configs import render_accelerate_config, render_deepspeed_config, render_trainer_recipe

if TYPE_CHECKING:
    from grpo_launch.planning.plan_types import Plan


def render_files(plan: Plan) -> dict[str, str]:
    """Relative path (under ``plan.run_dir``) → text for every file of a run directory."""
    paths = plan.paths
    files = {
        paths.accelerate_config: yaml.safe_dump(render_accelerate_config(plan), sort_keys=True),
        paths.trainer_recipe: render_trainer_recipe(plan),
        paths.plan_json: json.dumps(plan_json.plan_to_dict(plan), indent=2, default=str) + "\n",
    }
    ds = render_deepspeed_config(plan)
    if ds is not None:
        files[paths.deepspeed_config] = json.dumps(ds, indent=2) + "\n"
    return {paths.relative(path): text for path, text in files.items()}
