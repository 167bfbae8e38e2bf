"""Machines: the GPU table (:mod:`.gpus`) and the Topology a run is planned on (:mod:`.topology`), with the parser
for ``--gpus`` specs. Pure data."""
