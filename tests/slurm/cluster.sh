#!/usr/bin/env bash
# A real Slurm cluster on this one machine, for gpuvisor's tests (root, Debian bookworm, no systemd).
#
#   cluster.sh up DIR --nodes 1|3 [--port-base P] [--timeout S]
#   cluster.sh down DIR
#
# up: installs slurmctld, slurmd, slurm-client and munge with apt-get when missing, starts munged
# when it is not running (making its key when missing), writes slurm.conf and gres.conf under DIR
# (each node gets gres gpu:2,shard:8 over fake /dev/nvidia0-1 character devices made under DIR/dev),
# starts the daemons and waits until sinfo shows every node idle. Then DIR/env holds the exports for
# clients (`. DIR/env; srun ...`): SLURM_CONF, GPUVISOR_SLURM_NODES, GPUVISOR_SLURM_CTL_ADDR.
#   --nodes 1: one node, NodeName=localhost, all daemons in this machine's network namespace.
#   --nodes 3: nodes n1..n3, each slurmd in its own network namespace /run/netns/nI (a veth into the
#     bridge br-slurm, address 10.213.0.1I/24, default route via the bridge) and its own UTS namespace
#     (hostname nI); the controller runs as host `ctl` at 10.213.0.1 on the bridge. ctl and n1..n3 are
#     added to /etc/hosts between marker lines. Tests run commands "on" node nI with
#     `nsenter --net=/run/netns/nI CMD` (e.g. `ip route del ...` to cut it off).
#   --port-base P: SlurmctldPort=P, SlurmdPort=P+1 (default 17817), so that a stale cluster cannot
#     collide with a new one.
# down: stops every daemon that up started (by pid file, checking the process name first; munged
# only if up started it), kills job steps and waiting srun clients of the cluster, deletes the
# namespaces (and whatever still runs in them), veths, bridge and /etc/hosts block. Idempotent; it
# also cleans what a crashed earlier `up` left (every DIR that up started is listed in
# /run/gpuvisor-slurm/dirs until its down). up runs that cleanup first too: the bridge, namespace
# names and addresses are fixed, so only one cluster runs at a time. Each up starts from an empty
# Slurm state (no jobs of an earlier cluster in the same DIR).
#
# Why nsenter and not `ip netns exec`: the latter remounts /sys in a new mount namespace, which hides
# /sys/fs/cgroup, and slurmd then fails to initialise. Why SlurmdParameters=config_overrides: each
# node claims CPUS (8) CPUs whatever the machine has, so tests can place several tasks per node.
set -euo pipefail

readonly SUBNET_PREFIX=10.213.0
readonly CTL_ADDR=$SUBNET_PREFIX.1
readonly BRIDGE=br-slurm
readonly HOSTS_BEGIN="# >>> gpuvisor slurm test cluster (tests/slurm/cluster.sh) >>>"
readonly HOSTS_END="# <<< gpuvisor slurm test cluster <<<"
readonly REGISTRY=/run/gpuvisor-slurm/dirs
readonly CPUS=8
# Present while a munged that up started runs (down stops it; a crashed run's is reused).
readonly MUNGED_OURS=/run/gpuvisor-slurm/munged.started

usage() {
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

log() { echo "cluster.sh: $*" >&2; }
die() { log "$*"; exit 1; }

node_addr() { echo "$SUBNET_PREFIX.1$1"; }

# --- installation and munge -------------------------------------------------------------------

install_packages() {
  local missing=()
  command -v slurmctld >/dev/null || missing+=(slurmctld)
  command -v slurmd >/dev/null || missing+=(slurmd)
  command -v srun >/dev/null || missing+=(slurm-client)
  command -v munged >/dev/null || missing+=(munge)
  command -v ip >/dev/null || missing+=(iproute2)
  command -v nsenter >/dev/null || missing+=(util-linux)
  [ ${#missing[@]} -eq 0 ] && return
  log "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

munge_works() { munge -n 2>/dev/null | unmunge >/dev/null 2>&1; }

start_munge() {
  munge_works && return
  if [ ! -s /etc/munge/munge.key ]; then
    log "creating the munge key"
    mkdir -p /etc/munge
    mungekey --create --keyfile /etc/munge/munge.key
  fi
  chown munge:munge /etc/munge /etc/munge/munge.key
  chmod 0700 /etc/munge
  chmod 0600 /etc/munge/munge.key
  mkdir -p /run/munge /var/lib/munge /var/log/munge
  chown munge:munge /run/munge /var/lib/munge /var/log/munge
  chmod 0755 /run/munge
  mkdir -p "$(dirname "$MUNGED_OURS")"
  # A munged that died leaves its socket lock behind; --force starts over it.
  runuser -u munge -- /usr/sbin/munged --force
  for _ in $(seq 50); do munge_works && { touch "$MUNGED_OURS"; return; }; sleep 0.1; done
  die "munged started but munge -n | unmunge still fails; hint: see /var/log/munge/munged.log"
}

# --- configuration ----------------------------------------------------------------------------

write_config() {
  local nodes=$1 port_base=$2 conf=$DIR/slurm.conf
  # A fresh cluster each time: a reused DIR's saved state would bring back its old jobs.
  rm -rf "$DIR"/{state,spool,run,log}
  mkdir -p "$DIR"/{state,spool,run,log,dev}
  for gpu in 0 1; do
    [ -c "$DIR/dev/nvidia$gpu" ] || mknod "$DIR/dev/nvidia$gpu" c 1 3
  done
  local ctl_host node_line part_nodes gres_nodes spool pid_file log_file
  if [ "$nodes" = 1 ]; then
    ctl_host=localhost
    node_line="NodeName=localhost CPUs=$CPUS RealMemory=1000 Gres=gpu:2,shard:8 State=UNKNOWN"
    part_nodes=localhost gres_nodes=localhost
    spool=$DIR/spool pid_file=$DIR/run/slurmd.pid log_file=$DIR/log/slurmd.log
  else
    local addrs=()
    for i in $(seq "$nodes"); do addrs+=("$(node_addr "$i")"); done
    ctl_host="ctl($CTL_ADDR)"
    node_line="NodeName=n[1-$nodes] NodeAddr=$(IFS=,; echo "${addrs[*]}") CPUs=$CPUS RealMemory=1000 Gres=gpu:2,shard:8 State=UNKNOWN"
    part_nodes="n[1-$nodes]" gres_nodes="n[1-$nodes]"
    spool=$DIR/spool/%n pid_file=$DIR/run/slurmd-%n.pid log_file=$DIR/log/slurmd-%n.log
  fi
  cat >"$conf" <<EOF
# Written by tests/slurm/cluster.sh up $DIR --nodes $nodes --port-base $port_base
ClusterName=gpuvisortest
SlurmctldHost=$ctl_host
SlurmctldPort=$port_base
SlurmdPort=$((port_base + 1))
SlurmUser=root
AuthType=auth/munge
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$spool
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$pid_file
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$log_file
SlurmdParameters=config_overrides
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
GresTypes=gpu,shard
ReturnToService=2
MpiDefault=none
# Quick to notice a dead node, quick to start a job.
SlurmdTimeout=30
MessageTimeout=10
InactiveLimit=0
KillWait=2
$node_line
PartitionName=debug Nodes=$part_nodes Default=YES MaxTime=INFINITE State=UP
EOF
  cat >"$DIR/gres.conf" <<EOF
AutoDetect=off
NodeName=$gres_nodes Name=gpu File=$DIR/dev/nvidia[0-1]
NodeName=$gres_nodes Name=shard Count=8 File=$DIR/dev/nvidia[0-1]
EOF
  local names
  if [ "$nodes" = 1 ]; then names=localhost; else names=$(for i in $(seq "$nodes"); do printf 'n%s ' "$i"; done); fi
  cat >"$DIR/env" <<EOF
export SLURM_CONF=$conf
export GPUVISOR_SLURM_NODES="${names% }"
export GPUVISOR_SLURM_CTL_ADDR=$([ "$nodes" = 1 ] && echo 127.0.0.1 || echo "$CTL_ADDR")
EOF
  echo "$nodes" >"$DIR/nodes"
}

# --- network namespaces -----------------------------------------------------------------------

hosts_remove_block() {
  grep -qF "$HOSTS_BEGIN" /etc/hosts 2>/dev/null || return 0
  local kept
  kept=$(awk -v b="$HOSTS_BEGIN" -v e="$HOSTS_END" '$0==b{skip=1;next} $0==e{skip=0;next} !skip' /etc/hosts)
  # Rewrite in place (not sed -i's rename): /etc/hosts is often a bind mount in containers.
  printf '%s\n' "$kept" >/etc/hosts
}

network_up() {
  local nodes=$1
  ip link add "$BRIDGE" type bridge
  ip addr add "$CTL_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq "$nodes"); do
    ip netns add "n$i"
    ip link add "vs-n$i" type veth peer name "vs-n$i-in"
    ip link set "vs-n$i" master "$BRIDGE" up
    ip link set "vs-n$i-in" netns "n$i"
    ip -n "n$i" link set "vs-n$i-in" name eth0
    ip -n "n$i" addr add "$(node_addr "$i")/24" dev eth0
    ip -n "n$i" link set lo up
    ip -n "n$i" link set eth0 up
    ip -n "n$i" route add default via "$CTL_ADDR"
  done
  hosts_remove_block
  {
    echo "$HOSTS_BEGIN"
    echo "$CTL_ADDR ctl"
    for i in $(seq "$nodes"); do echo "$(node_addr "$i") n$i"; done
    echo "$HOSTS_END"
  } >>/etc/hosts
}

network_down() {
  for i in 1 2 3; do
    # Whatever still runs on the node (job steps, a test's processes) goes with it.
    local pids
    pids=$(ip netns pids "n$i" 2>/dev/null || true)
    [ -z "$pids" ] || kill -KILL $pids 2>/dev/null || true
    ip netns del "n$i" 2>/dev/null || true # takes its veth pair along
    ip link del "vs-n$i" 2>/dev/null || true
  done
  ip link del "$BRIDGE" 2>/dev/null || true
  hosts_remove_block
}

# --- daemons ----------------------------------------------------------------------------------

# Prints the pid in pid file $1 if that process is named $2 (a reused pid is left alone), and
# removes the file.
pid_if_named() {
  local file=$1 name=$2 pid
  [ -s "$file" ] || { rm -f "$file"; return 0; }
  pid=$(tr -dc 0-9 <"$file")
  if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ]; then echo "$pid"; fi
  rm -f "$file"
}

descendants() {
  local child
  for child in $(pgrep -P "$1" 2>/dev/null || true); do
    echo "$child"
    descendants "$child"
  done
}

# TERM to all the pids given at once (each daemon takes a second or two to exit), KILL after 5 s.
stop_pids() {
  [ $# -gt 0 ] || return 0
  kill -TERM "$@" 2>/dev/null || true
  for _ in $(seq 50); do
    local alive=0
    for pid in "$@"; do [ -d "/proc/$pid" ] && alive=1; done
    [ $alive = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

daemons_down() {
  local dir=$1 pids=()
  for file in "$dir"/run/slurmd*.pid; do
    [ -e "$file" ] && pids+=($(pid_if_named "$file" slurmd))
  done
  pids+=($(pid_if_named "$dir/run/slurmctld.pid" slurmctld))
  # The daemons work in DIR/log, and so do their job steps (slurmstepd), which outlive slurmd:
  # found that way too when pid files are gone (DIR removed by hand). Steps and the tasks under
  # them are killed outright.
  for name in slurmctld slurmd slurmstepd; do
    for pid in $(pgrep -x "$name" 2>/dev/null || true); do
      case $(readlink "/proc/$pid/cwd" 2>/dev/null) in
        "$dir"/*)
          if [ "$name" = slurmstepd ]; then
            kill -KILL $(descendants "$pid") "$pid" 2>/dev/null || true
          else
            pids+=("$pid")
          fi
          ;;
      esac
    done
  done
  # Clients left waiting on this cluster (started with its SLURM_CONF) go too; srun takes a
  # first TERM as "terminate the job" and waits, so KILL.
  for pid in $(pgrep -x 'srun|salloc|sbatch|sattach' 2>/dev/null || true); do
    if { tr '\0' '\n' <"/proc/$pid/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$dir/slurm.conf"; then
      kill -KILL "$pid" 2>/dev/null || true
    fi
  done
  stop_pids "${pids[@]}"
}

daemons_up() {
  local nodes=$1 conf=$DIR/slurm.conf
  if [ "$nodes" = 1 ]; then
    # slurmctld starts only where its hostname matches SlurmctldHost.
    unshare --uts sh -c "hostname localhost; exec slurmctld -f '$conf'"
    slurmd -f "$conf" -N localhost
  else
    unshare --uts sh -c "hostname ctl; exec slurmctld -f '$conf'"
    for i in $(seq "$nodes"); do
      nsenter --net="/run/netns/n$i" unshare --uts sh -c "hostname n$i; exec slurmd -f '$conf' -N n$i"
    done
  fi
}

tails() {
  for file in "$DIR"/log/*.log; do
    [ -e "$file" ] || continue
    echo "--- tail $file" >&2
    tail -n 25 "$file" >&2
  done
}

wait_idle() {
  local nodes=$1 timeout=$2 states=""
  local deadline=$((SECONDS + timeout))
  while [ $SECONDS -lt $deadline ]; do
    states=$(SLURM_CONF=$DIR/slurm.conf sinfo -h -N -o '%N %t' 2>&1 || true)
    if [ "$(grep -cE ' idle$' <<<"$states")" = "$nodes" ]; then return 0; fi
    sleep 0.2
  done
  log "the nodes are not all idle after ${timeout}s; sinfo says:"
  echo "$states" >&2
  tails
  log "hint: the daemons' logs are under $DIR/log; run 'cluster.sh down $DIR' before retrying"
  return 1
}

# --- registry of DIRs that up started (for cleaning after a crash) ----------------------------

registry_add() { mkdir -p "$(dirname "$REGISTRY")"; echo "$1" >>"$REGISTRY"; }
registry_remove() {
  [ -e "$REGISTRY" ] || return 0
  local kept
  kept=$(grep -vxF "$1" "$REGISTRY" || true)
  printf '%s\n' "$kept" | sed '/^$/d' >"$REGISTRY"
}

clean_all() {
  if [ -e "$REGISTRY" ]; then
    while IFS= read -r dir; do
      [ -n "$dir" ] || continue
      daemons_down "$dir"
      registry_remove "$dir"
    done <"$REGISTRY"
  fi
  network_down
}

# --- commands ---------------------------------------------------------------------------------

cmd_up() {
  local nodes="" port_base=17817 timeout=60
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:?}; shift 2 ;;
      --port-base) port_base=${2:?}; shift 2 ;;
      --timeout) timeout=${2:?}; shift 2 ;;
      *) usage ;;
    esac
  done
  case $nodes in 1 | 3) ;; *) die "--nodes must be 1 or 3, not '$nodes'" ;; esac
  [ "$(id -u)" = 0 ] || die "must run as root (namespaces, /etc/hosts, apt-get); uid is $(id -u)"
  local start=$SECONDS
  install_packages
  clean_all
  mkdir -p "$DIR"
  chmod 0755 "$DIR"
  write_config "$nodes" "$port_base"
  registry_add "$DIR"
  start_munge
  [ "$nodes" = 1 ] || network_up "$nodes"
  daemons_up "$nodes" || { tails; die "a daemon did not start; hint: see the logs above"; }
  wait_idle "$nodes" "$timeout"
  log "up: $nodes node(s) idle in $((SECONDS - start))s; . $DIR/env"
}

cmd_down() {
  daemons_down "$DIR"
  registry_remove "$DIR"
  clean_all
  if [ -e "$MUNGED_OURS" ]; then
    stop_pids $(pid_if_named /run/munge/munged.pid munged)
    rm -f "$MUNGED_OURS"
  fi
}

[ $# -ge 2 ] || usage
command=$1 DIR=$2
shift 2
case $DIR in /*) ;; *) DIR=$PWD/$DIR ;; esac
DIR=${DIR%/}
case $command in
  up) cmd_up "$@" ;;
  down) [ $# -eq 0 ] || usage; cmd_down ;;
  *) usage ;;
esac
