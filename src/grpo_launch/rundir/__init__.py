"""The run directory: the contract between the launcher, the processes it starts and ``status``/``report``.
Standard library only (the training entry and the node programs import it): the layout (:mod:`.layout`: every
file name and environment name), the records written there (:mod:`.records`, plan.json's in :mod:`.plan_record`),
the run's one tracking run (:mod:`.tracking`), the lock and atomic writes (:mod:`.files`), the stop request
(:mod:`.control`), checkpoints, the command that started the run (:mod:`.invocation`), what a resume must keep
(:mod:`.same_run`), what may be trusted in it (:mod:`.trusted_files`) and how its text is shown (:mod:`.shown_text`).
What reads a run directory back (one view of it, its course by attempt, what it measured, the report) is
:mod:`grpo_launch.analysis`."""
