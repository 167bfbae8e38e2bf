#!/usr/bin/env bash
# Separate "hosts" for the hostfile tests: network namespaces h1..hN on a private bridge (10.77.0.0/24, used only
# between the namespaces made here), each with its own hostname (UTS namespace) and sshd on port 2222. The file
# system is shared, like a cluster's shared home. Needs root, iproute2 and openssh-server
# (scripts/install_system_packages.sh).
#
#   scripts/ssh_hosts.sh start DIR [N]   create N hosts (default 3): DIR/id_ed25519 logs in as root on each;
#                                        DIR/ssh_config is a client config; names h1..hN go into /etc/hosts
#   scripts/ssh_hosts.sh stop DIR        stop sshd and every process left in the namespaces, remove them
set -euo pipefail
action=${1:?usage: ssh_hosts.sh start|stop DIR [N]}
DIR=$(realpath -m "${2:?usage: ssh_hosts.sh start|stop DIR [N]}")
N=${3:-3}
BRIDGE=grpobr0
NET=10.77.0
MARK="# grpo-launch test host"

stop() {
  for f in "$DIR"/sshd-*.pid.launcher; do
    [ -e "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null || true
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep '^grpo-h' || true); do
    pids=$(ip netns pids "$ns" 2>/dev/null || true)
    [ -n "$pids" ] && kill -KILL $pids 2>/dev/null || true
    ip netns del "$ns" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  if grep -q "$MARK" /etc/hosts 2>/dev/null; then
    grep -v "$MARK" /etc/hosts >/tmp/hosts.grpo.$$ && cat /tmp/hosts.grpo.$$ >/etc/hosts && rm -f /tmp/hosts.grpo.$$
  fi
  rm -f "$DIR"/sshd-*.pid.launcher
}

if [ "$action" = stop ]; then stop; exit 0; fi
[ "$action" = start ] || { echo "usage: ssh_hosts.sh start|stop DIR [N]" >&2; exit 2; }
SSHD=$(command -v sshd || echo /usr/sbin/sshd)
[ -x "$SSHD" ] || { echo "sshd not found: run scripts/install_system_packages.sh" >&2; exit 1; }

stop
mkdir -p "$DIR" /run/sshd
[ -f "$DIR/id_ed25519" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/id_ed25519"
[ -f "$DIR/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$DIR/host_key"
cp "$DIR/id_ed25519.pub" "$DIR/authorized_keys"
: >"$DIR/known_hosts"

ip link add "$BRIDGE" type bridge
ip addr add "$NET.1/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
cat >"$DIR/ssh_config" <<CONF
Host h*
  User root
  Port 2222
  IdentityFile $DIR/id_ed25519
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile $DIR/known_hosts
  BatchMode yes
  ConnectTimeout 5
  LogLevel ERROR
CONF
for i in $(seq 1 "$N"); do
  ns=grpo-h$i
  addr=$NET.$((10 + i))
  ip netns add "$ns"
  ip link add "veth-h$i" type veth peer name eth0 netns "$ns"
  ip link set "veth-h$i" master "$BRIDGE" up
  ip netns exec "$ns" ip addr add "$addr/24" dev eth0
  ip netns exec "$ns" ip link set eth0 up
  ip netns exec "$ns" ip link set lo up
  cat >"$DIR/sshd_config.h$i" <<CONF
Port 2222
ListenAddress $addr
HostKey $DIR/host_key
AuthorizedKeysFile $DIR/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PidFile $DIR/sshd-h$i.pid
LogLevel ERROR
CONF
  echo "$addr h$i $MARK" >>/etc/hosts
  ip netns exec "$ns" unshare --uts sh -c "hostname h$i; exec $SSHD -D -e -f $DIR/sshd_config.h$i" \
    >"$DIR/sshd-h$i.log" 2>&1 &
  echo $! >"$DIR/sshd-h$i.pid.launcher"
done
for i in $(seq 1 "$N"); do
  ok=0
  for _ in $(seq 1 100); do
    if ssh -F "$DIR/ssh_config" "h$i" true 2>/dev/null; then ok=1; break; fi
    sleep 0.2
  done
  if [ "$ok" != 1 ]; then
    echo "host h$i did not accept ssh within 20 s; log:" >&2
    cat "$DIR/sshd-h$i.log" >&2 || true
    stop
    exit 1
  fi
done
echo "ssh hosts up: $(seq -s ' ' -f 'h%g' 1 "$N") (ssh -F $DIR/ssh_config h1)"
