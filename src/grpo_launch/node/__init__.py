"""Programs started on every host with ``python -m``: the process shim (:mod:`.shim`), the guard and marker sweep
(:mod:`.reaper`) and the host's report (:mod:`.host_report`). Standard library and the run-directory contract only
(the report reads NVML through :mod:`grpo_launch.probe.local`): they must start fast."""
