#!/usr/bin/env bash
# A real single-node SLURM cluster for the tests, started by hand (no systemd, no cgroups).
#
#   tests/slurm/cluster.sh start    install if needed, start everything, wait until the node is idle
#   tests/slurm/cluster.sh stop     cancel jobs, stop every daemon this script started
#   tests/slurm/cluster.sh status   exit 0 when the cluster is up and the node can run jobs
#   tests/slurm/cluster.sh env      print `export` lines for the client tools (SLURM_CONF)
#
# Everything lives under one state dir, $LR_SLURM_DIR (default /var/lib/lr-slurm): config, pid files,
# logs, spool and the MariaDB data behind slurmdbd (needed by sacct, hence by submitit's job.state).
# /etc/slurm/slurm.conf is made a symlink to the generated config when no other config is there, so
# plain `sbatch`/`scontrol` work in any subprocess without SLURM_CONF.
# Needs root and Debian/Ubuntu (apt-get). Every wait is bounded.
set -euo pipefail

STATE=${LR_SLURM_DIR:-/var/lib/lr-slurm}
CLUSTER=${LR_SLURM_CLUSTER:-lr}
START_TIMEOUT=${LR_SLURM_START_TIMEOUT:-60}
ETC_LINK=/etc/slurm/slurm.conf
PACKAGES=(slurmctld slurmd slurm-client munge slurmdbd mariadb-server)

CONF=$STATE/etc/slurm.conf
# Included by slurm.conf, a comment only (an empty file makes every client tool complain): a test of
# `lightning-resume doctor --emit slurm` puts its RequeueExit= and RequeueExitHold= lines there for a
# while (`scontrol reconfigure`), then puts the comment back.
REQUEUE_EXIT_CONF=$STATE/etc/requeue_exit.conf
DBD_CONF=$STATE/etc/slurmdbd.conf
RUN=$STATE/run
LOG=$STATE/log
DB_DIR=$STATE/mysql
DB_SOCK=$DB_DIR/run/mysqld.sock
MUNGE_RUN=$STATE/munge
# Also the node name: slurmctld insists that SlurmctldHost is this machine's short hostname.
HOST=$(hostname -s)

export SLURM_CONF=$CONF
# libmariadb's default socket: how slurmdbd finds our private, networkless MariaDB.
export MYSQL_UNIX_PORT=$DB_SOCK

log() { printf 'lr-slurm: %s\n' "$*" >&2; }

die() {
    log "ERROR: $*"
    exit 1
}

now_ms() { date +%s%3N; }

# Print the last lines of each named log file (for failures).
show_logs() {
    local f
    for f in "$@"; do
        if [[ -s $f ]]; then
            printf -- '----- tail of %s -----\n' "$f" >&2
            tail -n 25 "$f" >&2
        fi
    done
}

# fail MESSAGE LOGFILE...: report, show the logs, exit non-zero.
fail() {
    local msg=$1
    shift
    log "ERROR: $msg"
    show_logs "$@"
    exit 1
}

# wait_for SECONDS DESCRIPTION COMMAND...: poll COMMAND every 0.2 s until it succeeds or time runs out.
wait_for() {
    local limit=$1 what=$2
    shift 2
    local deadline
    deadline=$(($(date +%s) + limit))
    until "$@" >/dev/null 2>&1; do
        if (($(date +%s) >= deadline)); then
            log "timed out after ${limit}s waiting for $what"
            return 1
        fi
        sleep 0.2
    done
}

# ---------------------------------------------------------------------------------------------------
# Processes: a pid file counts only while its pid is alive and is the program we expect (stale pid files
# survive a machine restart; pids get reused).

# alive PID: the process exists and is not a zombie (PID 1 here may take seconds to reap orphans).
alive() {
    local stat
    stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
    stat=${stat##*) }
    [[ -n $stat && ${stat:0:1} != Z ]]
}

# pid_of NAME PIDFILE: print the pid and succeed when PIDFILE names a live process called NAME.
pid_of() {
    local name=$1 file=$2 pid comm
    [[ -r $file ]] || return 1
    pid=$(tr -dc '0-9' <"$file")
    [[ -n $pid ]] || return 1
    comm=$(cat "/proc/$pid/comm" 2>/dev/null) || return 1
    [[ $comm == "$name" ]] && alive "$pid" || return 1
    printf '%s\n' "$pid"
}

running() { pid_of "$1" "$2" >/dev/null; }

# stop_daemon NAME PIDFILE: SIGTERM, wait up to 15 s, then SIGKILL; remove the pid file.
stop_daemon() {
    local name=$1 file=$2 pid i
    if pid=$(pid_of "$name" "$file"); then
        kill -TERM "$pid" 2>/dev/null || true
        for ((i = 0; i < 150; i++)); do
            alive "$pid" || break
            sleep 0.1
        done
        if alive "$pid"; then
            log "$name ($pid) ignored SIGTERM for 15 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            for ((i = 0; i < 50; i++)); do
                alive "$pid" || break
                sleep 0.1
            done
        fi
        alive "$pid" && die "could not stop $name ($pid)"
        log "stopped $name ($pid)"
    fi
    rm -f "$file"
}

# ---------------------------------------------------------------------------------------------------
# Installation

missing_packages() {
    local p
    for p in "${PACKAGES[@]}"; do
        if [[ $(dpkg-query -W -f='${Status}' "$p" 2>/dev/null) != "install ok installed" ]]; then
            printf '%s\n' "$p"
        fi
    done
}

install_packages() {
    local missing
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]})) || return 0
    command -v apt-get >/dev/null || die "packages missing (${missing[*]}) and no apt-get to install them"
    ((EUID == 0)) || die "packages missing (${missing[*]}): run as root to install them"
    log "installing ${missing[*]} (apt-get, log in $LOG/apt.log)"
    export DEBIAN_FRONTEND=noninteractive
    # (fd 9, the lock, closed: nothing a maintainer script might leave running must hold it)
    {
        timeout 300 apt-get update -q &&
            timeout 600 apt-get install -y -q --no-install-recommends "${missing[@]}"
    } </dev/null >"$LOG/apt.log" 2>&1 9>&- || fail "apt-get failed" "$LOG/apt.log"
    mapfile -t missing < <(missing_packages)
    ((${#missing[@]} == 0)) || fail "still missing after install: ${missing[*]}" "$LOG/apt.log"
}

# ---------------------------------------------------------------------------------------------------
# munge

munge_works() { { munge -n </dev/null | unmunge; } >/dev/null 2>&1; }

start_munge() {
    if munge_works; then
        return 0 # ours from an earlier start, or the machine's own
    fi
    local key=/etc/munge/munge.key
    if [[ ! -s $key ]]; then
        log "creating munge key $key"
        install -d -o munge -g munge -m 0700 /etc/munge
        if command -v mungekey >/dev/null; then
            mungekey --create --keyfile="$key" --force
        else
            dd if=/dev/urandom of="$key" bs=1024 count=1 status=none
        fi
    fi
    chown munge:munge "$key"
    chmod 0400 "$key"
    # munged refuses to run with directories that others can write.
    install -d -o munge -g munge -m 0755 /run/munge
    install -d -o munge -g munge -m 0700 /var/lib/munge /var/log/munge
    install -d -o munge -g munge -m 0755 "$MUNGE_RUN"
    # --force: start even if a dead munged left its socket behind.
    # (its log file lives in a munge-owned dir: munged opens it as the munge user)
    runuser -u munge -- munged --force --pid-file="$MUNGE_RUN/munged.pid" \
        --log-file="$MUNGE_RUN/munged.log" </dev/null >>"$LOG/munged.out" 2>&1 9>&- ||
        fail "munged did not start" "$LOG/munged.out" "$MUNGE_RUN/munged.log"
    wait_for 10 munged munge_works || fail "munged is not answering" "$LOG/munged.out" "$MUNGE_RUN/munged.log"
}

# ---------------------------------------------------------------------------------------------------
# MariaDB + slurmdbd (accounting, for sacct)

db_works() { mariadb-admin --socket="$DB_SOCK" --connect-timeout=2 ping; }

start_mariadb() {
    running mariadbd "$DB_DIR/run/mysqld.pid" && db_works >/dev/null 2>&1 && return 0
    install -d -o mysql -g mysql -m 0750 "$DB_DIR" "$DB_DIR/data"
    install -d -o mysql -g mysql -m 0755 "$DB_DIR/run"
    if [[ ! -d $DB_DIR/data/mysql ]]; then
        log "initialising MariaDB data dir $DB_DIR/data"
        timeout 120 mariadb-install-db --no-defaults --user=mysql --datadir="$DB_DIR/data" \
            --auth-root-authentication-method=socket --skip-test-db \
            </dev/null >"$LOG/mariadb-install.log" 2>&1 9>&- ||
            fail "mariadb-install-db failed" "$LOG/mariadb-install.log"
    fi
    # mariadbd writes its log as the mysql user.
    touch "$LOG/mariadb.log"
    chown mysql:mysql "$LOG/mariadb.log"
    # No TCP at all (--skip-networking); root logs in through the socket (unix_socket auth).
    setsid mariadbd --no-defaults --user=mysql --datadir="$DB_DIR/data" \
        --socket="$DB_SOCK" --pid-file="$DB_DIR/run/mysqld.pid" --skip-networking \
        --log-error="$LOG/mariadb.log" --innodb-buffer-pool-size=128M \
        --innodb-lock-wait-timeout=900 --max-allowed-packet=64M \
        </dev/null >>"$LOG/mariadb.log" 2>&1 9>&- &
    wait_for 30 MariaDB db_works || fail "MariaDB did not come up" "$LOG/mariadb.log"
}

write_dbd_conf() {
    cat >"$DBD_CONF.new" <<EOF
# Generated by tests/slurm/cluster.sh
AuthType=auth/munge
DbdHost=localhost
DbdPort=6819
SlurmUser=root
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
DebugLevel=info
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc=slurm_acct_db
EOF
    chmod 0600 "$DBD_CONF.new"
    mv -f "$DBD_CONF.new" "$DBD_CONF"
}

dbd_works() { timeout 10 sacctmgr -n -P list cluster format=cluster; }

start_slurmdbd() {
    if ! running slurmdbd "$RUN/slurmdbd.pid"; then
        setsid slurmdbd </dev/null >>"$LOG/slurmdbd.log" 2>&1 9>&- ||
            fail "slurmdbd did not start" "$LOG/slurmdbd.log" "$LOG/mariadb.log"
    fi
    # The first start creates the accounting tables: give it time.
    wait_for 60 slurmdbd dbd_works || fail "slurmdbd is not answering" "$LOG/slurmdbd.log" "$LOG/mariadb.log"
    local clusters
    clusters=$(dbd_works 2>/dev/null) || clusters=
    if ! grep -qx "$CLUSTER" <<<"$clusters"; then
        timeout 20 sacctmgr -i add cluster "$CLUSTER" >>"$LOG/sacctmgr.log" 2>&1 ||
            fail "sacctmgr could not add cluster $CLUSTER" "$LOG/sacctmgr.log" "$LOG/slurmdbd.log"
    fi
}

# ---------------------------------------------------------------------------------------------------
# slurmctld + slurmd

node_line() {
    local hw
    # `slurmd -C` prints this machine's NodeName line (and an UpTime line we drop).
    hw=$(timeout 30 slurmd -C 2>/dev/null | grep '^NodeName=') || die "slurmd -C failed"
    hw=${hw#NodeName=* }
    # Boards/Sockets/Cores/Threads as slurmd sees them (a mismatch drains the node); NodeAddr fixed
    # to the loopback so nothing depends on name resolution.
    printf 'NodeName=%s NodeAddr=127.0.0.1 %s State=UNKNOWN\n' "$HOST" "$hw"
}

write_slurm_conf() {
    local node
    node=$(node_line)
    [[ -s $REQUEUE_EXIT_CONF ]] || echo "# no RequeueExit/RequeueExitHold (tests/slurm/cluster.sh)" >"$REQUEUE_EXIT_CONF"
    cat >"$CONF.new" <<EOF
# Generated by tests/slurm/cluster.sh: a single-node test cluster. Do not edit, edit the script.
ClusterName=$CLUSTER
SlurmctldHost=$HOST(127.0.0.1)
SlurmUser=root
SlurmdUser=root
SlurmctldPort=6817
SlurmdPort=6818
AuthType=auth/munge
CredType=cred/munge
# A requeued job is held until cred_expire+1 s after it ended: 5 is the minimum (default 120).
AuthInfo=cred_expire=5
StateSaveLocation=$STATE/spool/ctld
SlurmdSpoolDir=$STATE/spool/d
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmdPidFile=$RUN/slurmd.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdLogFile=$LOG/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
MailProg=/bin/true
MpiDefault=none
SwitchType=switch/none
# No cgroups here.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=1,sched_interval=1
JobRequeue=1
KillWait=5
MinJobAge=30
InactiveLimit=0
ReturnToService=2
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=6819
JobCompType=jobcomp/none
# Preemption: a job in 'high' requeues jobs in 'low'; with --signal=[B:]SIG@N the victim gets SIG at
# once, SIGTERM when GraceTime ends, SIGKILL KillWait later, and is requeued.
PreemptType=preempt/partition_prio
PreemptMode=REQUEUE
SlurmctldParameters=preempt_send_user_signal
$node
PartitionName=low Nodes=$HOST Default=YES MaxTime=INFINITE State=UP PriorityTier=1 PreemptMode=REQUEUE GraceTime=10
PartitionName=high Nodes=$HOST Default=NO MaxTime=INFINITE State=UP PriorityTier=10 PreemptMode=OFF
# Exit statuses requeued (RequeueExit=) or requeued held (RequeueExitHold=): none unless a test puts some.
Include $REQUEUE_EXIT_CONF
EOF
    if [[ -f $CONF ]] && cmp -s "$CONF" "$CONF.new"; then
        rm -f "$CONF.new"
        return 1 # unchanged
    fi
    mv -f "$CONF.new" "$CONF"
}

link_etc_conf() {
    if [[ -L $ETC_LINK || ! -e $ETC_LINK ]]; then
        mkdir -p "$(dirname "$ETC_LINK")"
        ln -sfn "$CONF" "$ETC_LINK"
    elif [[ $(readlink -f "$ETC_LINK") != "$(readlink -f "$CONF")" ]]; then
        log "note: $ETC_LINK is someone else's config; client tools need: export SLURM_CONF=$CONF"
    fi
}

# One line per partition: take the first.
node_state() { timeout 10 sinfo -h -N -n "$HOST" -o '%T' 2>/dev/null | awk 'NR == 1'; }

node_usable() {
    case $(node_state) in
    idle | mixed | allocated | completing) return 0 ;;
    *) return 1 ;;
    esac
}

ctld_up() { timeout 5 scontrol ping 2>/dev/null | grep -q 'is UP'; }

no_jobs() { [[ -z $(timeout 5 squeue -h -o %i 2>/dev/null) ]]; }

start_slurm_daemons() {
    if ! running slurmctld "$RUN/slurmctld.pid"; then
        setsid slurmctld </dev/null >>"$LOG/slurmctld.log" 2>&1 9>&- ||
            fail "slurmctld did not start" "$LOG/slurmctld.log"
    fi
    wait_for 30 slurmctld ctld_up ||
        fail "slurmctld is not answering" "$LOG/slurmctld.log"
    if ! running slurmd "$RUN/slurmd.pid"; then
        setsid slurmd -N "$HOST" </dev/null >>"$LOG/slurmd.log" 2>&1 9>&- ||
            fail "slurmd did not start" "$LOG/slurmd.log"
    fi
}

# Wait until the node can run jobs; undrain it once if an earlier run left it drained or down.
wait_node() {
    local deadline state resumed=0
    deadline=$(($(date +%s) + START_TIMEOUT))
    while :; do
        state=$(node_state)
        case $state in
        idle | mixed | allocated | completing) return 0 ;;
        *drain* | down*)
            if ((!resumed)) && running slurmd "$RUN/slurmd.pid"; then
                log "node $HOST is $state: resuming it"
                timeout 10 scontrol update NodeName="$HOST" State=RESUME >/dev/null 2>&1 || true
                resumed=1
            fi
            ;;
        esac
        if (($(date +%s) >= deadline)); then
            timeout 10 scontrol show node "$HOST" >&2 || true
            fail "node $HOST not usable after ${START_TIMEOUT}s (state: ${state:-unknown})" \
                "$LOG/slurmctld.log" "$LOG/slurmd.log"
        fi
        if ! running slurmctld "$RUN/slurmctld.pid"; then
            fail "slurmctld died" "$LOG/slurmctld.log"
        fi
        if ! running slurmd "$RUN/slurmd.pid"; then
            fail "slurmd died" "$LOG/slurmd.log"
        fi
        sleep 0.2
    done
}

stop_slurm_daemons() {
    stop_daemon slurmd "$RUN/slurmd.pid"
    stop_daemon slurmctld "$RUN/slurmctld.pid"
}

# ---------------------------------------------------------------------------------------------------
# Subcommands

cmd_start() {
    local t0 installed=no changed=no
    t0=$(now_ms)
    ((EUID == 0)) || die "must run as root (starts daemons as root, may apt-get install)"
    mkdir -p "$STATE/etc" "$RUN" "$LOG" "$STATE/spool/ctld" "$STATE/spool/d"
    exec 9>"$STATE/lock"
    flock -w 900 9 || die "another cluster.sh holds $STATE/lock"

    if [[ -n $(missing_packages) ]]; then
        install_packages
        installed=yes
    fi
    start_munge
    start_mariadb
    write_dbd_conf
    if write_slurm_conf; then
        changed=yes
    fi
    link_etc_conf
    start_slurmdbd
    if [[ $changed == yes ]] && running slurmctld "$RUN/slurmctld.pid"; then
        log "slurm.conf changed: restarting slurmctld and slurmd"
        stop_slurm_daemons
    fi
    start_slurm_daemons
    wait_node
    local ms=$(($(now_ms) - t0))
    printf 'lr-slurm: cluster %s up, node %s %s, partitions low (default) + high, in %d.%d s (installed packages: %s)\n' \
        "$CLUSTER" "$HOST" "$(node_state)" $((ms / 1000)) $((ms % 1000 / 100)) "$installed"
}

cmd_stop() {
    local ids
    [[ -d $STATE ]] || return 0
    exec 9>"$STATE/lock"
    flock -w 120 9 || die "another cluster.sh holds $STATE/lock"
    # Cancel every job so that no test job survives into the next start (job state is kept on disk).
    if running slurmctld "$RUN/slurmctld.pid"; then
        ids=$(timeout 10 squeue -h -o '%i' 2>/dev/null | tr '\n' ' ') || ids=
        if [[ -n ${ids// /} ]]; then
            log "cancelling jobs: $ids"
            # shellcheck disable=SC2086 # word splitting wanted: one id per word
            timeout 10 scancel $ids 2>/dev/null || true
            wait_for 20 "jobs to end" no_jobs || true
        fi
    fi
    stop_slurm_daemons
    stop_daemon slurmdbd "$RUN/slurmdbd.pid"
    stop_daemon mariadbd "$DB_DIR/run/mysqld.pid"
    stop_daemon munged "$MUNGE_RUN/munged.pid"
    log "stopped"
}

cmd_status() {
    local ok=0 name file
    [[ -f $CONF ]] || {
        log "not configured ($CONF missing)"
        return 1
    }
    for name in munged mariadbd slurmdbd slurmctld slurmd; do
        case $name in
        munged) file=$MUNGE_RUN/munged.pid ;;
        mariadbd) file=$DB_DIR/run/mysqld.pid ;;
        *) file=$RUN/$name.pid ;;
        esac
        if [[ $name == munged ]] && munge_works; then
            continue # possibly the machine's own munged
        fi
        if ! running "$name" "$file"; then
            log "$name is not running"
            ok=1
        fi
    done
    if ((ok == 0)); then
        if node_usable; then
            log "up: node $HOST $(node_state)"
        else
            log "node $HOST not usable (state: $(node_state || true))"
            ok=1
        fi
    fi
    return "$ok"
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$CONF"
}

main() {
    case ${1:-} in
    start) cmd_start ;;
    stop) cmd_stop ;;
    status) cmd_status ;;
    env) cmd_env ;;
    *)
        printf 'usage: %s start|stop|status|env\n' "$0" >&2
        exit 2
        ;;
    esac
}

main "$@"
