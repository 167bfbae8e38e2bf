"""Probe: the I/O edge of planning. Reads this machine (:mod:`.local`), other hosts' reports (:mod:`.hosts`), the
model's shape (:mod:`.model`), the recipe's local inputs (:mod:`.dataset`) and the Pythons a run uses
(:mod:`.pythons`). Backends probe their own machines with these."""
