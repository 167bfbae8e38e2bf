"""grpo-launch: plan and launch GRPO training with TRL on whatever GPUs you have.

The pipeline is probe → plan → render → execute (docs/architecture.md):

* a backend (:mod:`grpo_launch.backends`: local, ssh hosts, a Slurm allocation) reads the machines into a
  :class:`~grpo_launch.topology.Topology` (:mod:`grpo_launch.probe` reads this one);
* :mod:`grpo_launch.planning` decides the vLLM split, the batch layout, the backend and memory settings (pure);
* :mod:`grpo_launch.commands` and :mod:`grpo_launch.render` turn a plan into processes and files (pure);
* :mod:`grpo_launch.run` places the processes with the backend and supervises them (:mod:`grpo_launch.supervisor`).
"""

__version__ = "0.1.0"
