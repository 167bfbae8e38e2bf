"""The cost model: every memory and time term of a GRPO step, from constants with sources (:mod:`.constants`).
Pure arithmetic."""
