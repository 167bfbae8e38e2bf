"""grpo_launch.train, the real training entry (TRL 1.16 GRPOTrainer in server mode, against the real vLLM CPU
server the launcher started), with one thing replaced: TRL's NCCL weight transfer (``VLLMClient.init_communicator``
and ``update_named_params``) needs CUDA on both sides, and these machines have none, so it does nothing here and the
server keeps generating with the weights it started with. Everything else is real: the server's generations, the
rewards, the trainers' optimizer steps (their weights change), checkpoints, resume and the metrics the launcher
reads. Started by grpo-launch as ``launch.train_module``."""

from __future__ import annotations

from trl.generation.vllm_client import VLLMClient

from grpo_launch.train.__main__ import main


def _no_transfer(self, *args, **kwargs) -> None:
    return None


VLLMClient.init_communicator = _no_transfer  # NCCL: CUDA only
VLLMClient.update_named_params = _no_transfer  # NCCL broadcast: CUDA only

if __name__ == "__main__":
    raise SystemExit(main())
