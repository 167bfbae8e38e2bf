"""One real CPU GRPO run watched the ways issue 40 asks, all at once (one run keeps the suite lean): a real Prometheus
server (Debian's package) configured from the shipped monitoring/prometheus.yml scrapes the run's endpoint
(launch.metrics_port, loopback, a free port), and ``grpo-launch status --watch`` runs in a real terminal (tmux) as
the run moves. The run's own reward function sleeps a second per call, so every step outlasts several scrapes and
drawings. Everything started here is stopped here."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import yaml

from .helpers import ROOT, TINY_RECIPE, free_port, tiny_overrides

pytestmark = pytest.mark.slow
STEPS = 5
SCRAPE = "300ms"
REQUIRE = "GRPO_LAUNCH_REQUIRE_PROMETHEUS"


def _require(tool: str) -> str:
    found = shutil.which(tool)
    if found:
        return found
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"{tool} is required ({REQUIRE}=1) but missing: run scripts/install_system_packages.sh")
    pytest.skip(f"{tool} is not installed: run scripts/install_system_packages.sh (as root)")


def _get(url: str, timeout: float = 5) -> dict:
    return json.loads(urllib.request.urlopen(url, timeout=timeout).read())


def _raw(prom: str, expr: str) -> list[dict]:
    """Every sample Prometheus stored for ``expr`` in the last 10 minutes (a range vector: the scrapes themselves)."""
    url = f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": f"{expr}[10m]"})
    return _get(url)["data"]["result"]


def _prometheus(tmp_path: Path, metrics_port: int) -> tuple[subprocess.Popen, str]:
    """Prometheus from the shipped scrape config, its targets set to this run's ports and its interval short."""
    binary = _require("prometheus")
    config = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": SCRAPE, "scrape_timeout": SCRAPE}
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    jobs["grpo-launch"]["static_configs"] = [{"targets": [f"127.0.0.1:{metrics_port}"]}]
    jobs["vllm"]["static_configs"] = [{"targets": [f"127.0.0.1:{free_port()}"]}]  # listed; this run has no server
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 — the process writes it until stopped
    proc = subprocess.Popen([binary, f"--config.file={path}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    prom = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"{prom}/-/ready", timeout=2)
            return proc, prom
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.3)
    proc.kill()
    pytest.fail("prometheus did not become ready: " + (tmp_path / "prometheus.log").read_text()[-2000:])


def _listeners(port: int) -> set[str]:
    """The addresses something listens on at ``port`` (/proc/net/tcp and tcp6, state 0A: LISTEN), as hex."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


def _slow_reward(tmp_path: Path) -> dict[str, str]:
    pkg = tmp_path / "slow_rewards"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mine.py").write_text(
        "import time\n"
        "def slow(prompts, completions, **kw):\n"
        "    time.sleep(1.0)  # every step outlasts several scrapes and drawings\n"
        "    return [0.0] * len(completions)\n"
    )
    return {"PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}


def test_prometheus_and_status_watch_follow_a_real_run(tmp_path):
    tmux = _require("tmux")
    metrics_port = free_port()
    prometheus, prom = _prometheus(tmp_path, metrics_port)
    run = tmp_path / "run"
    session = f"grpo-watch-{os.getpid()}"
    env = {**os.environ, **_slow_reward(tmp_path), "HF_HUB_OFFLINE": "1"}
    started = time.monotonic()
    launcher = subprocess.Popen(
        [sys.executable, "-m", "grpo_launch", TINY_RECIPE, *tiny_overrides(tmp_path), f"max_steps={STEPS}",
         "launch.num_processes=1", "reward_funcs=[digits,slow_rewards.mine:slow]",
         f"launch.metrics_port={metrics_port}", "launch.report_every_steps=2", "--run-dir", str(run)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    watch = f"{sys.executable} -m grpo_launch status --watch --interval 0.3 {run}; echo WATCH-ENDED rc=$?; sleep 60"
    panes: list[tuple[float, str, bool]] = []  # (when, the pane's text, the launcher still ran)
    bound: set[str] = set()
    try:
        subprocess.run([tmux, "new-session", "-d", "-s", session, "-x", "110", "-y", "30", watch], check=True,
                       env=env, cwd=ROOT)  # fmt: skip
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline:
            pane = subprocess.run([tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True).stdout
            panes.append((time.monotonic(), pane, launcher.poll() is None))
            bound |= _listeners(metrics_port)
            if "WATCH-ENDED" in pane:
                break
            time.sleep(0.3)
        out, _ = launcher.communicate(timeout=300)
        wall = time.monotonic() - started
        assert launcher.returncode == 0, out[-3000:]
        steps = _raw(prom, 'grpo_launch_step{job="grpo-launch"}')
        rewards = _raw(prom, 'grpo_launch_reward{job="grpo-launch"}')
        split = _raw(prom, 'grpo_launch_step_phase_seconds{job="grpo-launch"}')
        targets = _get(f"{prom}/api/v1/targets")["data"]["activeTargets"]
    finally:
        subprocess.run([tmux, "kill-session", "-t", session], capture_output=True)
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGTERM)
            launcher.wait(timeout=60)
        os.killpg(prometheus.pid, signal.SIGTERM)
        prometheus.wait(timeout=30)
    print(f"the watched run took {wall:.0f} s")
    # Prometheus saw every step, and the reward of every logged step as metrics.jsonl holds it.
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    logged = {line["log"]["reward"] for line in lines if "reward" in (line.get("log") or {})}
    (series,) = steps
    assert sorted({int(float(v)) for _, v in series["values"]}) == list(range(1, STEPS + 1))
    (reward_series,) = rewards
    assert {float(v) for _, v in reward_series["values"]} == logged
    assert {s["metric"]["phase"] for s in split} == {"generation", "training"}
    assert {t["labels"]["job"] for t in targets} == {"grpo-launch", "vllm"}  # vLLM's endpoint listed beside it
    assert bound == {"0100007F"}, bound  # the endpoint listened on 127.0.0.1 alone
    assert _listeners(metrics_port) == set()  # and stopped with the run
    # The report was written during the run, not only at its end.
    during = re.search(r"\[grpo-launch\] run report at step ([2-5]): ", out)  # the first poll past step 2
    assert during and during.start() < out.index("[grpo-launch] run report: "), out[-3000:]
    # status --watch: the step advanced on the screen while the run went, and the view ended when the run did.
    shown = [
        (int(m.group(1)), running) for _, pane, running in panes if (m := re.search(rf"step\W+(\d+)/{STEPS}", pane))
    ]
    assert len({s for s, running in shown if running}) >= 2, [p for _, p, _ in panes[-3:]]
    assert [s for s, _ in shown] == sorted(s for s, _ in shown)
    last = panes[-1][1]
    assert "WATCH-ENDED rc=0" in last and "(ended)" in last and f"{STEPS}/{STEPS}" in last, last
