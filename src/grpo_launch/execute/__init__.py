"""Execute: running a plan. :mod:`.run` prepares and supervises attempts with a backend, :mod:`.policy` decides what
follows a failed one, :mod:`.preflight` checks before anything starts, :mod:`.session` and :mod:`.supervisor` start,
watch and stop the processes, :mod:`.watchdog` reads progress and :mod:`.faults` finds the root cause."""
