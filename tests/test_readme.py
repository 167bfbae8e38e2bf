"""The README's examples are what the program prints: every fenced block line ``$ grpo-launch ARGS`` (run here, with
no GPU, so each example names its --gpus) is run in-process, and its output must equal the lines that follow it up
to the next ``$`` line or the block's end. Paths in the examples are relative to the repository."""

from __future__ import annotations

import shlex

import pytest

from grpo_launch.cli import main

from .helpers import ROOT


def _blocks() -> list[list[str]]:
    """The README's fenced blocks, each as its lines without the fence's indentation."""
    blocks: list[list[str]] = []
    current: list[str] | None = None
    indent = 0
    for line in (ROOT / "README.md").read_text().splitlines():
        fence = line.lstrip().startswith("```")
        if fence and current is None:
            current, indent = [], len(line) - len(line.lstrip())
        elif fence and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line[indent:])
    return blocks


def _examples() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for lines in _blocks():
        for i, line in enumerate(lines):
            if line.startswith("$ grpo-launch "):
                rest = lines[i + 1 :]
                end = next((j for j, x in enumerate(rest) if x.startswith("$ ")), len(rest))
                out.append((line[2:], rest[:end]))
    return out


EXAMPLES = _examples()


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 2


@pytest.mark.parametrize(("command", "expected"), EXAMPLES, ids=[c for c, _ in EXAMPLES])
def test_readme_example_prints_what_the_readme_says(command, expected, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    argv = shlex.split(command)[1:]
    assert "--gpus" in argv, "an example must not depend on this machine's GPUs"
    main(argv, environ={})
    captured = capsys.readouterr()
    assert (captured.out + captured.err).rstrip("\n").splitlines() == expected


# ------------------------------------------------------------------------------------- every command line it shows
# Every `grpo-launch …` line of the README's bash blocks is either run here (no GPU needed) or named below with why it
# cannot be: a new line must be placed in one of the two.
NOT_HERE = {
    "grpo-launch recipes/qwen1.5b.yaml": "runs on this machine's GPUs",
    "grpo-launch sbatch recipes/qwen7b-math.yaml --nodes 2 --gpus-per-node 8 --time 1-00:00:00 --partition gpu":
        "submits to a Slurm cluster (tests/test_slurm_cluster.py submits to a real one)",
    "grpo-launch recipes/qwen7b-math.yaml --hostfile hosts --ssh-port 2222 --ssh-identity ~/.ssh/id_ed25519":
        "starts processes on ssh hosts (tests/test_ssh_hosts.py runs on real ones)",
    "grpo-launch inspect --ray HEAD:6379": "attaches to a Ray cluster (tests/test_ray_placement.py: a real one)",
    "grpo-launch recipes/qwen7b-math.yaml --ray HEAD:6379": "runs on a Ray cluster (tests/test_ray_cluster.py)",
    "grpo-launch ray-submit recipes/qwen7b-math.yaml --ray HEAD:6379 --dry-run":
        "plans on a live Ray cluster (tests/test_ray_cluster.py submits to a real one)",
    "grpo-launch resume grpo_runs/tiny-cpu":
        "continues a stopped run (tests/test_resume.py stops a real CPU run and continues it by status's hint)",
    "grpo-launch sky recipes/qwen7b-math.yaml --accelerators H100:8 --nodes 2 --launch":
        "rents cloud GPUs (tests/test_sky_task.py: SkyPilot's own parser; tests/test_sky_run.py: the run section)",
    "grpo-launch sky recipes/qwen7b-math.yaml --accelerators H100:8 --nodes 2 --spot --managed --bucket "
    "s3://my-bucket/grpo output_dir=/grpo-runs/qwen7b-math/output --launch":
        "rents cloud GPUs (tests/test_sky_task.py: a managed task, SkyPilot's parser)",
    "grpo-launch calibrate recipes/qwen1.5b.yaml --random-weights":
        "measures this machine's GPU for a 1.5B model (tests/test_calibrate.py calibrates the tiny recipe on this CPU)",
}  # fmt: skip
# Lines that plan for this machine's GPUs run here with --gpus added (the README's own run directory stands in).
WITH_GPUS = {"grpo-launch plan recipes/qwen1.5b.yaml --calibrate-from grpo_runs/qwen1.5b": ["--gpus", "8xH100-80GB"]}


def _command_lines() -> list[str]:
    lines = []
    for block in _blocks():
        for line in block:
            command = line.split("  #", 1)[0].strip()
            if command.startswith("grpo-launch "):
                lines.append(command)
    return lines


COMMANDS = _command_lines()


def test_every_command_line_is_run_here_or_says_why_not():
    assert len(COMMANDS) >= 10
    assert set(NOT_HERE) <= set(COMMANDS), "a line named here is no longer in the README"


@pytest.fixture
def readme_workdir(tmp_path, monkeypatch, tiny_assets):
    """A working directory like a fresh clone's (recipes/, the tiny assets), the README's hostfile, and a finished
    run in grpo_runs/qwen1.5b: a real plan for 8 H100s and step records written here (no GPU run can happen)."""
    import json

    (tmp_path / "recipes").symlink_to(ROOT / "recipes")
    (tmp_path / ".cache").symlink_to(ROOT / ".cache")
    (tmp_path / "pyproject.toml").symlink_to(ROOT / "pyproject.toml")  # a clone's: `sky` installs the checkout
    hosts = next(b for b in _blocks() if any(x.startswith("node1 slots=8") for x in b))
    (tmp_path / "hosts").write_text("\n".join(x for x in hosts if x.startswith("node")) + "\n")
    monkeypatch.chdir(tmp_path)
    assert main(["plan", "recipes/qwen1.5b.yaml", "--gpus", "8xH100-80GB"], environ={}) == 0
    run = tmp_path / "grpo_runs" / "qwen1.5b"
    step = json.loads((run / "plan.json").read_text())["estimate"]["time_s"]["step"] * 2
    with open(run / "metrics.jsonl", "w") as f:
        for i in range(1, 6):
            f.write(json.dumps({"step": i, "max_steps": 100, "time": 1e9 + i * step, "step_s": step,
                                "generation_s": step * 0.8, "training_s": step * 0.2}) + "\n")  # fmt: skip
            f.write(json.dumps({"step": i, "log": {"reward": 0.1 * i, "completions/mean_length": 700.0}}) + "\n")
    (run / "control").mkdir()
    (run / "control" / "attempts.jsonl").write_text('{"attempt": 1, "ended": 1e9, "state": "succeeded"}\n')
    return tmp_path


@pytest.mark.parametrize("command", [c for c in COMMANDS if c not in NOT_HERE], ids=lambda c: c)
def test_readme_command_runs_here(command, readme_workdir, capsys):
    import shlex

    record = readme_workdir / "grpo_runs" / "qwen1.5b"
    before = {p.name: p.read_bytes() for p in (record / "plan.json", record / "metrics.jsonl")}
    assert main([*shlex.split(command)[1:], *WITH_GPUS.get(command, [])], environ={}) == 0, capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in (record / "plan.json", record / "metrics.jsonl")} == before


# ------------------------------------------------------------------------------------------------ what a run prints
def _run_block() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("What a run prints")
    return next(b for b in _blocks() if b and b[0].startswith("[grpo-launch] plan:") and text.find(b[0]) > start)


def _shape(line: str, hostname: str) -> str:
    """A console line with what changes from run to run made alike: numbers, the host's name."""
    import re

    line = re.sub(rf"\b{re.escape(hostname)}\b", "HOST", line) if hostname else line
    return re.sub(r"\d[\d,.]*", "#", line.replace("node=vm", "node=HOST").replace("roles: vm ", "roles: HOST "))


@pytest.mark.slow
def test_a_run_prints_what_the_readme_says(tmp_path, tiny_assets):
    """The tiny CPU recipe for 3 steps, for real (two CPU trainer processes): every console line, in order, as the
    README's block shows it (numbers and the host's name aside)."""
    import os
    import socket
    import subprocess
    import sys

    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "grpo_launch", "recipes/tiny-cpu.yaml", "max_steps=3", "--run-dir",
                           str(run)], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    printed = (done.stdout + done.stderr).replace(str(run), "grpo_runs/tiny-cpu").splitlines()
    host = socket.gethostname()
    assert [_shape(x, host) for x in printed] == [_shape(x, "vm") for x in _run_block()]


# The README's statements about what the planner does over several hosts, each with the plan that shows it.
CLAIMS = [
    (
        "Llama-3.1-405B on 4 × 8 × H100: TP 8 × PP 3 over three hosts",
        ["plan", "recipes/llama70b.yaml", "model_name_or_path=meta-llama/Llama-3.1-405B-Instruct",
         "--gpus", "4x8xH100-80GB", "--no-write"],
        ["node1 GPUs 0-7; node2 GPUs 0-7; node3 GPUs 0-7, TP 8 × PP 3"],
    ),
    (
        "Qwen3-235B-A22B on 4 × 8 × H100: TP 2 × DP 8 over four hosts' last four GPUs",
        ["plan", "recipes/qwen3-30b-a3b.yaml", "model_name_or_path=Qwen/Qwen3-235B-A22B", "--gpus", "4x8xH100-80GB",
         "--no-write"],
        ["node0 GPUs 4-7; node1 GPUs 4-7; node2 GPUs 4-7; node3 GPUs 4-7, TP 2 × DP 8, expert parallel"],
    ),
    (
        "DeepSeek-V3 in\nbf16 (1250 GiB) is refused on 8 × 80 GB and on 4 × 8 × 80 GB GPUs",
        ["plan", "recipes/qwen3-30b-a3b.yaml", "model_name_or_path=deepseek-ai/DeepSeek-V3", "--gpus", "4x8xH100-80GB",
         "--no-write"],
        ["does not fit vLLM on up to 28 GPUs"],
    ),
    (
        "and planned on 8 × 8 × H200",
        ["plan", "recipes/qwen3-30b-a3b.yaml", "model_name_or_path=deepseek-ai/DeepSeek-V3", "--gpus",
         "8x8xH200-141GB", "--no-write"],
        ["vLLM server  node5 GPUs 0-7; node6 GPUs 0-7; node7 GPUs 0-7"],
    ),
]  # fmt: skip


@pytest.mark.parametrize(("claim", "argv", "shown"), CLAIMS, ids=[c.split(":")[0][:40] for c, _, _ in CLAIMS])
def test_the_readmes_multi_host_statements_are_what_the_planner_does(claim, argv, shown, capsys, monkeypatch):
    """Issue 41: the README said a dense model over hosts and an MoE server over nodes were not planned; both are."""
    assert claim in (ROOT / "README.md").read_text(), "the README no longer says this: update the claim here"
    monkeypatch.chdir(ROOT)
    main(argv, environ={"HF_HUB_OFFLINE": "1"})
    out = capsys.readouterr()
    for text in shown:
        assert text in out.out + out.err, (claim, (out.out + out.err)[-3000:])


def test_every_launch_key_is_in_the_readmes_key_table():
    """The README's launch-block table names every field of LaunchSettings (it lacked adapt, adapt_max_resplits and
    adapt_warmup_steps), and no field that is not one."""
    import dataclasses
    import re

    from grpo_launch.recipe.launch import LaunchSettings

    text = (ROOT / "README.md").read_text()
    start = text.index("| key | default | meaning |")
    rows = [line for line in text[start:].split("\n\n", 1)[0].splitlines()[2:] if line.startswith("| ")]
    named = {name for row in rows for name in re.findall(r"`([a-z_]+)`", row.split("|")[1])}
    fields = {f.name for f in dataclasses.fields(LaunchSettings)}
    assert fields - named == set(), f"launch keys missing from the README's table: {sorted(fields - named)}"
    assert named - fields == set(), f"README table rows that are no launch key: {sorted(named - fields)}"


def test_the_readme_sections_the_docs_name_are_there():
    """A page of docs/ that sends the reader to a README section ("the README's "X"") finds its heading there."""
    import re

    headings = {line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line[:1] == "#"}
    named = {(page.name, m) for page in (ROOT / "docs").glob("*.md")
             for m in re.findall(r"README's \"([^\"]+)\"", page.read_text())}  # fmt: skip
    assert named, "no page names a README section: the pattern no longer matches the docs"
    assert [n for n in named if n[1] not in headings] == []


@pytest.mark.parametrize("verb", ["run", "plan", "sbatch", "ray-submit", "sky"])
def test_every_run_dir_help_names_the_recipes_run_dir_first(verb, capsys):
    """--run-dir's default is launch.run_dir, then grpo_runs/NAME (planning/one_split.default_run_dir), for every
    verb that plans."""
    with pytest.raises(SystemExit):
        main([verb, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: launch.run_dir or grpo_runs/NAME)" in text
