"""Root causes across processes, failure kinds, stuck frames; the progress watchdog; checkpoint completeness and the
resume decision; the run-dir lock. Pure or file-level: real files, no processes (those are in test_healing.py)."""

from __future__ import annotations

import json
import struct
import zipfile

import pytest

from grpo_launch.enums import FailureKind, Role
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.execute.faults import Event, diagnose, stuck_frames
from grpo_launch.execute.watchdog import Watchdog
from grpo_launch.rundir.checkpoints import checkpoint_problems, decide_resume
from grpo_launch.rundir.files import RunLock, lock_holder, write_run_files
from grpo_launch.rundir.layout import COMPLETE_MARKER
from grpo_launch.rundir.records import CompletionRecord

# What a 2-rank torchrun run prints when rank 1's reward raises: rank 1's traceback first, then rank 0's gloo
# error, then torchrun's summary (trimmed from a real run of the tiny recipe).
TWO_RANKS = [
    "[rank1]: Traceback (most recent call last):",
    '[rank1]:   File "/x/faultrw.py", line 5, in boom',
    '[rank1]:     raise ValueError("reward exploded on rank 1")',
    "[rank1]: ValueError: reward exploded on rank 1",
    "[rank0]: RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4005.",
    "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    "  rank      : 0 (local_rank: 0)",
    "  exitcode  : -15 (pid: 31474)  (SIGTERM)",
    "  error_file: <N/A>",
    "  rank      : 1 (local_rank: 1)",
    "  exitcode  : 1 (pid: 31475) ",
]


def events(lines, process="train", t0=0.0):
    return [Event(t0 + i, process, line) for i, line in enumerate(lines)]


def test_the_first_real_error_is_the_root_cause_not_the_survivors():
    f = diagnose(events(TWO_RANKS))
    assert f.kind == FailureKind.USER and not f.retryable
    assert f.headline() == "[train rank 1] ValueError: reward exploded on rank 1"


def test_order_is_by_arrival_across_processes_and_hosts():
    server = [Event(5.0, "vllm", "(EngineCore_DP0 pid=77) ERROR 11-22 06:58:47 [core.py:700] EngineCore failed")]
    late = events(TWO_RANKS, "train@h2", t0=10.0)
    f = diagnose([*late, *server])
    assert f.headline() == "[vllm EngineCore_DP0] EngineCore failed"
    assert diagnose(events(TWO_RANKS, "train@h2", t0=0.0) + server).where == "train@h2 rank 1"


def test_a_killed_rank_is_infrastructure_and_named_from_torchruns_summary():
    lines = [
        "[rank0]: RuntimeError: [pair.cc:553] Connection closed by peer [127.0.0.1]:4005.",
        "  rank      : 1 (local_rank: 1)",
        "  exitcode  : -9 (pid: 3)",
    ]
    f = diagnose(events(lines))
    assert f.kind == FailureKind.INFRA and f.retryable and f.headline() == "[train rank 1] killed by SIGKILL"
    lost = diagnose([], exits=[("train@h2", 255, Role.TRAIN)])
    assert lost.kind == FailureKind.INFRA and "host was lost" in lost.cause


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", FailureKind.OOM),
        ("(EngineCore_DP0 pid=9) ValueError: No available memory for the cache blocks.", FailureKind.OOM),
        ("[rank0]: RuntimeError: [enforce fail at inline_container.cc:664] . unexpected pos 64", FailureKind.DISK_FULL),
        ("[rank0]: OSError: [Errno 28] No space left on device", FailureKind.DISK_FULL),
        (
            "[rank0]: RuntimeError: PytorchStreamWriter failed writing file data/0: file write failed",
            FailureKind.DISK_FULL,
        ),
        ("[rank0]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970", FailureKind.INFRA),
        ("[rank1]: KeyError: 'answer'", FailureKind.USER),
    ],
)
def test_failure_kinds(line, kind):
    assert diagnose(events([line])).kind == kind


def test_stuck_frames_read_each_ranks_main_thread():
    dump = "\n".join(
        [
            "[rank1]: Thread 0x00007f01 (most recent call first):",
            '[rank1]:   File "/usr/lib/python3.11/threading.py", line 331 in wait',
            "[rank1]: Current thread 0x00007f00 (most recent call first):",
            '[rank1]:   File "/tmp/hang.py", line 7 in reward',
            '[rank1]:   File "/x/trl/grpo_trainer.py", line 900 in _calculate_rewards',
            "[rank0]: Current thread 0x00007e00 (most recent call first):",
            '[rank0]:   File "/x/torch/distributed/distributed_c10d.py", line 4287 in all_gather',
        ]
    )
    assert stuck_frames(dump) == {
        "rank 1": "reward (/tmp/hang.py:7)",
        "rank 0": "all_gather (/x/torch/distributed/distributed_c10d.py:4287)",
    }


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_watchdog_bounds_the_first_step_then_k_times_the_measured_step(tmp_path):
    metrics, clock = tmp_path / "metrics.jsonl", Clock()
    dog = Watchdog(metrics, first_step_s=100, factor=3, floor_s=10, clock=clock)
    clock.t += 99
    assert dog() is None
    metrics.write_text(json.dumps({"step": 1, "step_s": 8.0}) + "\n")
    clock.t += 50  # the step arrived: the bound is now max(10, 3 × 8) = 24 s from when it was seen
    assert dog() is None and dog.bound() == 24
    clock.t += 24.5
    assert "no optimizer step for 24 s (bound 24 s" in dog()
    fresh = Watchdog(metrics, first_step_s=100, factor=3, floor_s=10, clock=clock)
    assert fresh.bound() == 100  # an earlier attempt's step is a measurement, not progress of this one
    clock.t += 101
    assert "first optimizer step did not finish within 100 s" in fresh()


def test_watchdog_asks_for_a_checkpoint_before_the_deadline(tmp_path):
    metrics, clock, asked = tmp_path / "metrics.jsonl", Clock(), []
    lines = [{"step": 1, "step_s": 20.0}, {"step": 1, "save_s": 10.0}]
    metrics.write_text("".join(json.dumps(x) + "\n" for x in lines))
    # needs 2 × (20 + 10) + 30 = 90 s before the deadline
    dog = Watchdog(metrics, deadline=clock.t + 200, on_deadline=asked.append, clock=clock)
    clock.t += 109
    dog()
    assert not asked
    clock.t += 2
    dog()
    dog()
    assert len(asked) == 1 and "89 s left" in asked[0], asked
    assert "take 30 s as measured (counted 2×, with 30 s for the processes' exit)" in asked[0]


def safetensors(path, declared: int, actual: int) -> None:
    header = json.dumps({"w": {"dtype": "F32", "shape": [declared // 4], "data_offsets": [0, declared]}}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header + b"\0" * actual)


def checkpoint(root, step: int, *, whole: bool = True):
    d = root / f"checkpoint-{step}"
    d.mkdir(parents=True)
    safetensors(d / "model.safetensors", 4096, 4096 if whole else 1000)
    with zipfile.ZipFile(d / "optimizer.pt", "w") as z:
        z.writestr("data.pkl", b"x" * 100)
    if whole:
        (d / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return d


def test_a_checkpoint_is_complete_only_when_every_file_is_whole(tmp_path):
    good = checkpoint(tmp_path, 2)
    assert checkpoint_problems(good) == []
    cut = checkpoint(tmp_path, 4, whole=False)
    problems = checkpoint_problems(cut)
    assert "no trainer_state.json (the save did not finish)" in problems
    assert any(p.startswith("model.safetensors: ") and "header describes" in p for p in problems)
    (good / "optimizer.pt").write_bytes(b"PK\x03\x04 cut")
    assert checkpoint_problems(good) == ["optimizer.pt: not a whole torch archive"]
    (good / "latest").write_text("global_step2")
    (good / "optimizer.pt").unlink()
    assert checkpoint_problems(good) == ["DeepSpeed's latest names 'global_step2', which is missing"]


def test_resume_skips_and_keeps_a_damaged_newest_checkpoint(tmp_path):
    checkpoint(tmp_path, 2)
    checkpoint(tmp_path, 4, whole=False)
    r = decide_resume(tmp_path, "auto", 10)
    assert r.checkpoint == tmp_path / "checkpoint-2" and r.env_value == str(tmp_path / "checkpoint-2")
    assert "skipped damaged checkpoint-4 (no trainer_state.json" in r.notes[0]
    aside = [p.name for p in tmp_path.iterdir() if p.name.startswith("damaged-checkpoint-4-")]
    assert len(aside) == 1 and not (tmp_path / "checkpoint-4").exists()  # kept, out of the Trainer's way


def test_resume_modes_and_a_completed_run(tmp_path):
    assert decide_resume(tmp_path / "none", "auto", 5).env_value == "none"
    with pytest.raises(ConfigError, match="--resume must: no complete checkpoint"):
        decide_resume(tmp_path, "must", 5)
    checkpoint(tmp_path, 3)
    (tmp_path / COMPLETE_MARKER).write_text(json.dumps({"step": 5, "max_steps": 5}))
    assert decide_resume(tmp_path, "auto", 5).already_complete == CompletionRecord(step=5, max_steps=5)
    assert decide_resume(tmp_path, "auto", 8).checkpoint == tmp_path / "checkpoint-3"  # more steps: go on
    fresh = decide_resume(tmp_path, "never", 5)
    assert fresh.checkpoint is None and fresh.already_complete is None and "set aside 1" in fresh.notes[0]
    assert not (tmp_path / "checkpoint-3").exists() and not (tmp_path / COMPLETE_MARKER).exists()
    assert sum(p.name.startswith("superseded-") for p in tmp_path.iterdir()) == 2


def test_run_dir_lock_names_its_holder_and_protects_the_files(tmp_path):
    write_run_files(tmp_path, {"plan.json": "{}"})
    with RunLock(tmp_path):
        holder = lock_holder(tmp_path)
        assert holder is not None and holder.startswith("pid ")
        with (
            pytest.raises(LaunchError, match=r"is in use by another grpo-launch run \(pid \d+ on "),
            RunLock(tmp_path),
        ):
            pass
        with pytest.raises(LaunchError, match="in use"):
            write_run_files(tmp_path, {"plan.json": "overwritten"})
        write_run_files(tmp_path, {"plan.json": "by the holder"}, locked=True)
    assert lock_holder(tmp_path) is None and (tmp_path / "plan.json").read_text() == "by the holder"


def test_a_tracebacks_source_line_is_not_the_cause():
    lines = [
        '[rank0]:   File "/x/faultmod.py", line 19, in reward',
        '[rank0]:     raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")',
        "[rank0]: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
    ]
    f = diagnose(events(lines))
    assert f.kind == FailureKind.OOM
    assert f.headline() == "[train rank 0] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"


def test_split_verdicts():
    from grpo_launch.analysis.split_verdict import split_verdict
    from grpo_launch.enums import VllmMode

    server = split_verdict(3.1, 1.0, VllmMode.SERVER, planned=(1.0, 1.0), run_dir="runs/x")
    assert "generation is 3.1× training: more vLLM GPUs would help" in server
    assert "the measured step is 2.0× the plan's" in server and "--calibrate-from runs/x" in server
    assert "fewer vLLM GPUs, more trainers" in split_verdict(1.0, 2.0, VllmMode.SERVER)
    assert split_verdict(1.0, 1.2, VllmMode.COLOCATE, planned=(1.0, 1.1)).endswith(": balanced")


def test_the_watchdog_reports_the_split_at_the_fifth_step(tmp_path):
    metrics, clock, seen = tmp_path / "metrics.jsonl", Clock(), []
    dog = Watchdog(metrics, on_split=lambda g, t: seen.append((g, t)), clock=clock)
    with metrics.open("a") as f:
        for i in range(1, 6):
            f.write(json.dumps({"step": i, "step_s": 3.0, "generation_s": 2.0 + i, "training_s": 1.0}) + "\n")
    dog()
    assert seen == [(5.0, 1.0)]
