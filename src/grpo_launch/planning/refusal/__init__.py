"""Refusals: the fixes a refused plan offers, each planned again before it is shown (:mod:`.verify`), and the
arithmetic behind a refusal (:mod:`.explain`). The more frugal plan after an out-of-memory failure is not a
refusal: it follows a run (:mod:`grpo_launch.planning.after_run.oom`)."""
