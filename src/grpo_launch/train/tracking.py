"""The trainer's side of the run's one tracking run (:mod:`grpo_launch.rundir.tracking` keeps its id and name): what
W&B keeps of an attempt, however the attempt ends.

W&B writes a run's records to its ``.wandb`` file (under ``WANDB_DIR``: ``wandb/offline-run-TIME-ID/run-ID.wandb``,
with ``WANDB_MODE=offline`` the only copy) through its service process, wandb-core. wandb-core holds them in memory
until a 32 KiB block fills, its flush timer fires (W&B's ``x_transaction_log_flush_interval``: every 15 s by default)
or the run finishes, and it never outlives the rank that started it: it asks the kernel for SIGKILL when its parent
dies, and a SIGTERM or SIGINT of its own stops it without writing (wandb-core's ``processlib.ShutdownOnParentExit``
and ``Server.ForceStop``). A rank ended by a signal runs no exit handler, so no ``wandb.finish``: torchrun's SIGTERM
to the other ranks when one fails, grpo-launch's teardown (which signals every process of the run, wandb-core too)
and the SIGKILL after the grace each lost up to 15 s of the attempt's history; a short attempt lost all of it (a
``.wandb`` file of 7 bytes, its header).

Finishing the run in a SIGTERM handler would not cover it: the teardown's signal stops wandb-core at the same moment,
and a Python handler does not run while the main thread waits in C (a NCCL or gloo collective after a peer's death),
which would keep a rank alive past SIGTERM until the SIGKILL. The flush timer is shortened instead: the file is
never more than :data:`FLUSH_S` behind, whichever way the rank and wandb-core end.
"""

from __future__ import annotations

from collections.abc import MutableMapping

# W&B's x_transaction_log_flush_interval, by its environment variable ("WANDB__" + the name without "x_"). A wandb
# without the setting ignores the variable (Settings.update_from_env_vars skips names it does not know).
FLUSH_ENV = "WANDB__TRANSACTION_LOG_FLUSH_INTERVAL"
FLUSH_S = 0.1  # seconds: a write of the new records, or of nothing, ten times a second


def tracking_defaults(environ: MutableMapping[str, str]) -> None:
    """W&B's file written every :data:`FLUSH_S` seconds, unless ``environ`` sets the interval already."""
    environ.setdefault(FLUSH_ENV, f"{FLUSH_S:g}")
