"""The run directory: the contract between the launcher, the processes it starts and ``status``/``report``.
Standard library only (the training entry and the node programs import it): the layout (:mod:`.layout`: every
file name and environment name), the records written there (:mod:`.records`, plan.json's in :mod:`.plan_record`),
one view of a run directory read once (:mod:`.view`; its course attempt by attempt: :mod:`.course`), the run's one
tracking run (:mod:`.tracking`), the lock and atomic writes (:mod:`.files`), the stop request (:mod:`.control`),
checkpoints, the command that started the run (:mod:`.invocation`) and what a resume must keep (:mod:`.continuity`),
what a run measured, and the report."""
