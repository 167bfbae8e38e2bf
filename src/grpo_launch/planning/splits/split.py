"""The splits: every way the GPUs may be divided between vLLM and the trainers. Pure.

A split is one of:

- **colocate**: every GPU trains, and each TP group of trainers also runs a vLLM engine (TRL's colocate mode); on
  fewer whole hosts when a fixed batch cannot use every host's trainers (:func:`.allowed.fewer_hosts`), the others
  idle;
- **server**: on one host, ``k`` of its GPUs run the vLLM server as TP × DP, the others train;
- **nodes**: ``j`` whole hosts run the server (TP within a host × DP over their GPUs; for ``j`` > 1 vLLM's
  multi-node data parallel: the first serving host runs the API server, the others run headless engines), the other
  hosts train;
- **spread**: every host gives ``k`` GPUs to one data-parallel server (TP × DP, its engines on every host, the API
  server on the first) and trains on the rest: no GPU idles, the same trainers on every machine;
- **shared**: every host gives ``k`` GPUs up, and the server runs on ``k`` GPUs of one host: accelerate runs the
  same number of trainers on every machine, so the other hosts' ``k`` GPUs idle (a split the search only picks
  when every use of those GPUs is slower, and says so);
- **off**: no vLLM, the trainers generate (CPU, ``use_vllm: false``).

Hosts with different GPU counts (a Ray cluster or hostfile of 4- and 2-GPU nodes): accelerate runs the same number
of trainers on every machine, so only server splits that leave equal training hosts are possible
(:func:`enumerate_uneven_splits`): whole hosts of one count serve and the others train, or every host trains on as
many GPUs as the smallest has and the larger hosts' extra GPUs serve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from grpo_launch.enums import StrEnum
from grpo_launch.models.shape import ModelShape
from grpo_launch.planning.cost.memory import vllm_weights
from grpo_launch.planning.parallel_and_batch import Parallelism
from grpo_launch.spec import frozen


class SplitKind(StrEnum):
    COLOCATE = "colocate"
    SERVER = "server"
    NODES = "nodes"
    SPREAD = "spread"
    SHARED = "shared"
    OFF = "off"


@frozen
class Split:
    """Which GPUs of which hosts serve and which train. Hosts are indices into the topology's hosts; a host serves
    its last ``server_gpus_per_host`` GPUs (all of them for ``nodes``)."""

    kind: SplitKind
    hosts: int  # hosts in the topology
    gpus_per_host: int
    trainers_per_host: int
    train_hosts: tuple[int, ...]
    # server: TP × PP per replica (PP only where no replica of TP alone fits), DP data-parallel ranks; colocate:
    # DP engines, one per TP group of trainers
    par: Parallelism = Parallelism()
    server_hosts: tuple[int, ...] = ()
    server_gpus_per_host: int = 0
    asynchronous: bool = False  # AsyncGRPOTrainer on this split: generation and training overlap (launch.mode)
    total_gpus: int = 0  # hosts with different GPU counts: all their GPUs (0: hosts × gpus_per_host)
    # A mixed cluster's split by GPU type: which type does what, in its label ("H20 serves, H100-80GB trains").
    types: str = ""

    @property
    def tp(self) -> int:
        return self.par.tp

    @property
    def dp(self) -> int:
        return self.par.dp

    @property
    def pp(self) -> int:
        return self.par.pp

    @property
    def gpus(self) -> int:
        return self.total_gpus or self.hosts * self.gpus_per_host

    @property
    def trainers(self) -> int:
        return self.trainers_per_host * len(self.train_hosts)

    @property
    def server_gpus(self) -> int:
        return self.server_gpus_per_host * len(self.server_hosts)

    @property
    def idle(self) -> int:
        if self.kind == SplitKind.COLOCATE:  # every GPU of its hosts; other hosts idle (one type of a mixed cluster)
            return self.gpus - self.trainers
        if self.kind == SplitKind.OFF:
            return 0
        return self.gpus - self.trainers - self.server_gpus

    @property
    def shape(self) -> str:
        return self.par.label

    @property
    def replica_hosts(self) -> int:
        """Hosts one replica spans (its pipeline stages on consecutive hosts); 1 within a host."""
        return max(1, self.tp * self.pp // max(1, self.server_gpus_per_host))

    @property
    def label(self) -> str:
        return (f"{self.types}: " if self.types else "") + self._where + (" · async" if self.asynchronous else "")

    @property
    def disjoint(self) -> bool:
        """The server and the trainers hold different GPUs (what AsyncGRPOTrainer needs)."""
        return self.kind not in (SplitKind.COLOCATE, SplitKind.OFF)

    @property
    def _where(self) -> str:
        if self.kind == SplitKind.COLOCATE and not self.types and len(self.train_hosts) < self.hosts:
            return f"colocate on {len(self.train_hosts)} of {self.hosts} hosts ({self.dp} engine(s) × TP {self.tp})"
        if self.kind == SplitKind.COLOCATE:
            return f"colocate ({self.dp} engine(s) × TP {self.tp})"
        if self.kind == SplitKind.OFF:
            return "no vLLM"
        if self.kind == SplitKind.NODES:
            return f"{len(self.server_hosts)} whole host(s) serve ({self.server_gpus} GPUs, {self.shape})"
        if self.kind == SplitKind.SPREAD and len(self.server_hosts) < self.hosts:
            return (
                f"server on the {self.server_gpus_per_host} extra GPU(s) of {len(self.server_hosts)} larger host(s) "
                f"({self.shape})"
            )
        if self.kind == SplitKind.SPREAD:
            return (
                f"server spread over {len(self.server_hosts)} hosts ({self.server_gpus_per_host} GPU(s) each, "
                f"{self.shape})"
            )
        where = f"server on {self.server_gpus} GPU(s) ({self.shape})"
        return where + (f", {self.idle} GPU(s) idle elsewhere" if self.idle else "")


def server_shapes(model: ModelShape | None, gpus: int, limit: int) -> list[tuple[int, int]]:
    """(TP, DP) ways to run a server on ``gpus`` GPUs with TP at most ``limit`` (one host): TP must shard the model
    (:meth:`ModelShape.tp_problems`) and divide the GPUs."""
    tps = model.valid_tp_sizes(min(gpus, limit)) if model else tuple(t for t in (1, 2, 4, 8) if t <= limit)
    return [(t, gpus // t) for t in tps if gpus % t == 0]


def served(model: ModelShape | None, split: Split) -> Parallelism:
    """The split's server parallelism as vLLM runs it: a mixture of experts with data parallelism spreads its
    experts over every server GPU (``--enable-expert-parallel``)."""
    return dataclasses.replace(split.par, ep=bool(model and model.is_moe and split.dp > 1))


def server_weights(model: ModelShape | None, split: Split) -> float:
    """bf16 weight bytes on each server GPU (experts spread over every GPU of a mixture of experts with DP)."""
    if model is None:
        return 0.0
    return vllm_weights(model, served(model, split))


def enumerate_splits(
    hosts: int, per_host: int, model: ModelShape | None, pipeline_tp: int | None = None
) -> list[Split]:
    """Every split of ``hosts`` × ``per_host`` GPUs, each server size with each TP × DP that shards the model, and
    with pipelines of the largest TP (or ``pipeline_tp``)."""
    everyone = tuple(range(hosts))
    out = [
        Split(SplitKind.COLOCATE, hosts, per_host, per_host, everyone, Parallelism(t, dp=hosts * per_host // t))
        for t, _ in server_shapes(model, per_host, per_host)
    ]
    if hosts == 1:
        for k in range(1, per_host):
            for t, d in server_shapes(model, k, per_host):
                out.append(Split(SplitKind.SERVER, 1, per_host, per_host - k, (0,), Parallelism(t, dp=d), (0,), k))
            for t, p, d in pipeline_shapes(model, k, per_host, pipeline_tp):
                out.append(Split(SplitKind.SERVER, 1, per_host, per_host - k, (0,), Parallelism(t, p, d), (0,), k))
        return out
    last = hosts - 1
    for j in serving_host_counts(hosts):
        # The last j hosts serve, the first API server on the first of them; the others train.
        train, serve = tuple(range(hosts - j)), tuple(range(hosts - j, hosts))
        for t, d in server_shapes(model, per_host, per_host):
            out.append(
                Split(SplitKind.NODES, hosts, per_host, per_host, train, Parallelism(t, dp=d * j), serve, per_host)
            )
        for t, p, d in pipeline_shapes(model, j * per_host, per_host, pipeline_tp):
            out.append(Split(SplitKind.NODES, hosts, per_host, per_host, train, Parallelism(t, p, d), serve, per_host))
    for k in range(1, per_host):
        for t, d in server_shapes(model, k, per_host):
            spread = Parallelism(t, dp=d * hosts)
            out.append(Split(SplitKind.SPREAD, hosts, per_host, per_host - k, everyone, spread, everyone, k))
            out.append(
                Split(SplitKind.SHARED, hosts, per_host, per_host - k, everyone, Parallelism(t, dp=d), (last,), k)
            )
    return out


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
            out.append(
                Split(
                    SplitKind.NODES,
                    n,
                    max(counts),
                    per,
                    train,
                    Parallelism(t, dp=d * len(serve)),
                    serve,
                    c,
                    total_gpus=total,
                )
            )
    least = min(counts)
    bigger = tuple(i for i in range(n) if counts[i] > least)
    extra = {counts[i] - least for i in bigger}
    if len(extra) == 1:
        k = extra.pop()
        for t, d in server_shapes(model, k, k):
            par = Parallelism(t, dp=d * len(bigger))
            out.append(
                Split(SplitKind.SPREAD, n, max(counts), least, tuple(range(n)), par, bigger, k, total_gpus=total)
            )
    return out


def enumerate_type_splits(counts: Sequence[int], types: Sequence[str], model: ModelShape | None) -> list[Split]:
    """A mixed cluster's splits by GPU type (``types`` per host, ``counts`` its GPUs): (1) every host of one type
    serves as whole hosts (TP within a host × DP over them) while every host of another type trains, the rest idle;
    (2) one type alone colocates (the others idle), so the cluster is never planned slower than a part of it.
    Trainers stay on one type (they step together: a faster GPU waits for the slowest); hosts of one type that
    differ in GPU count are left to the other splits."""
    n, total, out = len(counts), sum(counts), []
    order = list(dict.fromkeys(types))
    if len(order) < 2:
        return []
    of = {t: tuple(i for i in range(n) if types[i] == t) for t in order}
    even = {t: len({counts[i] for i in of[t]}) == 1 for t in order}
    for serve_type in order:
        serve = of[serve_type]
        if not even[serve_type]:
            continue
        per_serve = counts[serve[0]]
        for train_type in order:
            train = of[train_type]
            if train_type == serve_type or not even[train_type]:
                continue
            per_train = counts[train[0]]
            label = f"{serve_type} serves, {train_type} trains"
            for t, d in server_shapes(model, per_serve, per_serve):
                out.append(
                    Split(
                        SplitKind.NODES,
                        n,
                        max(counts),
                        per_train,
                        train,
                        Parallelism(t, dp=d * len(serve)),
                        serve,
                        per_serve,
                        total_gpus=total,
                        types=label,
                    )
                )
    for alone in order:
        hosts = of[alone]
        if not even[alone]:
            continue
        per = counts[hosts[0]]
        for t, _ in server_shapes(model, per, per):
            out.append(
                Split(
                    SplitKind.COLOCATE,
                    n,
                    max(counts),
                    per,
                    hosts,
                    Parallelism(t, dp=per * len(hosts) // t),
                    total_gpus=total,
                    types=f"{alone} alone",
                )
            )
    return out


def pipeline_shapes(
    model: ModelShape | None, gpus: int, per_host: int, tp: int | None = None
) -> list[tuple[int, int, int]]:
    """(TP, PP, DP) servers on ``gpus`` GPUs (one host's ``per_host`` or more) whose replicas are pipelines: the
    largest TP that shards the model, divides a host's GPUs and fits, times 2, 3, … stages, each replica within a
    host or over whole hosts (vLLM places a replica's ranks on consecutive hosts, ``--nnodes``). Only for a dense model:
    a mixture of experts spreads its experts over a data-parallel server instead. The split search keeps them only
    where no server of TP alone fits (:func:`grpo_launch.planning.splits.allowed.allowed_splits`): within a host TP
    reads the weights faster, and a pipeline adds its hops."""
    if model is None or model.is_moe:
        return []
    tps = [t for t in model.valid_tp_sizes(per_host) if per_host % t == 0 and t == (tp or t)]
    out: dict[int, tuple[int, int, int]] = {}
    for t in reversed(tps):  # each stage count with the largest TP that takes it
        for p in range(2, min(gpus // t, model.layers) + 1):
            r = t * p
            # within one host any replica that divides the GPUs; over hosts, replicas that tile the hosts
            if p not in out and gpus % r == 0 and (gpus <= per_host or per_host % r == 0 or r % per_host == 0):
                out[p] = (t, p, gpus // r)
    return sorted(out.values(), key=lambda s: s[1])


# Whole serving hosts tried on many nodes: every count up to 8, then about √2 apart (a 128-node search stays small).
def serving_host_counts(hosts: int) -> list[int]:
    counts, j = [], 1
    while j < hosts:
        counts.append(j)
        j = j + 1 if j < 8 else round(j * 1.41)
    return counts


def off_split(hosts: int, processes_per_host: int) -> Split:
    return Split(SplitKind.OFF, hosts, processes_per_host, processes_per_host, tuple(range(hosts)))
