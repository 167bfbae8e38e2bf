"""vLLM's start-up and decode speed, measured in vLLM's own Python (``python bench_vllm.py JSON``): engine start-up
(``vllm.LLM``, with CUDA graphs as a run uses them on a GPU, eager on a CPU), then seconds per decode step at each
batch size, every completion forced to the full length (``min_tokens``, ``ignore_eos``). ``random_weights``:
``load_format="dummy"``, the config's shapes with no download. Prints one JSON line. Standard library and vLLM
only: no import of grpo_launch (vLLM's environment need not have it), like :mod:`grpo_launch.probe.pythons`."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> int:
    spec = json.loads(argv[0])
    from vllm import LLM, SamplingParams

    t0 = time.perf_counter()
    llm = LLM(
        model=spec["model"],
        dtype=spec["dtype"],
        max_model_len=spec["prompt_len"] + spec["completion_len"],
        load_format="dummy" if spec["random_weights"] else "auto",
        tensor_parallel_size=spec.get("tp", 1),
        enforce_eager=not spec.get("graphs", False),
        seed=0,
    )
    start = time.perf_counter() - t0
    n = spec["completion_len"]
    params = SamplingParams(max_tokens=n, min_tokens=n, ignore_eos=True, temperature=1.0)
    prompt = {"prompt_token_ids": [5] * spec["prompt_len"]}
    decode: list[tuple[int, float]] = []
    deadline = time.monotonic() + spec["seconds"]
    for batch in spec["batches"]:
        if decode and time.monotonic() > deadline:
            break
        llm.generate([prompt] * batch, params, use_tqdm=False)  # warm-up
        t0 = time.perf_counter()
        llm.generate([prompt] * batch, params, use_tqdm=False)
        decode.append((batch, (time.perf_counter() - t0) / n))
    print(json.dumps({"engine_start_s": start, "decode": decode}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
