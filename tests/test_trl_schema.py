"""The committed key table must match the installed TRL (regenerate with scripts/gen_trl_schema.py)."""

from __future__ import annotations

import importlib.util

from grpo_launch.recipe import trl_schema

from .helpers import ROOT


def test_schema_matches_installed_trl():
    import trl

    spec = importlib.util.spec_from_file_location("gen", ROOT / "scripts" / "gen_trl_schema.py")
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    assert trl.__version__.startswith("1.16"), "grpo-launch pins TRL 1.16.x"
    assert gen.build() == (ROOT / "src" / "grpo_launch" / "recipe" / "trl_schema.py").read_text()
    assert trl.__version__ == trl_schema.TRL_VERSION
