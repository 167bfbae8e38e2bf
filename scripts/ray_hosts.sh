#!/usr/bin/env bash
# A real Ray cluster for the Ray backend's tests: the head on this machine at the hosts' bridge address (no GPU, no
# CPU to give: it hosts none of the run's processes) and one worker node in each network-namespace host h1..hN of
# scripts/ssh_hosts.sh (own address, hostname and sshd; the file system is shared). GPUs are fake: each worker is
# started with --num-gpus G and PYTHONPATH=STANDIN, a directory holding a pynvml stand-in whose nvmlDeviceGetCount
# reads GRPO_TEST_GPUS (set to G on that node), so the launcher's NVML probe sees G GPUs there.
#
#   scripts/ray_hosts.sh start DIR GPUS...   one worker per GPUS entry (0 = a CPU node), e.g. `start DIR 4 2`
#                                            head GCS at 10.77.0.1:6390, dashboard at http://10.77.0.1:8290
#   scripts/ray_hosts.sh stop DIR            stop every Ray node and the hosts
# Environment: RAY (the ray CLI, default .venv/bin/ray), STANDIN (default DIR/standin), RAY_EXTRA_ENV (more
# VAR=VALUE words for every node).
set -euo pipefail
action=${1:?usage: ray_hosts.sh start DIR GPUS... | stop DIR}
DIR=$(realpath -m "${2:?usage: ray_hosts.sh start DIR GPUS... | stop DIR}")
shift 2
ROOT=$(cd "$(dirname "$0")/.." && pwd)
RAY=${RAY:-$ROOT/.venv/bin/ray}
HEAD=10.77.0.1
PORT=6390
# Short node-failure detection for the tests (Ray's defaults take about 30 s to declare a node dead).
# RAY_enable_metrics_collection=0: no node serves Ray's Prometheus metrics on every interface (as the SkyPilot task's
# Ray: backends/skypilot/task.py, RAY_NODE_ENV); the head's dashboard and autoscaler exporters stay (Ray has no switch).
NODE_ENV="GRPO_RAY_CLUSTER=$DIR RAY_USAGE_STATS_ENABLED=0 RAY_enable_metrics_collection=0 RAY_health_check_period_ms=1000 RAY_health_check_failure_threshold=5 ${RAY_EXTRA_ENV:-}"

# Kill the processes of a test cluster: those whose environment has a line matching $1 (every node of a cluster
# started here carries GRPO_RAY_CLUSTER=DIR; a plain `ray stop` would stop every Ray on the machine).
kill_marked() {
  for p in /proc/[0-9]*; do
    if { tr '\0' '\n' <"$p/environ"; } 2>/dev/null | grep -qx -- "$1"; then
      kill -KILL "${p#/proc/}" 2>/dev/null || true
    fi
  done
}

stop() {
  kill_marked "GRPO_RAY_CLUSTER=$DIR"
  bash "$ROOT/scripts/ssh_hosts.sh" stop "$DIR/hosts" >/dev/null 2>&1 || true
  t=$(readlink "$DIR/ray-tmp" 2>/dev/null || true)
  case "$t" in /tmp/rayc.*) rm -rf "$t" ;; esac
  rm -f "$DIR/ray-tmp"
}

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || { echo "usage: ray_hosts.sh start DIR GPUS... | stop DIR" >&2; exit 2; }
[ $# -ge 1 ] || { echo "usage: ray_hosts.sh start DIR GPUS..." >&2; exit 2; }
stop
kill_marked "GRPO_RAY_CLUSTER=.*"  # a test cluster left by a killed run (same ports)
mkdir -p "$DIR"
STANDIN=${STANDIN:-$DIR/standin}
bash "$ROOT/scripts/ssh_hosts.sh" start "$DIR/hosts" "$#" >/dev/null
# Short temp dirs: Ray's unix socket paths must stay under 107 characters.
tmp=$(mktemp -d /tmp/rayc.XXXXXX)
ln -sfn "$tmp" "$DIR/ray-tmp"
env $NODE_ENV "$RAY" start --head --node-ip-address "$HEAD" --port "$PORT" --num-cpus 0 --num-gpus 0 \
  --dashboard-host "$HEAD" --dashboard-port 8290 --temp-dir "$tmp/head" --disable-usage-stats \
  >"$DIR/ray-head.log" 2>&1 || { cat "$DIR/ray-head.log" >&2; stop; exit 1; }
i=0
for gpus in "$@"; do
  i=$((i + 1))
  ssh -F "$DIR/hosts/ssh_config" "h$i" "cd $ROOT && env $NODE_ENV PYTHONPATH=$STANDIN GRPO_TEST_GPUS=$gpus \
    $RAY start --address $HEAD:$PORT --node-ip-address 10.77.0.$((10 + i)) --num-gpus $gpus --num-cpus 2 \
    --temp-dir $tmp/h$i --disable-usage-stats" >"$DIR/ray-h$i.log" 2>&1 &
done
wait
for _ in $(seq 1 100); do
  alive=$("$ROOT/.venv/bin/python" - "$HEAD:$PORT" <<'PY' 2>/dev/null || echo 0
import sys, ray
ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
print(sum(1 for n in ray.nodes() if n["Alive"]))
PY
)
  [ "$alive" = $(($# + 1)) ] && { echo "ray cluster up: head $HEAD:$PORT, workers h1..h$#"; exit 0; }
  sleep 0.5
done
echo "the Ray nodes did not all join:" >&2
tail -n 5 "$DIR"/ray-*.log >&2 || true
stop
exit 1
