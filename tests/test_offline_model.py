"""Issue 50 §1: a model that cannot load offline was not refused before the start. With HF_HUB_OFFLINE=1 and a model
the Hugging Face cache does not hold, the run printed the "not in the built-in table" warning, started, and every
rank failed in from_pretrained (179 lines of tracebacks).

Now a run that would load it is refused before anything starts, naming the model, the cache the trainers read
(huggingface_hub's own, in the trainers' Python and environment) and the fix; a plan and a dry run load nothing and
are not refused. The Hub, where asked, is a closed loopback port: nothing but loopback is reached.
"""

from __future__ import annotations

import dataclasses
import json
import socket
import sys
from pathlib import Path

import pytest

from grpo_launch.cli import main
from grpo_launch.errors import ConfigError
from grpo_launch.execute import preflight

from .helpers import ROOT, TINY_RECIPE, plan_recipe

NAME = "someorg/not-cached-model"


def _env(home: Path, **more: str) -> dict[str, str]:
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "HOME": str(home), "PATH": "/usr/bin:/bin", **more}


def _plan(*overrides: str):
    """The tiny CPU recipe with a Hub model, planned as a run on this machine, as the local backend reads it."""
    plan = plan_recipe(TINY_RECIPE, "cpu", f"model_name_or_path={NAME}", *overrides, model=None, python=sys.executable)
    here = dataclasses.replace(plan.topology, source="cpu", named_by_user=False, trainers_share_this_cache=True)
    return dataclasses.replace(plan, topology=here)


def _cache(hub: Path, files: dict[str, str], repo: str = NAME) -> Path:
    """A Hugging Face cache holding ``files`` of ``repo`` at main, in huggingface_hub's layout."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    commit = "0123456789abcdef0123456789abcdef01234567"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (snapshot / name).write_text(text)
    return snapshot


COMPLETE = {"config.json": "{}", "model.safetensors": "x", "tokenizer.json": "{}", "tokenizer_config.json": "{}"}


def test_a_run_of_a_model_not_in_the_cache_is_refused_offline_before_anything_starts(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    run = tmp_path / "run"
    argv = ["run", TINY_RECIPE, f"model_name_or_path={NAME}", "max_steps=1", "--run-dir", str(run)]
    assert main(argv, environ=_env(tmp_path / "hf")) == 2
    err = capsys.readouterr().err
    assert "the trainers cannot load the model" in err
    assert f"{NAME} (model and tokenizer): not in the Hugging Face cache {tmp_path}/hf/hub" in err
    assert "the trainers run offline (HF_HUB_OFFLINE is set)" in err
    assert f"hf download {NAME}" in err and "or unset HF_HUB_OFFLINE" in err
    assert "Traceback" not in err and not run.exists(), "refused before anything starts or is written"


def test_a_plan_and_a_dry_run_load_nothing_and_are_not_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    env = _env(tmp_path / "hf")
    assert main(["plan", "recipes/qwen1.5b.yaml", "--gpus", "8xH100-80GB", "--no-write"], environ=env) == 0
    argv = ["run", TINY_RECIPE, f"model_name_or_path={NAME}", "--run-dir", str(tmp_path / "r"), "--dry-run"]
    assert main(argv, environ=env) == 0
    assert "cannot load" not in capsys.readouterr().err


def test_a_model_whose_every_file_is_cached_loads_offline(tmp_path):
    _cache(tmp_path / "hf" / "hub", COMPLETE)
    preflight.check_models_load(_plan(), _env(tmp_path / "hf"))


def test_a_local_directory_is_not_asked_of_the_cache(tmp_path):
    plan = _plan(f"model_name_or_path={ROOT / '.cache' / 'tiny' / 'model'}")
    preflight.check_models_load(plan, _env(tmp_path / "hf"))


def test_what_is_missing_is_named_a_shard_or_the_tokenizer(tmp_path):
    hub = tmp_path / "hf" / "hub"
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    _cache(hub, {"config.json": "{}", "model.safetensors.index.json": json.dumps(index),
                 "model-00001-of-00002.safetensors": "x"})  # fmt: skip
    with pytest.raises(ConfigError) as exc:
        preflight.check_models_load(_plan(), _env(tmp_path / "hf"))
    said = "\n".join(exc.value.problems)
    assert "(model and tokenizer): 1 of 2 weight shards (model-00002-of-00002.safetensors), the tokenizer files" in said


def test_the_cache_is_the_trainers_own_launch_train_env_included(tmp_path):
    """HF_HOME set for the trainers (launch.train_env) is where they look, not the launcher's HF_HOME."""
    theirs = tmp_path / "theirs"
    _cache(theirs / "hub", COMPLETE)
    preflight.check_models_load(_plan(f"launch.train_env={{HF_HOME: {theirs}}}"), _env(tmp_path / "launcher"))
    with pytest.raises(ConfigError, match=f"not in the Hugging Face cache {tmp_path}/launcher/hub"):
        preflight.check_models_load(_plan(), _env(tmp_path / "launcher"))
    hub_cache = tmp_path / "hub-cache"  # HF_HUB_CACHE over HF_HOME, as huggingface_hub resolves it
    _cache(hub_cache, COMPLETE)
    preflight.check_models_load(_plan(), _env(tmp_path / "launcher", HF_HUB_CACHE=str(hub_cache)))


def test_transformers_offline_is_offline_too(tmp_path):
    env = _env(tmp_path / "hf")
    del env["HF_HUB_OFFLINE"]
    with pytest.raises(ConfigError, match="TRANSFORMERS_OFFLINE is set"):
        preflight.check_models_load(_plan(), {**env, "TRANSFORMERS_OFFLINE": "1"})


def test_online_a_hub_that_cannot_be_reached_is_refused(tmp_path):
    with socket.socket() as s:  # a loopback port nothing listens on: the connection is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _env(tmp_path / "hf", HF_ENDPOINT=f"http://127.0.0.1:{port}")
    del env["HF_HUB_OFFLINE"]
    with pytest.raises(ConfigError) as exc:
        preflight.check_models_load(_plan(), env)
    assert f"the Hub (http://127.0.0.1:{port}) cannot be reached" in exc.value.problems[0]
    assert "hf download" in (exc.value.hint or "")
    _cache(tmp_path / "hf" / "hub", COMPLETE)  # cached: nothing to ask the Hub
    preflight.check_models_load(_plan(), env)
