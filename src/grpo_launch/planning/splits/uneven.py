"""Hosts with different GPU counts (a Ray cluster or hostfile of 4- and 2-GPU nodes): accelerate runs the same
number of trainers on every machine, so only server splits that leave equal training hosts are possible: whole
hosts of one count serve and the others train, or every host trains on as many GPUs as the smallest has and the
larger hosts' extra GPUs serve. Pure."""

from __future__ import annotations

from collections.abc import Sequence

from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.sizes import Parallelism
from grpo_launch.planning.splits.split import Split, SplitKind, server_shapes


def enumerate_uneven_splits(counts: Sequence[int], model: ModelShape | None) -> list[Split]:
    """The server splits of hosts with different GPU counts (``counts`` per host) that leave training hosts with
    equal counts: (1) the hosts of one count serve as whole hosts (TP within a host × DP over them) and every other
    host, all of one count, trains; (2) every host trains on as many GPUs as the smallest has, and the extra GPUs of
    the larger hosts (the same number on each) serve. Every GPU is used in both."""
    total, n, out = sum(counts), len(counts), []
    for c in sorted(set(counts)):
        serve = tuple(i for i in range(n) if counts[i] == c)
        train = tuple(i for i in range(n) if counts[i] != c)
        if len({counts[i] for i in train}) != 1:
            continue
        per = counts[train[0]]
        for t, d in server_shapes(model, c, c):
            out.append(Split(SplitKind.NODES, n, max(counts), per, train, Parallelism(t, dp=d * len(serve)), serve,
                             c, total_gpus=total))  # fmt: skip
    least = min(counts)
    bigger = tuple(i for i in range(n) if counts[i] > least)
    extra = {counts[i] - least for i in bigger}
    if len(extra) == 1:
        k = extra.pop()
        for t, d in server_shapes(model, k, k):
            par = Parallelism(t, dp=d * len(bigger))
            out.append(Split(SplitKind.SPREAD, n, max(counts), least, tuple(range(n)), par, bigger, k,
                             total_gpus=total))  # fmt: skip
    return out
