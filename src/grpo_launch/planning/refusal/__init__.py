"""Refusals: the fixes a refused plan offers, each planned again before it is shown (:mod:`.verify`), the
arithmetic behind a refusal (:mod:`.explain`), and the next, more frugal plan after an out-of-memory failure
(:mod:`.after_oom`)."""
