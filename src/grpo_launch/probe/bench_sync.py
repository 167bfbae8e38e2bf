"""``grpo-launch calibrate``'s weight-sync measurement: the model's weights sent from one process to another of this
machine the way TRL 1.16 sends them to a vLLM server (``VLLMClient.update_named_params``: every parameter packed
into buffers of vLLM's ``DEFAULT_PACKED_BUFFER_SIZE_BYTES`` and broadcast from the trainer, rank 0, which the
receiving rank unpacks into its own weights: vllm/distributed/weight_transfer/packed_tensor.py). On GPUs over NCCL
between the first two GPUs (TRL's path within a node); on CPU over gloo, which is not TRL's path (TRL's weight
transfer needs CUDA) and is stored as such. The HTTP calls around a real update are not part of it.

:func:`measure_sync` starts two processes of this Python running this module (rank 0 and 1, a file store in a
temporary directory: nothing listens beyond the two ranks' own connections, on loopback) and returns rank 0's
median seconds over up to three sends after a warm-up. Needs torch and transformers."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

# vllm/distributed/weight_transfer/packed_tensor.py DEFAULT_PACKED_BUFFER_SIZE_BYTES (vLLM 0.28–0.31)
PACKED_BUFFER_BYTES = 1024**3
SENDS = 3


def measure_sync(model: str, dtype: str, device: str, seconds: float) -> tuple[dict[str, Any] | None, str]:
    """(rank 0's report: seconds, bytes, buffers, path; None when it could not run, with why)."""
    backend = "nccl" if device == "cuda" else "gloo"
    with tempfile.TemporaryDirectory(prefix="grpo-calibrate-sync-") as tmp:
        env = {
            **os.environ,
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo",
            "OMP_NUM_THREADS": "1",
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
        }
        job = {"model": model, "dtype": dtype, "backend": backend, "store": f"{tmp}/store", "deadline_s": seconds * 0.8}
        argv = [[sys.executable, "-m", __name__, json.dumps({**job, "rank": rank})] for rank in (0, 1)]
        pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
        procs = [subprocess.Popen(a, start_new_session=True, **pipes) for a in argv]  # type: ignore[call-overload]
        outs = []
        try:
            for proc in procs:
                outs.append(proc.communicate(timeout=max(1.0, seconds)))
        except subprocess.TimeoutExpired:
            for proc in procs:
                proc.kill()
                proc.communicate()
            return None, f"not done within its {seconds:.0f} s (raise --minutes)"
    if any(p.returncode for p in procs):
        err = next(e for p, (_, e) in zip(procs, outs, strict=True) if p.returncode)
        return None, f"failed here ({(err.strip().splitlines() or ['no output'])[-1][:200]})"
    lines = [line for line in outs[0][0].splitlines() if line.startswith("{")]
    return (json.loads(lines[-1]), "") if lines else (None, "rank 0 reported nothing")


def _shapes(model: str, dtype: Any) -> list[tuple[int, ...]]:
    """The model's parameter shapes from its config alone (no weights read)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model), torch_dtype=dtype)
    return [tuple(p.shape) for p in built.parameters()]


def _buffers(sizes: list[int], limit: int) -> list[list[int]]:
    """Parameter indices packed in order into buffers of at most ``limit`` bytes (a larger one alone)."""
    out: list[list[int]] = [[]]
    used = 0
    for i, size in enumerate(sizes):
        if out[-1] and used + size > limit:
            out.append([])
            used = 0
        out[-1].append(i)
        used += size
    return [b for b in out if b]


def _run(job: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist

    rank = int(job["rank"])
    dtype = torch.bfloat16 if job["dtype"] == "bfloat16" else torch.float32
    device = torch.device("cuda", rank) if job["backend"] == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.set_num_threads(1)
    params = [torch.zeros(shape, dtype=dtype, device=device) for shape in _shapes(job["model"], dtype)]
    sizes = [p.numel() * p.element_size() for p in params]
    packs = _buffers(sizes, PACKED_BUFFER_BYTES)
    dist.init_process_group(job["backend"], init_method=f"file://{job['store']}", rank=rank, world_size=2)

    def send() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        for pack in packs:
            if rank == 0:  # the trainer packs its weights and broadcasts the buffer
                buffer = torch.cat([params[i].reshape(-1).view(torch.uint8) for i in pack])
            else:
                buffer = torch.empty(sum(sizes[i] for i in pack), dtype=torch.uint8, device=device)
            dist.broadcast(buffer, src=0)
            if rank == 1:  # the server unpacks it into its weights
                at = 0
                for i in pack:
                    params[i].reshape(-1).view(torch.uint8).copy_(buffer[at : at + sizes[i]])
                    at += sizes[i]
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        return time.perf_counter() - t0

    end = time.monotonic() + float(job["deadline_s"])
    send()  # warm-up: the connections and the first buffers
    runs = [send()]
    while len(runs) < SENDS:
        go = torch.tensor([int(time.monotonic() < end)], device=device)
        dist.broadcast(go, src=0)  # both ranks stop together
        if not go.item():
            break
        runs.append(send())
    dist.destroy_process_group()
    if rank == 0:
        print(
            json.dumps(
                {
                    "seconds": statistics.median(runs),
                    "bytes": sum(sizes),
                    "buffers": len(packs),
                    "path": job["backend"],
                    "sends": len(runs),
                }
            )
        )


if __name__ == "__main__":
    _run(json.loads(sys.argv[1]))
