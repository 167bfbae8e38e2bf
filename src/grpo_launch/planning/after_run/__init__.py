"""What follows an attempt, decided with the planner: launch.adapt's decision after a layout's warm-up
(:mod:`.adapt`), the course of re-splits it steers from layout to layout (:mod:`.adapt`), and the more
frugal plan after an out-of-memory failure (:mod:`.oom`). Pure. Each re-plans with
:func:`~grpo_launch.planning.planner.make_plan`, so this folder sits above the rest of planning/: it imports any
of it, and no other planning module imports it (tests/test_architecture.py); execute/ acts on what it decides."""
