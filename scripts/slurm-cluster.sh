#!/usr/bin/env bash
# A throwaway SLURM cluster on this machine, for the tests and for trying the SLURM
# profile: Debian's slurm-wlm + munge, everything (config, state, logs, munge key and
# socket) under one directory of the project. Needs root.
set -euo pipefail

usage() {
    cat <<'EOF'
Usage: scripts/slurm-cluster.sh COMMAND [OPTIONS]

Starts and stops a private SLURM cluster on this machine (Debian's slurm-wlm and
munge, run as root; the system's munge/slurm services are not used). Outside the
cluster directory it only adds the link /run/slurm/conf and, in two-node mode,
network namespaces, veth pairs, a bridge and two /etc/hosts lines; `down` removes
all of them again.

Commands:
  up [--nodes 1|2] [--emulate alpha]
                    start the cluster (default: 1 node) and wait until its nodes are
                    idle. Idempotent: when it is already up in the same mode it only
                    checks; when it is up in another mode it is restarted. Another
                    cluster of this script (another HVD_SLURM_DIR, with its own
                    HVD_SLURM_CTLD_PORT) can run beside it: see "Several clusters".
                    --emulate alpha (two nodes only) declares thesis-like GPU nodes:
                    see "Emulated partition" below.
  down              cancel every job, stop all daemons of this cluster, remove the
                    two-node network. Fine when already down. Logs are kept.
  status            daemons, nodes and jobs. Exit 0: up, 1: partly up, 3: down.
  env               print `export` lines for the cluster's client commands:
                      eval "$(scripts/slurm-cluster.sh env)"; sinfo; sbatch ...
  -h, --help        this help

Modes:
  1 node   one slurmd on localhost (node name = short hostname, NodeAddr 127.0.0.1)
           with all CPUs (nproc) and RealMemory = MemTotal - headroom.
  2 nodes  slurmd "node1" and "node2", each in its own network namespace
           (hvd-node1/hvd-node2, veth pairs on bridge hvdbr0, 10.213.0.0/24 by
           default: node1=.11, node2=.12, slurmctld=.1) and its own UTS namespace
           (so `hostname` says node1/node2), 1 CPU and half the memory each; their
           names are added to /etc/hosts. A job with --ntasks-per-node=1 -n 2 spans
           both and its ranks talk over the veths. slurmctld and munged stay in the
           root namespace (the munge socket is a path, reachable from every netns).
           The filesystem (/tmp included) is shared by both "nodes", like a
           cluster's shared filesystem. Implementation notes: slurmd is started
           with `nsenter --net` + `unshare --uts`, not `ip netns exec` (which
           remounts /sys and hides /sys/fs/cgroup: "slurmd: error: No filesystem
           mounted on /sys/fs/cgroup ... slurmd initialization failed"); TmpFS is
           per node, else the PMIx plugin's spmix_appdir_* dirs collide ("Cannot
           create directory ... File exists"). Debian's slurmd needs no
           --enable-multiple-slurmd this way.

Emulated partition (--nodes 2 --emulate alpha; issue 12):
           node1 and node2 are declared as Taurus "alpha" nodes, the partition
           alpha of config/thesis.yaml: Gres=gpu:a100:8 (typed, as a site declares
           its A100s), CPUs=48, RealMemory=990000 per node (override with
           HVD_SLURM_EMULATE_GPUS/_GPU_TYPE/_CPUS/_MEM_MB), accepted by
           slurmd through SlurmdParameters=config_overrides. The GPUs are gres
           entries whose File= are character devices made with
           `mknod <dir>/dev/nvidiaN c 1 3` (SLURM rejects regular files: "not a
           valid character or block device"); there is no GPU behind them, so
           training runs on the CPU and says so in its run record, while SLURM
           places and binds them as on the real cluster (srun --gpus-per-task=1
           gives every rank its own CUDA_VISIBLE_DEVICES). Partitions: local
           (default) and alpha, both over node1 and node2.

Several clusters (issue 29):
           each HVD_SLURM_DIR is its own Slurm instance: own munged (key, socket),
           slurmctld (HVD_SLURM_CTLD_PORT, state), slurmd (port + 1), ClusterName
           (HVD_SLURM_CLUSTER_NAME), partition and node name; neither sees the other's
           jobs. Clients reach one through its SLURM_CONF (`env`), like a user on that
           cluster's login node. Every slurmd runs in a mount namespace of its own in
           which the cluster's etc/ is bind-mounted on /etc/slurm, so `srun` inside
           its jobs (the Snakemake plugin's job step drops SLURM_CONF) reads that
           cluster's slurm.conf; the host's /etc/slurm is not touched (created empty
           if missing). Only the first cluster up gets the /run/slurm/conf link. Two-node
           mode is one cluster at a time (one bridge, fixed names node1/node2): `up
           --nodes 2` refuses while another cluster holds the network. E.g. a second
           one-node cluster beside the default one:
             HVD_SLURM_DIR=/tmp/hvd-b HVD_SLURM_CTLD_PORT=6941 HVD_SLURM_PARTITION=bpart \
             HVD_SLURM_CLUSTER_NAME=clusterb HVD_SLURM_NODE_NAME=bnode scripts/slurm-cluster.sh up

Cluster:    ClusterName=hvdlocal, partition `local` (Default=YES), MinJobAge=600
            (so `squeue` can report finished jobs; no slurmdbd, no sacct),
            select/cons_tres with CR_Core_Memory, DefMemPerCPU=1024,
            proctrack/linuxproc, task/none, srun --mpi=pmix available.

Files (under the cluster directory):
  etc/slurm.conf  munge/munge.key  run/munge.socket.2  ctld/  nodes/<node>/  env.sh
Outside it, while up: /run/slurm/conf -> <cluster dir>/etc (the default config
location of SLURM clients; needed because the Snakemake plugin's job step drops
SLURM_CONF before it calls srun inside a job). Left alone if it exists already.

Environment:
  HVD_SLURM_DIR          cluster directory (default: <project>/.slurm-local)
  HVD_SLURM_PARTITION    partition name (default: local)
  HVD_SLURM_CTLD_PORT    slurmctld port (default 6917; slurmd uses port + 1)
  HVD_SLURM_CLUSTER_NAME ClusterName (default: hvdlocal)
  HVD_SLURM_NODE_NAME    node name of one-node mode (default: the short hostname)
  HVD_SLURM_SUBNET       first three octets of the private /24 of two-node mode
                         (default 10.213.0); used only on the veths created here
  HVD_SLURM_MEM_HEADROOM_MB  memory left to the machine (default 2048)
  HVD_SLURM_TIMEOUT      seconds to wait for daemons/nodes (default 60)
  HVD_SLURM_EMULATE_GPUS / HVD_SLURM_EMULATE_GPU_TYPE / HVD_SLURM_EMULATE_CPUS /
  HVD_SLURM_EMULATE_MEM_MB
                         per-node hardware of --emulate alpha (8 / a100 / 48 / 990000)

Requires: root; Debian packages slurm-wlm munge (and iproute2 util-linux for
--nodes 2). Missing packages are named with the exact apt-get line.
EOF
}

# --------------------------------------------------------------------------- settings
PROJECT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="$(realpath -m "${HVD_SLURM_DIR:-$PROJECT/.slurm-local}")"
PARTITION="${HVD_SLURM_PARTITION:-local}"
CTLD_PORT="${HVD_SLURM_CTLD_PORT:-6917}"
SLURMD_PORT=$((CTLD_PORT + 1))
SUBNET="${HVD_SLURM_SUBNET:-10.213.0}"
HEADROOM_MB="${HVD_SLURM_MEM_HEADROOM_MB:-2048}"
TIMEOUT="${HVD_SLURM_TIMEOUT:-60}"
CLUSTER_NAME="${HVD_SLURM_CLUSTER_NAME:-hvdlocal}"
NODE_NAME="${HVD_SLURM_NODE_NAME:-$(hostname -s)}"
# the first line of every slurm.conf written here (how another cluster's is recognised)
CONF_MARK="# Generated by scripts/slurm-cluster.sh"
BRIDGE=hvdbr0
HOSTS_MARK="# hvdscale-slurm-local"
# issue 12: emulated thesis partition (--emulate alpha)
EMU_GPUS="${HVD_SLURM_EMULATE_GPUS:-8}"
EMU_GPU_TYPE="${HVD_SLURM_EMULATE_GPU_TYPE:-a100}"
EMU_CPUS="${HVD_SLURM_EMULATE_CPUS:-48}"
EMU_MEM_MB="${HVD_SLURM_EMULATE_MEM_MB:-990000}"

CONF="$DIR/etc/slurm.conf"
MUNGE_KEY="$DIR/munge/munge.key"
MUNGE_SOCKET="$DIR/run/munge.socket.2"
MUNGE_PID="$DIR/run/munged.pid"
CTLD_PID="$DIR/run/slurmctld.pid"
MODE_FILE="$DIR/run/mode"
LOCK_FILE="$DIR/.lock"
# Where SLURM clients look for slurm.conf when SLURM_CONF is unset (after
# /etc/slurm/slurm.conf): the configless-client location of Slurm >= 21.08.
RUN_CONF_LINK=/run/slurm/conf

log() { printf '[slurm-cluster] %s\n' "$*"; }
die() { printf '[slurm-cluster] error: %s\n' "$*" >&2; exit 1; }

# --------------------------------------------------------------------------- checks
require_root() {
    [[ "$(id -u)" -eq 0 ]] || die "must run as root (slurmd, munged and network namespaces need it); try: sudo $0 $*"
}

require_packages() {
    local nodes="$1" missing=() cmd pkg
    # command -> Debian package
    local -A need=([slurmctld]=slurmctld [slurmd]=slurmd [sbatch]=slurm-client
                   [srun]=slurm-client [squeue]=slurm-client [scontrol]=slurm-client
                   [sinfo]=slurm-client [scancel]=slurm-client [munged]=munge
                   [munge]=munge [mungekey]=munge [flock]=util-linux [ss]=iproute2)
    if [[ "$nodes" == 2 ]]; then
        need[ip]=iproute2
        need[unshare]=util-linux
        need[nsenter]=util-linux
    fi
    for cmd in "${!need[@]}"; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("${need[$cmd]}")
    done
    # Debian's PMIx plugin for `srun --mpi=pmix` (Horovod ranks)
    if [[ -d /usr/lib/x86_64-linux-gnu/slurm-wlm || -d /usr/lib/aarch64-linux-gnu/slurm-wlm ]] \
        && ! compgen -G "/usr/lib/*-linux-gnu/slurm-wlm/mpi_pmix*.so" >/dev/null; then
        missing+=(slurm-wlm-basic-plugins)
    fi
    if ((${#missing[@]})); then
        # slurm-wlm pulls in slurmctld, slurmd, slurm-client and the basic plugins
        local pkgs=(slurm-wlm munge)
        for pkg in "${missing[@]}"; do
            case "$pkg" in slurmctld|slurmd|slurm-client|slurm-wlm-basic-plugins|munge) ;;
                *) [[ " ${pkgs[*]} " == *" $pkg "* ]] || pkgs+=("$pkg") ;; esac
        done
        die "missing commands/packages. Install them with:
    apt-get install -y ${pkgs[*]}"
    fi
}

# --------------------------------------------------------------------------- processes
# Every daemon started here carries HVD_SLURM_MARK=<cluster dir> in its environment
# (inherited by slurmstepd), so `down` stops exactly our processes, by pid.
is_ours() {  # pid [cluster dir, default ours]
    local pid="$1" dir="${2:-$DIR}"
    [[ -n "$pid" && -r "/proc/$pid/environ" ]] || return 1
    grep -qxzF "HVD_SLURM_MARK=$dir" "/proc/$pid/environ" 2>/dev/null
}

pid_from() { [[ -s "$1" ]] && tr -dc '0-9' <"$1" || true; }

alive_from() {  # pidfile [cluster dir] -> pid if that process is alive and that cluster's
    local pid
    pid="$(pid_from "$1")"
    if [[ -n "$pid" ]] && is_ours "$pid" "${2:-$DIR}"; then echo "$pid"; fi
}

our_pids() {  # every live process carrying our mark
    local p
    for p in /proc/[0-9]*; do
        p="${p#/proc/}"
        [[ "$p" == "$$" || "$p" == "$BASHPID" ]] && continue
        if is_ours "$p"; then echo "$p"; fi
    done
}

node_list() { [[ -s "$DIR/run/nodes" ]] && cat "$DIR/run/nodes" || true; }

wait_gone() {  # pids... ; waits up to 15 s
    local pid t
    for ((t = 0; t < 30; t++)); do
        local left=0
        for pid in "$@"; do [[ -d "/proc/$pid" ]] && is_ours "$pid" && left=1; done
        ((left)) || return 0
        sleep 0.5
    done
    return 1
}

kill_pids() {  # TERM, wait, KILL; only pids that carry our mark
    local pid ours=()
    for pid in "$@"; do is_ours "$pid" && ours+=("$pid"); done
    ((${#ours[@]})) || return 0
    kill -TERM "${ours[@]}" 2>/dev/null || true
    if ! wait_gone "${ours[@]}"; then
        for pid in "${ours[@]}"; do is_ours "$pid" && kill -KILL "$pid" 2>/dev/null || true; done
        wait_gone "${ours[@]}" || true
    fi
}

log_tails() {
    local f
    for f in "$DIR/munge/munged.log" "$DIR/ctld/slurmctld.log" "$DIR"/nodes/*/slurmd.log; do
        [[ -s "$f" ]] || continue
        printf '\n----- last lines of %s -----\n' "$f" >&2
        tail -n 25 "$f" >&2
    done
}

# --------------------------------------------------------------------------- config
write_config() {
    local nodes="$1" emulate="${2:-}" host ncpu mem_total_mb mem_mb node_lines ctld_addr
    local gres_types="" partitions
    host="$(hostname -s)"
    ncpu="$(nproc)"
    mem_total_mb=$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))
    mem_mb=$((mem_total_mb - HEADROOM_MB))
    ((mem_mb >= 1024)) || die "only ${mem_total_mb} MB of memory; need at least $((HEADROOM_MB + 1024)) MB (or lower HVD_SLURM_MEM_HEADROOM_MB)"
    if [[ "$nodes" == 1 ]]; then
        ctld_addr=127.0.0.1
        node_lines="NodeName=$NODE_NAME NodeHostname=$host NodeAddr=127.0.0.1 CPUs=$ncpu RealMemory=$mem_mb State=UNKNOWN"
        echo "$NODE_NAME" >"$DIR/run/nodes"
    else
        ctld_addr="$SUBNET.1"
        mem_mb=$((mem_mb / 2))
        node_lines="NodeName=node1 NodeHostname=node1 NodeAddr=$SUBNET.11 CPUs=1 RealMemory=$mem_mb State=UNKNOWN
NodeName=node2 NodeHostname=node2 NodeAddr=$SUBNET.12 CPUs=1 RealMemory=$mem_mb State=UNKNOWN"
        printf 'node1\nnode2\n' >"$DIR/run/nodes"
    fi
    partitions="PartitionName=$PARTITION Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    : >"$DIR/etc/gres.conf"
    if [[ "$emulate" == alpha ]]; then
        # thesis-like GPU nodes, taken on trust by slurmd (SlurmdParameters=config_overrides)
        local i last=$((EMU_GPUS - 1))
        mkdir -p "$DIR/dev"
        for ((i = 0; i < EMU_GPUS; i++)); do
            # SLURM wants character devices for GPU gres; /dev/null's numbers will do
            [[ -c "$DIR/dev/nvidia$i" ]] || { rm -f "$DIR/dev/nvidia$i"; mknod "$DIR/dev/nvidia$i" c 1 3; }
        done
        gres_types="GresTypes=gpu"
        node_lines="NodeName=node1 NodeHostname=node1 NodeAddr=$SUBNET.11 CPUs=$EMU_CPUS RealMemory=$EMU_MEM_MB Gres=gpu:$EMU_GPU_TYPE:$EMU_GPUS State=UNKNOWN
NodeName=node2 NodeHostname=node2 NodeAddr=$SUBNET.12 CPUs=$EMU_CPUS RealMemory=$EMU_MEM_MB Gres=gpu:$EMU_GPU_TYPE:$EMU_GPUS State=UNKNOWN"
        printf 'AutoDetect=off\nNodeName=node[1-2] Name=gpu Type=%s File=%s/dev/nvidia[0-%d]\n' \
            "$EMU_GPU_TYPE" "$DIR" "$last" >"$DIR/etc/gres.conf"
        partitions="$partitions
PartitionName=alpha Nodes=ALL MaxTime=INFINITE State=UP"
    fi
    : >"$DIR/etc/plugstack.conf"   # isolate from /etc/slurm/plugstack.conf
    cat >"$CONF" <<EOF
$CONF_MARK ($nodes-node mode) -- do not edit, rerun up.
ClusterName=$CLUSTER_NAME
SlurmctldHost=$host($ctld_addr)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$MUNGE_SOCKET
CredType=cred/munge
PlugStackConfig=$DIR/etc/plugstack.conf
StateSaveLocation=$DIR/ctld/state
SlurmdSpoolDir=$DIR/nodes/%n/spool
SlurmctldPidFile=$CTLD_PID
SlurmdPidFile=$DIR/nodes/%n/slurmd.pid
SlurmctldLogFile=$DIR/ctld/slurmctld.log
SlurmdLogFile=$DIR/nodes/%n/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups, no accounting: works in containers and VMs without systemd
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
DefMemPerCPU=1024
# start jobs at once; keep finished jobs visible to squeue for 10 min (the Snakemake
# SLURM plugin uses squeue as status command when sacct is unusable)
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_interval=2,sched_min_interval=0,bf_interval=1
MinJobAge=600
# job ids go on from the last run of this cluster (state is wiped at every up)
FirstJobId=$(cat "$DIR/ctld/next_job_id" 2>/dev/null || echo 1)
ReturnToService=2
MailProg=/bin/true
SlurmdParameters=config_overrides
SlurmctldTimeout=30
SlurmdTimeout=30
MessageTimeout=10
UnkillableStepTimeout=60
KillWait=5
InactiveLimit=0
Waittime=0
# per-node TmpFS: the PMIx plugin makes its per-step dirs there (spmix_appdir_*);
# with a shared /tmp the two "nodes" of two-node mode would collide on them
TmpFS=$DIR/nodes/%n/tmp
$gres_types
$node_lines
$partitions
EOF
    echo "$nodes${emulate:+-$emulate}" >"$MODE_FILE"
    cat >"$DIR/env.sh" <<EOF
export SLURM_CONF=$CONF
export HVD_SLURM_DIR=$DIR
export HVD_SLURM_PARTITION=$PARTITION
EOF
}

# --------------------------------------------------------------------------- munge
start_munge() {
    if [[ -n "$(alive_from "$MUNGE_PID")" ]]; then return 0; fi
    if [[ ! -s "$MUNGE_KEY" ]]; then
        mungekey --create --keyfile="$MUNGE_KEY" >/dev/null
    fi
    chmod 0600 "$MUNGE_KEY"
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock"
    env HVD_SLURM_MARK="$DIR" munged --socket="$MUNGE_SOCKET" --key-file="$MUNGE_KEY" \
        --log-file="$DIR/munge/munged.log" --pid-file="$MUNGE_PID" \
        --seed-file="$DIR/munge/munged.seed" 9>&- \
        || { log_tails; die "munged did not start (see $DIR/munge/munged.log above)"; }
    munge -n --socket="$MUNGE_SOCKET" | unmunge --socket="$MUNGE_SOCKET" >/dev/null \
        || { log_tails; die "munge credential test failed"; }
}

# --------------------------------------------------------------------------- two-node network
net_owner() {  # the cluster dir of the live processes in the two-node namespaces ("" if none)
    local i pid mark
    for i in 1 2; do
        [[ -e "/run/netns/hvd-node$i" ]] || continue
        for pid in $(ip netns pids "hvd-node$i" 2>/dev/null); do
            mark="$(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^HVD_SLURM_MARK=//p' | head -n 1)"
            if [[ -n "$mark" ]]; then echo "$mark"; return 0; fi
        done
    done
}

net_up() {
    local i ns
    ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
    ip addr replace "$SUBNET.1/24" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    for i in 1 2; do
        ns="hvd-node$i"
        [[ -e "/run/netns/$ns" ]] || ip netns add "$ns"
        if ! ip link show "hvdv$i" >/dev/null 2>&1; then
            ip link add "hvdv$i" type veth peer name "hvdp$i"
            ip link set "hvdp$i" netns "$ns"
            ip -n "$ns" link set "hvdp$i" name eth0
        fi
        ip link set "hvdv$i" master "$BRIDGE"
        ip link set "hvdv$i" up
        ip -n "$ns" link set lo up
        ip -n "$ns" addr replace "$SUBNET.1$i/24" dev eth0
        ip -n "$ns" link set eth0 up
        # no default route: the namespaces reach only this /24
    done
    hosts_add
}

net_down() {
    local i ns pid
    for i in 1 2; do
        ns="hvd-node$i"
        if [[ -e "/run/netns/$ns" ]]; then
            # processes left in our namespace (job tasks that survived) are ours
            for pid in $(ip netns pids "$ns" 2>/dev/null); do
                kill -KILL "$pid" 2>/dev/null || true
            done
            ip netns del "$ns" 2>/dev/null || true
        fi
        ip link del "hvdv$i" 2>/dev/null || true
    done
    ip link del "$BRIDGE" 2>/dev/null || true
    hosts_remove
}

hosts_add() {
    hosts_remove
    # rewrite in place (/etc/hosts may be a bind mount that cannot be replaced)
    printf '%s node1 %s\n%s node2 %s\n' "$SUBNET.11" "$HOSTS_MARK" "$SUBNET.12" "$HOSTS_MARK" >>/etc/hosts
}

hosts_remove() {
    [[ -w /etc/hosts ]] || return 0
    if grep -qF "$HOSTS_MARK" /etc/hosts; then
        local kept
        kept="$(grep -vF "$HOSTS_MARK" /etc/hosts || true)"
        printf '%s\n' "$kept" >/etc/hosts
    fi
}

# --------------------------------------------------------------------------- default config link
# The SLURM executor plugin's job step (snakemake-executor-plugin-slurm-jobstep)
# removes every SLURM_* variable, SLURM_CONF included, before it runs `srun` inside
# the job. Clients then look for /etc/slurm/slurm.conf and /run/slurm/conf/slurm.conf,
# so point the latter at our etc/ while the cluster is up (removed by `down`).
conf_link_add() {
    if [[ -e /etc/slurm/slurm.conf ]]; then
        log "warning: /etc/slurm/slurm.conf exists and wins over $RUN_CONF_LINK; jobs of the Snakemake SLURM plugin will talk to that cluster"
    fi
    if [[ -L "$RUN_CONF_LINK" && "$(readlink "$RUN_CONF_LINK")" == "$DIR/etc" ]]; then return 0; fi
    if [[ -L "$RUN_CONF_LINK" && ! -e "$RUN_CONF_LINK" ]]; then
        # dangling: left by a cluster whose directory is gone (a killed test run)
        log "replacing the dangling $RUN_CONF_LINK -> $(readlink "$RUN_CONF_LINK")"
        rm -f "$RUN_CONF_LINK"
    fi
    if [[ -L "$RUN_CONF_LINK" ]]; then
        # another cluster of this script (its etc/ holds our slurm.conf): a killed run
        # leaves the link behind with its directory; jobs of the plugin would then run
        # `srun` against that cluster's config and fail (munge key, nodes, port)
        local target other other_pid
        target="$(readlink "$RUN_CONF_LINK")"
        other="${target%/etc}"
        if [[ "$target" == */etc && -f "$other/etc/slurm.conf" && -d "$other/run" ]] \
            && grep -qE "^($CONF_MARK|ClusterName=hvdlocal$)" "$other/etc/slurm.conf" 2>/dev/null; then
            other_pid="$(alive_from "$other/run/slurmctld.pid" "$other")"
            if [[ -n "$other_pid" ]]; then
                # several clusters (issue 29): our jobs read our config through the
                # slurmd's own /etc/slurm (start_slurmd), not through this link
                log "$RUN_CONF_LINK belongs to the cluster up in $other (slurmctld pid $other_pid); left to it (jobs of this cluster read $DIR/etc through their slurmd's /etc/slurm)"
                return 0
            fi
            log "replacing the stale $RUN_CONF_LINK -> $target (that cluster is down: left by a killed run)"
            rm -f "$RUN_CONF_LINK"
        fi
    fi
    if [[ -e "$RUN_CONF_LINK" || -L "$RUN_CONF_LINK" ]]; then
        log "warning: $RUN_CONF_LINK exists and is not ours; leaving it alone (Snakemake SLURM jobs need SLURM_CONF, which the plugin's job step drops)"
        return 0
    fi
    mkdir -p "$(dirname "$RUN_CONF_LINK")"
    ln -s "$DIR/etc" "$RUN_CONF_LINK"
}

conf_link_remove() {
    if [[ -L "$RUN_CONF_LINK" && "$(readlink "$RUN_CONF_LINK")" == "$DIR/etc" ]]; then
        rm -f "$RUN_CONF_LINK"
        rmdir "$(dirname "$RUN_CONF_LINK")" 2>/dev/null || true
    fi
}

# --------------------------------------------------------------------------- slurm daemons
slurm_env() { env -u SLURM_JOB_ID -u SLURM_JOBID SLURM_CONF="$CONF" HVD_SLURM_MARK="$DIR" "$@"; }

start_slurmctld() {
    [[ -n "$(alive_from "$CTLD_PID")" ]] && return 0
    if ss -ltnH "sport = :$CTLD_PORT" 2>/dev/null | grep -q .; then
        die "port $CTLD_PORT is in use by another program (set HVD_SLURM_CTLD_PORT)"
    fi
    rm -rf "$DIR/ctld/state"
    mkdir -p "$DIR/ctld/state"
    slurm_env slurmctld -f "$CONF" -c 9>&- || { log_tails; die "slurmctld did not start"; }
    local t
    for ((t = 0; t < TIMEOUT * 2; t++)); do
        [[ "$(slurm_env scontrol ping 2>/dev/null || true)" == *"is UP"* ]] && return 0
        sleep 0.5
    done
    log_tails
    die "slurmctld did not answer within ${TIMEOUT}s"
}

start_slurmd() {
    local node="$1" nodes="$2" pidfile="$DIR/nodes/$1/slurmd.pid"
    [[ -n "$(alive_from "$pidfile")" ]] && return 0
    # fresh spool/tmp: stale PMIx sockets of an earlier run would break steps
    rm -rf "$DIR/nodes/$node/spool" "$DIR/nodes/$node/tmp"
    mkdir -p "$DIR/nodes/$node/spool" "$DIR/nodes/$node/tmp"
    # Own mount namespace per slurmd (issue 29, several clusters): the cluster's etc/
    # bind-mounted on /etc/slurm there, the first place a client looks without
    # SLURM_CONF, so `srun` in its jobs (the plugin's job step drops SLURM_CONF) finds
    # this cluster, whichever cluster holds /run/slurm/conf. Only /etc/slurm is mounted
    # (the rest of the filesystem, /sys/fs/cgroup and /tmp included, is the host's).
    [[ -d /etc/slurm ]] || mkdir -p /etc/slurm
    # $1 node, $2 slurm.conf, $3 cluster dir (its etc/ on /etc/slurm, and the mark)
    local run_slurmd='mount --bind "$3/etc" /etc/slurm && exec env -u SLURM_JOB_ID SLURM_CONF="$2" HVD_SLURM_MARK="$3" slurmd -f "$2" -N "$1"'
    if [[ "$nodes" == 1 ]]; then
        unshare --mount sh -c "$run_slurmd" \
            sh "$node" "$CONF" "$DIR" 9>&- || { log_tails; die "slurmd $node did not start"; }
    else
        # own network namespace (address) + own UTS namespace (hostname) per node.
        # nsenter, not `ip netns exec`: the latter remounts /sys in a new mount
        # namespace, which hides /sys/fs/cgroup ("slurmd: error: No filesystem
        # mounted on /sys/fs/cgroup ... Unable to initialize cgroup plugin").
        nsenter --net="/run/netns/hvd-$node" unshare --uts --mount sh -c "hostname \"\$1\" && $run_slurmd" \
            sh "$node" "$CONF" "$DIR" 9>&- || { log_tails; die "slurmd $node did not start"; }
    fi
}

wait_idle() {
    local t states
    for ((t = 0; t < TIMEOUT * 2; t++)); do
        states="$(slurm_env sinfo -h -N -p "$PARTITION" -o '%N %T' 2>/dev/null || true)"
        if [[ -n "$states" ]] && ! grep -qv ' idle$' <<<"$states"; then
            return 0
        fi
        sleep 0.5
    done
    printf '%s\n' "node states after ${TIMEOUT}s: ${states:-<none>}" >&2
    log_tails
    return 1
}

daemons_state() {  # prints "<up> <total>" for munged, slurmctld, slurmd(s)
    local up=0 total=2 node
    [[ -n "$(alive_from "$MUNGE_PID")" ]] && up=$((up + 1))
    [[ -n "$(alive_from "$CTLD_PID")" ]] && up=$((up + 1))
    for node in $(node_list); do
        total=$((total + 1))
        [[ -n "$(alive_from "$DIR/nodes/$node/slurmd.pid")" ]] && up=$((up + 1))
    done
    echo "$up $total"
}

# --------------------------------------------------------------------------- commands
do_down() {
    local pid
    if [[ -n "$(alive_from "$CTLD_PID")" ]]; then
        local jobs
        jobs="$(slurm_env squeue -h -t all -o %i 2>/dev/null | tr '\n' ' ' || true)"
        if [[ -n "${jobs// /}" ]]; then
            # shellcheck disable=SC2086
            slurm_env scancel $jobs 2>/dev/null || true
            local t
            for ((t = 0; t < 20; t++)); do
                [[ -z "$(slurm_env squeue -h -t running,completing -o %i 2>/dev/null)" ]] && break
                sleep 0.5
            done
        fi
        local next
        next="$(slurm_env scontrol show config 2>/dev/null | awk '$1 == "NEXT_JOB_ID" {print $3}' || true)"
        [[ "$next" =~ ^[0-9]+$ ]] && echo "$next" >"$DIR/ctld/next_job_id"
        # stops slurmctld and every registered slurmd
        slurm_env scontrol shutdown >/dev/null 2>&1 || true
        pid="$(alive_from "$CTLD_PID")"
        [[ -n "$pid" ]] && wait_gone "$pid" || true
    fi
    # anything of ours still alive: slurmd, slurmstepd, slurmctld (munged last)
    local munge_pid rest=()
    munge_pid="$(alive_from "$MUNGE_PID")"
    for pid in $(our_pids); do
        [[ "$pid" == "$munge_pid" ]] || rest+=("$pid")
    done
    ((${#rest[@]})) && kill_pids "${rest[@]}"
    if [[ -n "$munge_pid" ]]; then
        munged --stop --socket="$MUNGE_SOCKET" >/dev/null 2>&1 || true
        wait_gone "$munge_pid" || kill_pids "$munge_pid"
    fi
    local owner
    owner="$(net_owner)"
    if [[ -n "$owner" && "$owner" != "$DIR" ]]; then
        :  # the two-node network of another cluster that is up (issue 29): not ours
    elif [[ "$(cat "$MODE_FILE" 2>/dev/null || true)" == 2* ]] || ip link show "$BRIDGE" >/dev/null 2>&1 \
        || grep -qF "$HOSTS_MARK" /etc/hosts 2>/dev/null; then
        net_down
    fi
    conf_link_remove
    rm -f "$MUNGE_SOCKET" "$MUNGE_SOCKET.lock" "$MUNGE_PID" "$CTLD_PID" "$MODE_FILE" "$DIR/run/nodes" \
        "$DIR"/nodes/*/slurmd.pid 2>/dev/null || true
    local left
    left="$(our_pids | tr '\n' ' ')"
    [[ -z "${left// /}" ]] || die "processes of this cluster still alive: $left"
}

cmd_up() {
    local nodes=1 emulate="" mode
    while (($#)); do
        case "$1" in
            --nodes) nodes="${2:-}"; shift 2 || die "--nodes needs a value (1 or 2)" ;;
            --nodes=*) nodes="${1#--nodes=}"; shift ;;
            --emulate) emulate="${2:-}"; shift 2 || die "--emulate needs a value (alpha)" ;;
            --emulate=*) emulate="${1#--emulate=}"; shift ;;
            -h|--help) usage; exit 0 ;;
            *) die "up: unknown option '$1' (see --help)" ;;
        esac
    done
    [[ "$nodes" == 1 || "$nodes" == 2 ]] || die "--nodes must be 1 or 2, got '$nodes'"
    [[ -z "$emulate" || "$emulate" == alpha ]] || die "--emulate: only 'alpha' is known, got '$emulate'"
    [[ -z "$emulate" || "$nodes" == 2 ]] || die "--emulate alpha needs --nodes 2"
    mode="$nodes${emulate:+-$emulate}"
    require_root up
    require_packages "$nodes"
    ((${#DIR} <= 80)) || die "HVD_SLURM_DIR '$DIR' is too long for a unix socket path (max 80 chars)"
    mkdir -p "$DIR"
    exec 9>"$LOCK_FILE"
    flock -w 120 9 || die "another slurm-cluster.sh holds $LOCK_FILE"

    if [[ "$nodes" == 2 ]]; then
        local owner
        owner="$(net_owner)"
        if [[ -n "$owner" && "$owner" != "$DIR" ]]; then
            die "the two-node network (bridge $BRIDGE, nodes node1/node2) belongs to the cluster up in $owner; two-node mode is one cluster at a time: stop it with HVD_SLURM_DIR=$owner $0 down"
        fi
    fi
    local state current
    state="$(daemons_state)"
    current="$(cat "$MODE_FILE" 2>/dev/null || true)"
    if [[ "${state%% *}" != 0 ]]; then
        if [[ "$current" == "$mode" && "${state%% *}" == "${state##* }" ]]; then
            log "already up ($mode mode); checking nodes"
            conf_link_add
            wait_idle || die "cluster is up but its nodes are not idle; try: $0 down && $0 up --nodes $nodes${emulate:+ --emulate $emulate}"
            log "cluster is up: $(slurm_env sinfo -h -o '%P %D %T %N' | tr '\n' ' ')"
            return 0
        fi
        log "cluster is up in ${current:-unknown} mode or only partly up ($state daemons); restarting in $mode mode"
        do_down
    fi

    mkdir -p "$DIR"/{etc,munge,run,ctld}
    chmod 0755 "$DIR" "$DIR/run"   # munged wants a socket dir everyone can enter
    chmod 0700 "$DIR/munge"
    write_config "$nodes" "$emulate"
    write_sacct_shim
    trap 'rc=$?; if ((rc)); then log "start failed; stopping what was started (logs kept in $DIR)"; do_down || true; fi' EXIT
    start_munge
    conf_link_add
    if [[ "$nodes" == 2 ]]; then
        net_up
    fi
    start_slurmctld
    local node
    for node in $(node_list); do start_slurmd "$node" "$nodes"; done
    wait_idle || die "nodes did not become idle within ${TIMEOUT}s"
    trap - EXIT
    log "cluster is up ($mode mode): $(slurm_env sinfo -h -o '%P %D %T %N' | tr '\n' ' ')"
    log "use it with: eval \"\$($0 env)\""
}

cmd_down() {
    require_root down
    [[ -d "$DIR" ]] || { log "already down (no $DIR)"; return 0; }
    exec 9>"$LOCK_FILE"
    flock -w 120 9 || die "another slurm-cluster.sh holds $LOCK_FILE"
    local state
    state="$(daemons_state)"
    do_down
    if [[ "${state%% *}" == 0 ]]; then log "already down"; else log "cluster stopped (logs kept in $DIR)"; fi
}

cmd_status() {
    local state up total node pid
    state="$(daemons_state)"
    up="${state%% *}"
    total="${state##* }"
    printf 'cluster dir: %s\nmode:        %s\n' "$DIR" "$(cat "$MODE_FILE" 2>/dev/null || echo down)"
    pid="$(alive_from "$MUNGE_PID")"; printf 'munged:      %s\n' "${pid:-not running}"
    pid="$(alive_from "$CTLD_PID")"; printf 'slurmctld:   %s\n' "${pid:-not running}"
    for node in $(node_list); do
        pid="$(alive_from "$DIR/nodes/$node/slurmd.pid")"
        printf 'slurmd %-5s %s\n' "$node:" "${pid:-not running}"
    done
    printf '%s: %s\n' "$RUN_CONF_LINK" "$(readlink "$RUN_CONF_LINK" 2>/dev/null || echo '-')"
    if [[ -n "$(alive_from "$CTLD_PID")" ]]; then
        echo
        slurm_env sinfo -N -o '%10N %10P %6c %10m %T' || true
        echo
        slurm_env squeue -o '%8i %10P %20j %8T %10M %R' || true
    fi
    if ((up == 0)); then return 3; elif ((up < total)); then return 1; fi
    return 0
}

# No slurmdbd here, so Debian's sacct only says "accounting storage is disabled". The
# Snakemake SLURM plugin switches its status query to sacct whenever `scontrol show
# config` does not answer within 10 s (a loaded 2-core machine during a 16-rank job),
# and then never sees its jobs finish. Clients of this cluster (`env` puts $DIR/bin first
# on PATH) get a sacct that answers the plugin's query (JobIdRaw|State of the jobs named
# --name) from the controller, which keeps finished jobs for MinJobAge.
write_sacct_shim() {
    mkdir -p "$DIR/bin"
    cat > "$DIR/bin/sacct" <<'SHIM'
#!/bin/bash
# hvdscale test cluster: sacct without slurmdbd, from squeue (scripts/slurm-cluster.sh)
name=
while (($#)); do
    case "$1" in
        --name) name="$2"; shift ;;
        --name=*) name="${1#--name=}" ;;
    esac
    shift
done
exec squeue --noheader --states=all ${name:+--name="$name"} --format='%i|%T'
SHIM
    chmod 0755 "$DIR/bin/sacct"
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$CONF"
    printf 'export PATH=%q\n' "$DIR/bin:$PATH"
    printf 'export HVD_SLURM_DIR=%q\n' "$DIR"
    printf 'export HVD_SLURM_PARTITION=%q\n' "$PARTITION"
}

case "${1:-}" in
    up) shift; cmd_up "$@" ;;
    down) shift; cmd_down ;;
    status) shift; cmd_status ;;
    env) shift; cmd_env ;;
    -h|--help|help) usage ;;
    "") usage >&2; exit 2 ;;
    *) echo "slurm-cluster: unknown command '$1' (see --help)" >&2; exit 2 ;;
esac
