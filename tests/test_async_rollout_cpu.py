"""TRL 1.16's own async rollout worker (AsyncRolloutWorker: its spawned CUDA-free child, generation over HTTP,
scoring with grpo-launch's rewards, group advantages, the bounded queue, the model version) against a real vLLM
server (CPU build 0.31.0 in .venv-vllm) started from grpo-launch's rendered async plan, through its supervisor,
with the plan's own pipeline values (max_inflight_tasks, queue_maxsize, num_generations, max_completion_length,
vllm_server_base_url). Nothing is left running. The server is guarded (grpo_launch.node.vllm_guard): the worker's
process carries the token as the training entry's does (grpo_launch.train.server_auth.guard_clients, asynchronous:
TRL's async VLLMClient and the rollout worker's aiohttp session in its spawned child).

What does not run here, and why: the trainer's optimizer step (tree attention is the kernels-community/flash-attn3
GPU kernel, trl packing.py:160-165) and the NCCL weight sync (CUDA on both sides). The version bump the trainer
makes after a sync is made here by hand (``update_model_version``), as the trainer's ``_sync_weight`` does.
"""

from __future__ import annotations

import json
import os
import secrets
import textwrap
import time

import pytest

from grpo_launch.machines.topology import parse_gpu_spec
from grpo_launch.planning import make_plan
from grpo_launch.probe.model import resolve_model_shape
from grpo_launch.recipe import build_recipe
from grpo_launch.render.processes import vllm_server as render_vllm_command
from grpo_launch.rundir.layout import VLLM_TOKEN_ENV
from grpo_launch.spec import ProcessSpec

from .helpers import ROOT, ensure_tiny_assets, free_port, vllm_cpu_env

VLLM_PY = ROOT / ".venv-vllm" / "bin" / "python"
pytestmark = [
    pytest.mark.vllm,
    pytest.mark.slow,
    pytest.mark.skipif(not VLLM_PY.exists(), reason="run scripts/setup_vllm_cpu.sh (scripts/test.sh does)"),
]

WORKER = textwrap.dedent(
    """
    import json, os, queue, sys, time
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl.experimental.async_grpo.vllm_client import VLLMClient
    from trl.experimental.async_grpo.async_rollout_worker import AsyncRolloutWorker
    from grpo_launch.train.rewards import load_reward

    def main():
        values, data, out = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
        PartialState()  # the trainer's Accelerator makes it; TRL's worker logs through accelerate
        from grpo_launch.train.server_auth import guard_clients
        guard_clients(values["vllm_server_base_url"], os.environ["GRPO_LAUNCH_VLLM_TOKEN"], asynchronous=True)
        VLLMClient(values["vllm_server_base_url"], 300).wait_for_server_ready()  # as the trainer does first
        model = values["model_name_or_path"]
        tok = AutoTokenizer.from_pretrained(model)
        # The worker needs a chat template TRL recognizes (async_rollout_worker.py:364-369, add_response_schema):
        # the tiny model is a Qwen2, given TRL's own Qwen2.5 template (what a recipe's chat_template key does).
        from trl.chat_template_utils import qwen2_5_chat_template
        tok.chat_template = qwen2_5_chat_template
        rows = [json.loads(line) for line in open(data)][:6]
        ds = Dataset.from_list([{"prompt": [{"role": "user", "content": r["prompt"]}]} for r in rows])
        cfg = {"max_completion_length": values["max_completion_length"]}
        rewards = [load_reward(name, cfg) for name in ("format", "length")]
        k = values["num_generations"]
        worker = AsyncRolloutWorker(
            model_name=model, dataset=ds, reward_funcs=rewards, processing_class=tok,
            eos_token_ids=[tok.eos_token_id], num_generations=k, max_inflight_tasks=values["max_inflight_tasks"],
            queue_maxsize=values["queue_maxsize"], vllm_server_url=values["vllm_server_base_url"],
            max_tokens=values["max_completion_length"], temperature=1.0, request_timeout=120,
        )
        t0 = time.monotonic()
        worker.start()
        first = [worker.rollout_buffer.get(timeout=300) for _ in range(2 * k)]
        worker.update_model_version(1)  # what the trainer does after a weight sync
        later, deadline = [], time.monotonic() + 300
        while time.monotonic() < deadline and not any(s.model_version == 1 for s in later):
            later.append(worker.rollout_buffer.get(timeout=300))
        worker.check_health(stale_after_s=300)
        metrics = []
        while True:
            try:
                metrics.append(worker.metrics_queue.get_nowait())
            except queue.Empty:
                break
        worker.stop()
        samples = first + later
        json.dump({
            "seconds": time.monotonic() - t0,
            "versions": [s.model_version for s in samples],
            "groups": [s.group_id for s in samples],
            "advantages": [s.advantage for s in samples],
            "completion_tokens": [int(s.completion_mask.sum()) for s in samples],
            "old_log_probs": [float(s.old_log_probs[s.completion_mask.astype(bool)].sum()) for s in samples],
            "metric_keys": sorted({k for m in metrics for k in (m if isinstance(m, dict) else {})}),
            "queue_maxsize": values["queue_maxsize"],
        }, open(out, "w"))
        print("rollout worker done", flush=True)

    if __name__ == "__main__":
        main()
    """
)


def _async_plan(tmp_path, port):
    tiny = ensure_tiny_assets()
    values = {
        "model_name_or_path": str(tiny / "model"),
        "max_prompt_length": 160,  # TRL's Qwen2.5 template adds a default system prompt (~40 tokens)
        "max_completion_length": 16,
        "num_generations": 4,
        "per_device_train_batch_size": 4,
        "launch": {
            "mode": "async",
            "vllm_port": port,
            "vllm_command": [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server"],
            "vllm_extra_args": ["--enforce-eager"],
            "vllm_env": vllm_cpu_env(tmp_path),
        },
    }
    shape, _ = resolve_model_shape(str(tiny / "model"))
    # Planned as if on 2 A100s (async is GPU-only); the CPU build of vLLM ignores CUDA_VISIBLE_DEVICES.
    return make_plan(parse_gpu_spec("2xA100-80GB"), build_recipe(values), shape)


def test_trl_async_rollout_worker_fills_the_queue_from_the_planned_server(tmp_path):
    from grpo_launch.execute.session import SessionSpec, supervise

    port = free_port()
    plan = _async_plan(tmp_path, port)
    a, values = plan.asynchronous, plan.resolved_trainer_values
    assert a is not None and values["vllm_server_base_url"] == f"http://127.0.0.1:{port}"
    server = render_vllm_command(plan)
    (tmp_path / "values.json").write_text(json.dumps(values, default=str))
    (tmp_path / "worker.py").write_text(WORKER)
    result = tmp_path / "result.json"
    data = ensure_tiny_assets() / "data" / "train.jsonl"
    client = ProcessSpec("train", (str(VLLM_PY), str(tmp_path / "worker.py"), str(tmp_path / "values.json"),
                                   str(data), str(result)))  # fmt: skip
    session = SessionSpec(server, [client], tmp_path / "logs", health_url=f"http://127.0.0.1:{port}/health",
                          health_timeout_s=600, grace_s=20)  # fmt: skip
    lines: list[str] = []
    t0 = time.monotonic()
    # The attempt's token, as execute/run.py gives it: in the environment of the server and the worker.
    environ = {**os.environ, VLLM_TOKEN_ENV: secrets.token_urlsafe(32)}
    outcome = supervise(session, environ=environ, emit=lines.append)
    assert outcome.exit_code == 0, "\n".join(lines[-60:]) + f"\n{outcome}"
    got = json.loads(result.read_text())
    k = values["num_generations"]
    # whole groups of num_generations, version 0 until the bump, then version 1 samples arrive
    assert len(got["versions"]) >= 2 * k and set(got["versions"][: 2 * k]) == {0} and 1 in got["versions"]
    groups: dict[int, list[float]] = {}
    for g, adv in zip(got["groups"], got["advantages"], strict=True):
        groups.setdefault(g, []).append(adv)
    assert all(abs(sum(v)) < 1e-4 for v in groups.values() if len(v) == k)  # group-relative advantages
    assert all(0 < n <= values["max_completion_length"] for n in got["completion_tokens"])
    assert all(lp < 0 for lp in got["old_log_probs"])  # the server's sampled log-probs: the trainer's old ones
    print(f"async rollout on the vLLM CPU server: {len(got['versions'])} samples in {got['seconds']:.1f} s "
          f"(session {time.monotonic() - t0:.1f} s); metrics {got['metric_keys']}")  # fmt: skip
