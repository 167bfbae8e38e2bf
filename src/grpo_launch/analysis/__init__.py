"""What reads a run directory (the contract in grpo_launch.rundir): a run's view, its course by attempt,
its step means against the plan, its verdicts, the live metrics and the report."""
