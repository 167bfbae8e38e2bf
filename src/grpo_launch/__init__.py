"""grpo-launch: plan and launch GRPO training with TRL on whatever GPUs you have.

The pipeline is probe → plan → render → execute, each stage a folder (docs/architecture.md):

* a backend (:mod:`grpo_launch.backends`: local, ssh hosts, a Slurm allocation) reads the machines into a
  :class:`~grpo_launch.machines.topology.Topology` (:mod:`grpo_launch.probe` reads this one);
* :mod:`grpo_launch.planning` decides the vLLM split, the batch layout, the backend and memory settings (pure);
* :mod:`grpo_launch.render` turns a plan into processes and files (pure);
* :mod:`grpo_launch.execute` places the processes with the backend and supervises them; the run directory's
  contract with them is :mod:`grpo_launch.rundir`, the programs started on each host :mod:`grpo_launch.node`.
"""

__version__ = "0.1.0"
