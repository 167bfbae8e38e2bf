#!/usr/bin/env bash
# System packages for the multi-node tests: Debian's slurm-wlm (a private Slurm cluster, scripts/slurm_cluster.sh)
# and openssh-server + pdsh (sshd hosts in network namespaces, scripts/ssh_hosts.sh), and chromium (the run
# report is read in a headless browser by tests/test_report.py), prometheus (a real server scrapes a run's metrics
# endpoint, tests/test_watch_live.py) and tmux (`status --watch` read in a real terminal). Idempotent; ~1 min when missing. Needs root (CI runs as root); prints what to do otherwise and exits 1.
set -euo pipefail
need=()
command -v slurmctld >/dev/null || need+=(slurm-wlm munge)
command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v pdsh >/dev/null || need+=(pdsh)
command -v ip >/dev/null || need+=(iproute2)
command -v nsenter >/dev/null || need+=(util-linux)
command -v chromium >/dev/null || need+=(chromium)  # the run report's headless-browser test
command -v prometheus >/dev/null || need+=(prometheus)  # scrapes a live run's metrics endpoint
command -v tmux >/dev/null || need+=(tmux)  # status --watch in a real terminal
if [ ${#need[@]} -eq 0 ]; then
  echo "system packages: slurm-wlm, openssh-server, pdsh, chromium, prometheus, tmux present"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "system packages missing (${need[*]}); run as root: apt-get install -y ${need[*]}" >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
echo "system packages: installed ${need[*]}"
