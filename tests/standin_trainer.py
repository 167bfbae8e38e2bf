"""A stand-in for grpo_launch.train in the dedicated-vLLM-node runs (real Slurm nodes, real sshd hosts): started by
grpo-launch through ``accelerate launch --module`` (``launch.train_module``) exactly where the trainers would run.

Why a stand-in: a server-mode GRPO trainer joins the vLLM server's NCCL weight-sync group, which needs CUDA on both
sides; these machines have none. Everything else is real and checked here, per training process:

- accelerate's launch gave it its rank, world size, machine rank and main address (torch.distributed over gloo
  across the training hosts: one all-reduce of the ranks);
- it reaches the vLLM server on the other host at the URL grpo-launch wrote into the trainer recipe, and the
  server generates for it (``/v1/completions``, ``n`` = 2) and reports its weight-sync world (``/get_world_size``),
  both behind the server's guard, with the attempt's token;
- it writes what it saw to ``$GRPO_LAUNCH_RUN_DIR/standin/rank<R>.json`` for the test to read.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from grpo_launch.rundir.layout import RUN_DIR_ENV, VLLM_TOKEN_ENV


def _auth() -> dict[str, str]:
    """The attempt's token for the server's guard (grpo_launch.node.vllm_guard), as the real trainers' clients send
    it (grpo_launch.train.server_auth): it reached this process through its environment (on stdin over ssh, through
    srun's --export=ALL under Slurm)."""
    token = os.environ.get(VLLM_TOKEN_ENV)
    if not token:
        raise SystemExit(
            f"{VLLM_TOKEN_ENV} is not set in the trainer's environment: the server's token did not reach it"
        )
    return {"Authorization": f"Bearer {token}"}


def _get(url: str) -> dict:
    with urllib.request.urlopen(urllib.request.Request(url, headers=_auth()), timeout=120) as r:
        return json.loads(r.read())


def _post(url: str, body: dict) -> dict:
    headers = {"Content-Type": "application/json", **_auth()}
    req = urllib.request.Request(url, json.dumps(body).encode(), headers)
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _wait_for_server(url: str, timeout_s: float) -> None:
    """As TRL's VLLMClient does before its first request: poll /health until it answers (the launcher starts the
    trainers while the server loads)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", required=True)
    args = parser.parse_args()
    values = yaml.safe_load(Path(args.recipe).read_text())
    url = values["vllm_server_base_url"]
    if "RANK" not in os.environ:  # one training process: accelerate runs it directly, without torchrun
        with socket.socket() as free:
            free.bind(("127.0.0.1", 0))
            port = free.getsockname()[1]
        os.environ.update(RANK="0", WORLD_SIZE="1", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    total = torch.tensor([rank], dtype=torch.int64)
    dist.all_reduce(total)
    record = {
        "rank": rank,
        "world_size": world,
        "rank_sum": int(total.item()),
        "machine_rank": int(os.environ.get("GROUP_RANK", os.environ.get("MACHINE_RANK", "-1"))),
        "master_addr": os.environ.get("MASTER_ADDR"),
        "host": socket.gethostname(),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "vllm_url": url,
        "vllm_mode": values.get("vllm_mode"),
    }
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:  # one request per host: the server's two cores are few
        _wait_for_server(url, float(values.get("vllm_server_timeout") or 600))
        out = _post(f"{url}/v1/completions", {"model": values["model_name_or_path"], "prompt": "1 + 1 =", "n": 2,
                                              "max_tokens": 4, "temperature": 1.0})  # fmt: skip
        record["completions"] = [c["text"] for c in out["choices"]]
        record["server_world_size"] = _get(f"{url}/get_world_size")["world_size"]
    dist.barrier()
    dist.destroy_process_group()
    where = Path(os.environ[RUN_DIR_ENV]) / "standin"
    where.mkdir(parents=True, exist_ok=True)
    (where / f"rank{rank}.json").write_text(json.dumps(record))
    print(f"standin rank {rank}/{world} machine {record['machine_rank']} ok", flush=True)


if __name__ == "__main__":
    main()
