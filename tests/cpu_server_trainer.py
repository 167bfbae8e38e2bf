"""grpo_launch.train, the real training entry (TRL 1.16 GRPOTrainer in server mode, against the real vLLM CPU
server the launcher started), with two things changed because these machines have no GPU:

- TRL's NCCL weight transfer (``VLLMClient.init_communicator`` and ``update_named_params``) needs CUDA on both
  sides, so it does nothing here and the server keeps generating with the weights it started with;
- a multi-process CPU run of a GPU plan has the device ``cpu:0``, which transformers passes to ``torch.load`` as the
  optimizer state's ``map_location`` on resume, and torch cannot restore a storage to that name: it is read to
  ``cpu``.

Everything else is real: the server's generations, the rewards, the trainers' optimizer steps, checkpoints, resume
and the metrics the launcher reads. Started by grpo-launch as ``launch.train_module``."""

from __future__ import annotations

import torch
from trl.generation.vllm_client import VLLMClient

from grpo_launch.train.__main__ import main


def _no_transfer(self, *args, **kwargs) -> None:
    return None


_load = torch.load


def _load_to_cpu(*args, **kwargs):
    where = kwargs.get("map_location")
    if isinstance(where, (str, torch.device)) and torch.device(where).type == "cpu":
        kwargs["map_location"] = "cpu"
    return _load(*args, **kwargs)


VLLMClient.init_communicator = _no_transfer  # NCCL: CUDA only
VLLMClient.update_named_params = _no_transfer  # NCCL broadcast: CUDA only

if __name__ == "__main__":
    torch.load = _load_to_cpu
    raise SystemExit(main())
