"""Models: the shape the planner works from (:mod:`.shape`), read from a config.json (:mod:`.config`) or the built-in
table (:mod:`.builtin`). Pure data."""
