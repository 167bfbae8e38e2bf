"""The training entry's shared core (grpo_launch.train.core) and the job's environment read once
(grpo_launch.train.environment.JobEnvironment): the recipe's chat_template reaches the tokenizer in the sync entry
as in the async one (open-r1's DeepSeek-R1-Distill recipe sets one), the resume decision, the end of a run, and what
a rank reads from torchrun's, Slurm's and grpo-launch's variables."""

from __future__ import annotations

import ast
import json
from pathlib import Path
from types import SimpleNamespace
from unittest import mock

import pytest
import yaml

from grpo_launch.rundir.layout import COMPLETE_MARKER, NO_RESUME, RESUME_ENV, RUN_DIR_ENV, RunPaths
from grpo_launch.train.environment import JobEnvironment

from .helpers import ROOT

GOLDEN = json.loads((ROOT / "tests" / "golden" / "open_r1_grpo_recipes.json").read_text())["recipes"]
DISTILL = GOLDEN["DeepSeek-R1-Distill-Qwen-1.5B/grpo/config_demo.yaml"]
TEMPLATE = DISTILL["chat_template"]  # open-r1's own template for its DeepSeek-R1-Distill-Qwen-1.5B recipe
QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


def _formatted(tokenizer, messages=QUESTION) -> str:
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


# ---------------------------------------------------------------------------------------------- the chat template


def test_the_core_tokenizer_takes_the_recipes_chat_template(tiny_assets):
    from grpo_launch.train.core import build_tokenizer

    model = str(tiny_assets / "model")
    own = build_tokenizer(model, None, {}, trust_remote_code=False)
    tok = build_tokenizer(model, None, {"chat_template": TEMPLATE}, trust_remote_code=False)
    assert own.chat_template != TEMPLATE  # the tiny model's own template is another one: the recipe's replaces it
    assert tok.chat_template == TEMPLATE and tok.padding_side == "left"
    text = _formatted(tok)
    assert text.endswith("<｜User｜>What is 2 + 3?<｜Assistant｜>") and text != _formatted(own)


class _Built(Exception):
    """Raised by the stand-in trainer class with what the entry built for it."""

    def __init__(self, kwargs: dict) -> None:
        self.kwargs = kwargs


def _raise_built(*args, **kwargs):
    raise _Built(kwargs)


def test_the_sync_entry_trains_with_the_distill_recipes_chat_template(tiny_assets, tmp_path):
    """open-r1's DeepSeek-R1-Distill-Qwen-1.5B recipe sets chat_template; the sync entry (GRPOTrainer) must train
    with it, as the async entry always did (before the shared core it trained with the tokenizer's own template).
    The real entry runs on the tiny model and data; only GRPOTrainer is a stand-in that keeps what it was given."""
    from grpo_launch.train.__main__ import main

    values = {
        "model_name_or_path": str(tiny_assets / "model"),
        "dataset_name": str(tiny_assets / "data" / "train.jsonl"),
        "dataset_prompt_column": "prompt",
        "chat_template": TEMPLATE,
        "system_prompt": DISTILL.get("system_prompt"),
        "max_prompt_length": 512,
        "reward_funcs": ["format"],
        "output_dir": str(tmp_path / "out"),
        "use_cpu": True,
        "bf16": False,
        "report_to": "none",
        "num_generations": 4,
        "per_device_train_batch_size": 4,
    }
    recipe = tmp_path / "trainer_recipe.yaml"
    recipe.write_text(yaml.safe_dump({k: v for k, v in values.items() if v is not None}))
    with mock.patch("trl.GRPOTrainer", _raise_built), pytest.raises(_Built) as built:
        main(["--recipe", str(recipe)], job=JobEnvironment.from_environ({}, hostname="here"))
    tokenizer, train = built.value.kwargs["processing_class"], built.value.kwargs["train_dataset"]
    assert tokenizer.chat_template == TEMPLATE
    text = _formatted(tokenizer, train[0]["prompt"])
    assert "<｜User｜>" in text and text.endswith("<｜Assistant｜>")


# ---------------------------------------------------------------------------------------------- the environment


def test_a_torchrun_rank_in_a_grpo_launch_run(tmp_path):
    env = {"RANK": "5", "LOCAL_RANK": "1", "GROUP_RANK": "2", "WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "2,3",
           RUN_DIR_ENV: str(tmp_path), RESUME_ENV: str(tmp_path / "output" / "checkpoint-4")}  # fmt: skip
    job = JobEnvironment.from_environ(env, hostname="node-a")
    assert (job.rank, job.local_rank, job.node_rank, job.node) == (5, 1, 2, "node-a")
    assert job.visible_devices == ("2", "3") and job.device_token(1) == "3"
    assert job.resume == str(tmp_path / "output" / "checkpoint-4") and job.paths == RunPaths(tmp_path)
    assert not job.is_rank_zero


def test_a_slurm_rank_is_named_by_its_slurm_node_and_its_device_uuids():
    env = {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "1", "SLURMD_NODENAME": "gpu-07",
           "CUDA_VISIBLE_DEVICES": "GPU-5f1c, MIG-77aa", RESUME_ENV: NO_RESUME}  # fmt: skip
    job = JobEnvironment.from_environ(env, hostname="container-123")
    assert job.node == "gpu-07" and job.node_rank == 1 and job.is_rank_zero
    assert job.visible_devices == ("GPU-5f1c", "MIG-77aa") and job.device_token(0) == "GPU-5f1c"
    assert job.resume == NO_RESUME and job.paths is None


def test_a_bare_process_is_rank_0_of_one_on_this_host():
    import os

    job = JobEnvironment.from_environ({})
    assert (job.rank, job.local_rank, job.node_rank) == (0, 0, 0) and job.node == os.uname().nodename
    assert job.visible_devices == () and job.device_token(2) == "2"  # every device visible: NVML's own index
    assert job.resume is None and job.paths is None
    assert JobEnvironment.from_environ({"RANK": "", "CUDA_VISIBLE_DEVICES": ""}) == job
    with pytest.raises(ValueError, match="LOCAL_RANK='x'"):
        JobEnvironment.from_environ({"LOCAL_RANK": "x"})


def test_only_the_job_environment_reads_the_job_variables():
    """No module of the training entry but environment.py names the variables a rank reads (writing defaults for
    the libraries, e.g. TQDM_DISABLE, is not reading)."""
    names = {"RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE", "SLURMD_NODENAME", "CUDA_VISIBLE_DEVICES",
             "RUN_DIR_ENV", "RESUME_ENV", RUN_DIR_ENV, RESUME_ENV}  # fmt: skip
    train = ROOT / "src" / "grpo_launch" / "train"
    found = []
    for path in sorted(train.glob("*.py")):
        if path.name == "environment.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and node.value in names) or (
                isinstance(node, (ast.Name, ast.alias)) and getattr(node, "id", getattr(node, "name", None)) in names
            ):
                found.append(f"{path.name}:{getattr(node, 'lineno', '?')}")
    assert not found


# ---------------------------------------------------------------------------------------------- resume and the end


def test_the_resume_decision_is_grpo_launchs_else_the_newest_checkpoint(tmp_path):
    from grpo_launch.train.core import resume_checkpoint

    out = tmp_path / "out"
    (out / "checkpoint-2").mkdir(parents=True)
    (out / "checkpoint-10").mkdir()
    assert resume_checkpoint(JobEnvironment.from_environ({}), str(out)) == str(out / "checkpoint-10")
    assert resume_checkpoint(JobEnvironment.from_environ({}), str(tmp_path / "none-yet")) is None
    assert resume_checkpoint(JobEnvironment.from_environ({RESUME_ENV: NO_RESUME}), str(out)) is None
    chosen = str(out / "checkpoint-2")  # the launcher's choice stands, though a newer one is there
    assert resume_checkpoint(JobEnvironment.from_environ({RESUME_ENV: chosen}), str(out)) == chosen


class _Trainer:
    """What train_and_finish uses of a trainer: its args and state, train() and save_model()."""

    def __init__(self, output_dir: Path, process_index: int = 0) -> None:
        self.args = SimpleNamespace(output_dir=str(output_dir), process_index=process_index)
        self.state = SimpleNamespace(global_step=0, max_steps=3)
        self.calls: list[tuple] = []

    def train(self, resume_from_checkpoint=None):
        self.calls.append(("train", resume_from_checkpoint))
        self.state.global_step = 3

    def save_model(self, output_dir):
        self.calls.append(("save", output_dir))


def test_a_finished_run_is_saved_and_marked_complete(tmp_path, capsys):
    from grpo_launch.train.core import train_and_finish

    out = tmp_path / "out"
    out.mkdir()
    trainer = _Trainer(out)
    train_and_finish(trainer, None, JobEnvironment.from_environ({RESUME_ENV: NO_RESUME}))
    assert trainer.calls == [("train", None), ("save", str(out))]
    assert json.loads((out / COMPLETE_MARKER).read_text())["step"] == 3
    assert "starting fresh" in capsys.readouterr().out
    other = _Trainer(tmp_path / "other", process_index=1)  # every rank saves; rank 0 alone marks the run
    (tmp_path / "other").mkdir()
    train_and_finish(other, None, JobEnvironment.from_environ({RESUME_ENV: NO_RESUME}))
    assert other.calls[-1] == ("save", str(tmp_path / "other")) and not (tmp_path / "other" / COMPLETE_MARKER).exists()


def test_a_run_stopped_on_request_answers_and_is_not_marked_complete(tmp_path):
    from grpo_launch.rundir.control import stopped_at
    from grpo_launch.train.core import train_and_finish

    out = tmp_path / "out"
    out.mkdir()
    trainer = _Trainer(out)
    job = JobEnvironment.from_environ({RUN_DIR_ENV: str(tmp_path), RESUME_ENV: str(out / "checkpoint-1")})
    (tmp_path / "control").mkdir()
    train_and_finish(trainer, SimpleNamespace(stopped_at=2), job)
    assert trainer.calls == [("train", str(out / "checkpoint-1"))]
    assert stopped_at(tmp_path) == 2 and not (out / COMPLETE_MARKER).exists()
