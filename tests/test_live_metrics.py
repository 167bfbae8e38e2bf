"""The run's live metrics (issue 40): the one metric list (grpo_launch.analysis.live_metrics), the endpoint that serves
it (grpo_launch.execute.live, a real HTTP server on loopback read by prometheus_client's own parser), the shipped
scrape config and dashboard made from the list, the launch keys and their bad values. The real Prometheus server
scraping a real run, and ``status --watch`` in tmux: tests/test_watch_live.py."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from grpo_launch.analysis.live_metrics import BY_NAME, METRICS
from grpo_launch.enums import FailureKind, RunState
from grpo_launch.errors import ConfigError, LaunchError
from grpo_launch.execute.live import serve_metrics
from grpo_launch.recipe import load_recipe
from grpo_launch.render import monitoring
from grpo_launch.rundir.records import Attempt, LogRecord, StepRecord, append

from .helpers import ROOT, TINY_RECIPE, free_port, tiny_overrides

MONITORING = ROOT / "monitoring"


def test_shipped_files_are_what_the_generator_writes():
    for name, text in monitoring.files().items():
        assert (MONITORING / name).read_text() == text, f"monitoring/{name} is stale: run scripts/gen_monitoring.py"
    out = subprocess.run([sys.executable, "scripts/gen_monitoring.py", "--check"], cwd=ROOT, capture_output=True)
    assert out.returncode == 0, out.stderr


def _vllm_metric_names() -> set[str] | None:
    """The metric names vLLM's installed loggers register (vllm/v1/metrics/loggers.py), None without .venv-vllm."""
    found = sorted(ROOT.glob(".venv-vllm/lib/python3*/site-packages/vllm/v1/metrics/loggers.py"))
    return set(re.findall(r'name="(vllm:[a-z_]+)"', found[0].read_text())) if found else None


def _metric_of(expr: str) -> str:
    """The metric a panel's PromQL reads: the one name in it (a counter's _total is the counter's own name)."""
    (name,) = set(re.findall(r"(grpo_launch_[a-z_]+|vllm:[a-z_]+)", expr))
    return name


def test_every_dashboard_panel_queries_a_served_metric():
    board = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    vllm = _vllm_metric_names()
    queried = set()
    for panel in board["panels"]:
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            name = _metric_of(target["expr"])
            if name.startswith("vllm:"):
                if vllm is not None:  # vLLM's own source is the oracle for its names
                    assert name.removesuffix("_total") in vllm, (panel["title"], name)
                continue
            assert name in BY_NAME, (panel["title"], name)
            queried.add(name)
    assert queried == set(BY_NAME), f"metrics no panel draws: {sorted(set(BY_NAME) - queried)}"


def test_the_scrape_config_keeps_the_listed_metrics_and_lists_vllm():
    text = (MONITORING / "prometheus.yml").read_text()
    import yaml

    config = yaml.safe_load(text)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert set(jobs) == {"grpo-launch", "vllm"}
    keep = jobs["grpo-launch"]["metric_relabel_configs"][0]["regex"]
    assert set(keep.split("|")) == set(BY_NAME)
    assert jobs["vllm"]["metrics_path"] == "/metrics"
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "config", str(MONITORING / "prometheus.yml")],
                               capture_output=True, text=True)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr


def test_metric_names_follow_prometheus_conventions():
    for m in METRICS:
        assert re.fullmatch(r"grpo_launch_[a-z_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.kind == "counter"), m.name
        assert m.kind in ("gauge", "counter") and m.help.endswith(".")
        assert not m.name.endswith(("_s", "_gib", "_ms")), f"{m.name}: base units, spelled out"


def _run_dir(tmp_path: Path) -> Path:
    """A run directory as the trainers and the launcher write it (their own writer, the records' own types)."""
    run = tmp_path / "run"
    metrics = run / "metrics.jsonl"
    for step, reward in ((1, 0.25), (2, 0.5)):
        append(metrics, StepRecord(step=step, step_s=2.0, generation_s=1.5, training_s=0.5, max_steps=10,
                                   time=1000.0 + step, num_tokens=100 * step, peak_memory_bytes=(1 << 30, 2 << 30),
                                   memory_kind="rss_max", attempt=1))  # fmt: skip
        log = {"reward": reward, "reward_std": 0.1, "rewards/digits/mean": reward / 2, "completions/mean_length": 12.0,
               "clip_ratio/region_mean": 0.03, "sample/rollout_queue_size": 3.0}  # fmt: skip
        append(metrics, LogRecord(step, log, attempt=1))
    append(run / "control" / "attempts.jsonl",
           Attempt(1, 1000.0, RunState.FAILED, 1, FailureKind.INFRA, cause="NCCL timeout"))  # fmt: skip
    return run


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}  # fmt: skip


def test_the_endpoint_serves_what_the_run_directory_holds(tmp_path):
    run = _run_dir(tmp_path)
    port = free_port()
    server = serve_metrics(run, "127.0.0.1", port)
    try:
        assert server.server_address[0] == "127.0.0.1"
        got = _scrape(f"http://127.0.0.1:{port}/metrics")
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10)
    finally:
        server.shutdown()
        server.server_close()
    assert got[("grpo_launch_step", ())] == 2
    assert got[("grpo_launch_max_steps", ())] == 10
    assert got[("grpo_launch_reward", ())] == 0.5
    assert got[("grpo_launch_reward_function", (("function", "digits"),))] == 0.25
    assert got[("grpo_launch_step_phase_seconds", (("phase", "generation"),))] == 1.5
    assert got[("grpo_launch_tokens_per_second", ())] == 50.0  # 100 tokens over the 2 s step
    assert got[("grpo_launch_peak_memory_bytes", (("kind", "rss_max"), ("rank", "1")))] == 2 << 30
    assert got[("grpo_launch_clip_ratio", (("region", "region_mean"),))] == 0.03
    assert got[("grpo_launch_rollout_queue_size", ())] == 3
    assert got[("grpo_launch_attempts_total", (("failure", "infra"), ("state", "failed")))] == 1
    assert got[("grpo_launch_running", ())] == 0  # no launcher holds it
    assert ("grpo_launch_restarts_total", (("failure", "infra"),)) not in got  # no attempt followed the failure
    assert got[("grpo_launch_eta_seconds", ())] == pytest.approx(8 * 2.0)
    assert {name for name, _ in got} <= set(BY_NAME)  # nothing beyond the list


def test_a_port_in_use_is_an_error_naming_the_key(tmp_path):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with pytest.raises(LaunchError) as caught:
            serve_metrics(tmp_path, "127.0.0.1", port)
    assert f"127.0.0.1:{port}" in caught.value.message and "launch.metrics_port" in caught.value.hint


@pytest.mark.parametrize(
    ("value", "needle"),
    [
        (80, "launch.metrics_port 80 is a privileged port"),
        (0, "launch.metrics_port must be between 1 and 65535"),
        (70000, "launch.metrics_port must be between 1 and 65535"),
        ("x", "launch.metrics_port must be an integer"),
        (29500, "launch.metrics_port and launch.main_process_port are both 29500"),
    ],
)
def test_bad_metrics_ports_are_refused_with_the_key(value, needle):
    with pytest.raises(ConfigError) as caught:
        load_recipe(TINY_RECIPE, [f"launch.metrics_port={value}"])
    assert any(needle in p for p in caught.value.problems), caught.value.problems


def test_the_endpoint_is_off_unless_asked_and_on_loopback_by_default():
    launch = load_recipe(TINY_RECIPE, []).launch
    assert launch.metrics_port is None and launch.report_every_steps is None
    assert load_recipe(TINY_RECIPE, ["launch.metrics_port=9464"]).launch.metrics_host == "127.0.0.1"


@pytest.mark.slow
def test_a_run_whose_metrics_port_is_taken_starts_nothing(tmp_path):
    """The real CLI: the port is bound before any process of the run starts."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run([sys.executable, "-m", "grpo_launch", TINY_RECIPE, *tiny_overrides(tmp_path),
                               f"launch.metrics_port={port}", "--run-dir", str(tmp_path / "run")],
                              capture_output=True, text=True, cwd=ROOT, timeout=300)  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert f"cannot serve the run's metrics on 127.0.0.1:{port}" in proc.stderr and "launch.metrics_port" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "logs").exists()  # nothing was started


def test_status_watch_draws_a_finished_run_once_and_ends(tmp_path, capsys):
    """``status --watch`` on a run no launcher holds: one drawing, marked ended, exit 0; a bad interval is exit 2."""
    from grpo_launch.cli import main

    run = _run_dir(tmp_path)
    assert main(["status", str(run), "--watch", "--interval", "0.1"], environ={}) == 0
    shown = capsys.readouterr().out
    assert "(ended)" in shown and "2/10" in shown and "failed (infra: NCCL timeout)" in shown
    assert "generation 1.5 s (75%)" in shown and "0.500 ± 0.100" in shown  # the digits that show them
    assert main(["status", str(run), "--watch", "--interval", "0"], environ={}) == 2
    assert "--interval must be above 0" in capsys.readouterr().err


def test_the_plan_names_vllms_own_metrics_address():
    """vLLM's /metrics is found, not served again: plan.json names it in server mode; no server, no address."""
    from grpo_launch.render.plan_json import plan_to_dict

    from .helpers import plan_recipe

    server = plan_recipe({"model_name_or_path": "Qwen/Qwen2.5-1.5B-Instruct", "launch": {"vllm": "server",
                          "vllm_port": 8123}}, "8xH100-80GB")  # fmt: skip
    assert plan_to_dict(server)["vllm"]["metrics_urls"] == ["http://127.0.0.1:8123/metrics"]
    off = plan_recipe(TINY_RECIPE, "cpu", model=None)
    assert plan_to_dict(off)["vllm"]["metrics_urls"] == []
