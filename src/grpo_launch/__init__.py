"""grpo-launch: plan and launch GRPO training with TRL on whatever GPUs you have.

The pipeline is probe → plan → render → execute:

* :mod:`grpo_launch.probe` reads the machine (NVML, ``CUDA_VISIBLE_DEVICES``, Slurm, a hostfile or a spec string)
  into a :class:`~grpo_launch.topology.Topology`;
* :mod:`grpo_launch.plan` decides the vLLM split, the batch layout and the backend (pure);
* :mod:`grpo_launch.render` turns a plan into files and commands (pure);
* :mod:`grpo_launch.supervisor` starts and supervises the processes.
"""

__version__ = "0.1.0"
