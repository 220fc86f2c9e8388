#!/usr/bin/env bash
# A private single-node Apache Kafka broker (KRaft: broker + controller in one
# JVM) for jobs-engine development and tests. The jars come from Maven Central
# only, resolved by `mvn` from scripts/kafka/pom.xml into a cache outside the
# repo, so a fresh clone / `git clean` never re-downloads or touches them.
#
#   scripts/kafka.sh fetch|start|stop|status|bootstrap|pause|resume|reset
#   scripts/kafka.sh topics ARGS...     TopicCommand against this broker
#   scripts/kafka.sh run MAINCLASS ARGS...   any Kafka CLI from the same jars
#   scripts/kafka.sh classpath          prints the java -cp value
#
#   JOBS_KAFKA_VERSION      Kafka version (default 4.4.0)
#   JOBS_KAFKA_CACHE        jar cache (default $HOME/.cache/jobs-engine/kafka/<version>)
#   JOBS_KAFKA_DIR          data dir / log.dirs (default $HOME/.cache/jobs-engine/kafka-data);
#                           <name>.pid, <name>.log, <name>.properties sit beside it
#   JOBS_KAFKA_PORT         PLAINTEXT port on 127.0.0.1 (default 19092); the
#                           controller listens on port+1
#   JOBS_KAFKA_AUTO_CREATE  auto.create.topics.enable (default false)
#   JOBS_KAFKA_START_TIMEOUT  seconds `start` waits for readiness (default 90)
#   JOBS_KAFKA_JAVA_OPTS    extra JVM options for the broker
#   JOBS_KAFKA_MVN_ARGS     extra mvn arguments for `fetch` (e.g. -s settings.xml)
#
# `start` is idempotent and prints the bootstrap address as its last line.
# `pause`/`resume` SIGSTOP/SIGCONT the broker: tests use them to simulate a
# hung broker (connections are still accepted by the kernel, nothing answers).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
HOME="${HOME:-$(cd ~ && pwd)}"
VERSION="${JOBS_KAFKA_VERSION:-4.4.0}"
CACHE="$(realpath -m "${JOBS_KAFKA_CACHE:-$HOME/.cache/jobs-engine/kafka/$VERSION}")"
LIB="$CACHE/lib"
STAMP="$CACHE/.fetched"
DATA="$(realpath -m "${JOBS_KAFKA_DIR:-$HOME/.cache/jobs-engine/kafka-data}")"
PARENT="$(dirname "$DATA")"
NAME="$(basename "$DATA")"   # several data dirs may share one parent
PIDFILE="$PARENT/$NAME.pid"
LOG="$PARENT/$NAME.log"
CONF="$PARENT/$NAME.properties"
PORT="${JOBS_KAFKA_PORT:-19092}"
CPORT=$((PORT + 1))
BOOTSTRAP="127.0.0.1:$PORT"
AUTO_CREATE="${JOBS_KAFKA_AUTO_CREATE:-false}"
START_TIMEOUT="${JOBS_KAFKA_START_TIMEOUT:-90}"
JAVA=
TOOL=()

die() { echo "kafka.sh: $*" >&2; exit 1; }
note() { echo "kafka.sh: $*" >&2; }

[[ "$PORT" =~ ^[0-9]+$ ]] || die "JOBS_KAFKA_PORT must be a number, got '$PORT'"
[[ "$AUTO_CREATE" == true || "$AUTO_CREATE" == false ]] \
    || die "JOBS_KAFKA_AUTO_CREATE must be true or false, got '$AUTO_CREATE'"

# A fresh Debian machine may lack Java or Maven: install them (needs root).
apt_install() {
    [[ $EUID -eq 0 ]] || die "missing $*: run as root or: apt-get install -y $*"
    note "installing $* with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q "$@" >&2
}

java_major() {
    "$1" -XshowSettings:properties -version 2>&1 \
        | awk -F'= ' '/java.specification.version/ {print $2; exit}'
}

# Kafka 4.x brokers need Java 17+. Prefer JAVA_HOME, then Debian's 17.
find_java() {
    local c v
    for c in ${JAVA_HOME:+"$JAVA_HOME/bin/java"} /usr/lib/jvm/java-17-openjdk-*/bin/java \
             "$(command -v java || true)" /usr/lib/jvm/*/bin/java; do
        [[ -n "$c" && -x "$c" ]] || continue
        v="$(java_major "$c")"
        if [[ "$v" =~ ^[0-9]+$ ]] && ((v >= 17)); then echo "$c"; return 0; fi
    done
    return 1
}

need_java() {
    [[ -n "$JAVA" ]] && return 0
    JAVA="$(find_java)" && return 0
    apt_install openjdk-17-jre-headless
    JAVA="$(find_java)" || die "no Java 17+ found even after installing openjdk-17-jre-headless"
}

# Jars: a flat lib/ of everything kafka_2.13 + kafka-tools need at run time.
# The stamp records version + pom hash: a changed pom re-fetches.
want_stamp() { echo "$VERSION $(sha256sum <"$HERE/kafka/pom.xml" | cut -d' ' -f1)"; }
fetched() { [[ -f "$STAMP" && "$(cat "$STAMP")" == "$(want_stamp)" ]]; }

fetch() {
    fetched && return 0
    need_java
    command -v mvn >/dev/null 2>&1 || apt_install maven
    mkdir -p "$CACHE"
    exec 9>"$CACHE/.lock"
    flock 9                      # two concurrent starts fetch once
    if fetched; then exec 9>&-; return 0; fi
    local tmp="$CACHE/lib.tmp.$$" t0=$SECONDS
    rm -rf "$tmp"
    note "fetching Kafka $VERSION jars from Maven Central into $LIB"
    # mvn finds Java through JAVA_HOME; give it the one we checked.
    local jhome="${JAVA_HOME:-$(dirname "$(dirname "$(readlink -f "$JAVA")")")}"
    # shellcheck disable=SC2086  # JOBS_KAFKA_MVN_ARGS is a list of words
    # The sed strips the ANSI resets Debian's Maven 3.8 prints even in -B -q
    # mode (no option turns them off); pipefail keeps mvn's exit status.
    if ! (cd "$HERE/kafka" && JAVA_HOME="$jhome" mvn -B -q -f pom.xml \
            -Dkafka.version="$VERSION" ${JOBS_KAFKA_MVN_ARGS:-} \
            dependency:copy-dependencies -DincludeScope=runtime \
            -DoutputDirectory="$tmp" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' >&2); then
        rm -rf "$tmp"
        die "mvn could not resolve Kafka $VERSION (errors above; check JOBS_KAFKA_VERSION)"
    fi
    local j
    for j in "kafka_2.13-$VERSION.jar" "kafka-tools-$VERSION.jar" "kafka-server-$VERSION.jar"; do
        [[ -f "$tmp/$j" ]] || { rm -rf "$tmp"; die "mvn finished but $j is missing"; }
    done
    rm -rf "$LIB"
    mv "$tmp" "$LIB"
    want_stamp >"$STAMP"
    note "fetched $(find "$LIB" -name '*.jar' | wc -l) jars, $(du -sh "$LIB" | cut -f1), in $((SECONDS - t0)) s"
    exec 9>&-
}

# Run a Kafka CLI class from the cache: small heap, C1 only (starts faster),
# warnings to stderr so stdout is the tool's output.
tool_cmd() {
    TOOL=("$JAVA" -Xmx256m -XX:TieredStopAtLevel=1 -XX:+UseSerialGC -Djava.awt.headless=true
          -Dlog4j2.configurationFile="$HERE/kafka/tools-log4j2.properties" -cp "$LIB/*")
}
run_tool() {
    need_java
    fetch
    tool_cmd
    "${TOOL[@]}" "$@"
}

broker_pid() {
    local pid
    [[ -r "$PIDFILE" ]] || return 1
    pid="$(cat "$PIDFILE")"
    [[ "$pid" =~ ^[0-9]+$ ]] || return 1
    echo "$pid"
}

proc_state() { sed -n 's/^State:[[:space:]]*\(.\).*/\1/p' "/proc/$1/status" 2>/dev/null; }

# Alive = the pid file's process exists, is not a zombie, and is *our* broker
# (same config path on its command line), so a recycled pid is not mistaken.
is_running() {
    local pid st
    pid="$(broker_pid)" || return 1
    st="$(proc_state "$pid")"
    [[ -n "$st" && "$st" != Z ]] || return 1
    tr '\0' '\n' <"/proc/$pid/cmdline" 2>/dev/null | grep -qxF "$CONF"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

write_conf() {
    # Rewritten at every start so changed settings here take effect.
    cat >"$CONF" <<EOF
# Managed by scripts/kafka.sh -- edits are overwritten at start.
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$CPORT
listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
advertised.listeners=PLAINTEXT://127.0.0.1:$PORT,CONTROLLER://127.0.0.1:$CPORT
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
log.dirs=$DATA
num.partitions=1
default.replication.factor=1
auto.create.topics.enable=$AUTO_CREATE
# One broker: internal topics cannot have more than one replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
# Tests start consumer groups often: do not wait 3 s for more members.
group.initial.rebalance.delay.ms=0
EOF
}

# First use of a data dir: give it a cluster id and the KRaft metadata log.
# Static quorum (controller.quorum.voters), so no --standalone.
format_if_needed() {
    [[ -f "$DATA/meta.properties" ]] && return 0
    local cid
    mkdir -p "$DATA"
    cid="$(run_tool kafka.tools.StorageTool random-uuid)" || die "StorageTool random-uuid failed"
    run_tool kafka.tools.StorageTool format -t "$cid" -c "$CONF" --ignore-formatted >&2 \
        || die "could not format $DATA"
}

# Ready = the broker answers a metadata request (TopicCommand --list through
# the admin client), not merely an open port.
wait_ready() {
    local deadline=$((SECONDS + START_TIMEOUT)) left
    tool_cmd
    while ((SECONDS < deadline)); do
        is_running || return 2
        if port_open "$PORT"; then
            left=$((deadline - SECONDS))
            ((left > 0)) || break
            if timeout "$left" "${TOOL[@]}" org.apache.kafka.tools.TopicCommand \
                    --bootstrap-server "$BOOTSTRAP" --list >/dev/null 2>&1; then
                return 0
            fi
        fi
        sleep 0.5
    done
    return 1
}

# SIGCONT first: a paused (SIGSTOPped) JVM would not act on SIGTERM.
kill_broker() {
    local pid="$1" _
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do
        is_running || return 0
        sleep 0.5
    done
    note "broker (pid $pid) still up after 30 s, sending SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do
        is_running || return 0
        sleep 0.25
    done
    die "broker (pid $pid) survived SIGKILL"
}

# One start/stop/reset at a time per data dir (a start holds it while waiting).
lock_data() {
    mkdir -p "$PARENT"
    exec 8>"$PARENT/$NAME.lock"
    flock -w $((START_TIMEOUT + 60)) 8 || die "$PARENT/$NAME.lock held by another kafka.sh for too long"
}

start() {
    need_java
    fetch
    lock_data
    local pid rc p
    if is_running; then
        pid="$(broker_pid)"
        if [[ "$(proc_state "$pid")" == T ]]; then
            note "broker (pid $pid) was paused, resuming it"
            kill -CONT "$pid"
        fi
        wait_ready || { tail -n 40 "$LOG" >&2 || true
            die "broker (pid $pid) is running but not ready on $BOOTSTRAP after ${START_TIMEOUT} s (log: $LOG)"; }
        echo "$BOOTSTRAP"
        return 0
    fi
    rm -f "$PIDFILE"
    for p in "$PORT" "$CPORT"; do
        ! port_open "$p" || die "127.0.0.1:$p is already in use by another process (set JOBS_KAFKA_PORT)"
    done

    write_conf
    format_if_needed
    if [[ -f "$LOG" ]]; then mv -f "$LOG" "$LOG.1"; fi   # keep the previous run's log
    local t0=$SECONDS
    # setsid: its own session, so a Ctrl-C or a test runner killing its
    # process group does not take the broker down. The inner shell writes its
    # own pid, then execs java, so the pid file is the JVM's pid either way.
    # shellcheck disable=SC2086,SC2016  # JAVA_OPTS: a list of words; $$: inner shell's
    nohup setsid bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$PIDFILE" \
        "$JAVA" -Xmx512m -Xms256m -XX:+UseG1GC -XX:MaxGCPauseMillis=20 \
        -XX:InitiatingHeapOccupancyPercent=35 -XX:+ExplicitGCInvokesConcurrent \
        -Djava.awt.headless=true -Dkafka.logs.dir="$PARENT" \
        -Dlog4j2.configurationFile="$HERE/kafka/log4j2.properties" \
        ${JOBS_KAFKA_JAVA_OPTS:-} -cp "$LIB/*" kafka.Kafka "$CONF" \
        >>"$LOG" 2>&1 </dev/null 8>&- 9>&- &   # not our lock fds: they'd outlive us
    for _ in $(seq 1 50); do [[ -s "$PIDFILE" ]] && break; sleep 0.1; done
    pid="$(broker_pid)" || die "broker did not start (log: $LOG)"

    rc=0
    wait_ready || rc=$?
    if ((rc != 0)); then
        tail -n 40 "$LOG" >&2 || true
        if ((rc == 2)); then
            rm -f "$PIDFILE"
            die "broker exited during startup (log: $LOG)"
        fi
        kill_broker "$pid"      # do not leave a half-started broker on the ports
        rm -f "$PIDFILE"
        die "broker not ready on $BOOTSTRAP after ${START_TIMEOUT} s, stopped it (log: $LOG)"
    fi
    note "broker ready on $BOOTSTRAP in $((SECONDS - t0)) s (pid $pid, data $DATA)"
    echo "$BOOTSTRAP"
}

stop() {
    lock_data
    if is_running; then
        kill_broker "$(broker_pid)"
        rm -f "$PIDFILE"
        echo "stopped ($DATA)"
    else
        rm -f "$PIDFILE"
        echo "not running ($DATA)"
    fi
}

status() {
    if is_running; then
        local pid
        pid="$(broker_pid)"
        if [[ "$(proc_state "$pid")" == T ]]; then
            echo "paused: $BOOTSTRAP (pid $pid, $DATA)"
        else
            echo "running: $BOOTSTRAP (pid $pid, $DATA)"
        fi
    else
        echo "stopped ($DATA)"
        return 3  # LSB "program is not running", as postgres.sh status
    fi
}

signal_broker() {
    is_running || die "broker not running ($DATA)"
    kill "-$1" "$(broker_pid)"
    echo "$2: $BOOTSTRAP (pid $(broker_pid))"
}

reset() {
    stop
    rm -rf "$DATA"
    echo "removed $DATA"
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
    fetch) fetch; echo "$LIB" ;;
    start) start ;;
    stop) stop ;;
    status) status ;;
    bootstrap) echo "$BOOTSTRAP" ;;
    pause) signal_broker STOP paused ;;
    resume) signal_broker CONT resumed ;;
    reset) reset ;;
    topics) run_tool org.apache.kafka.tools.TopicCommand --bootstrap-server "$BOOTSTRAP" "$@" ;;
    run) [[ $# -gt 0 ]] || die "usage: $0 run MAINCLASS [ARGS...]"; run_tool "$@" ;;
    classpath) fetch; echo "$LIB/*" ;;
    *) echo "usage: $0 fetch|start|stop|status|bootstrap|pause|resume|reset|topics ARGS|run CLASS ARGS|classpath" >&2
       exit 2 ;;
esac
