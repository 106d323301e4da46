#!/usr/bin/env bash
# A standalone ZooKeeper for lbkit's tests and for trying `lbkit watch` / `lbkit register`.
#
#   scripts/zookeeper.sh start    install Debian's `zookeeper` if missing, start a server on a free
#                                 loopback port with a fresh data dir, wait until `ruok` answers
#                                 `imok`, then print `export LBKIT_ZK=127.0.0.1:PORT` on stdout
#                                 (so `eval "$(scripts/zookeeper.sh start)"` works) and write the
#                                 address to $LBKIT_ZK_DIR/addr and target/zk.addr
#   scripts/zookeeper.sh restart  stop, then start again on the same port with the same data dir
#                                 (sessions and ephemeral nodes survive, as after a real restart)
#   scripts/zookeeper.sh install  only install Debian's `zookeeper` if missing
#   scripts/zookeeper.sh stop     stop the server by pid (SIGTERM, then SIGKILL after 10 s)
#   scripts/zookeeper.sh status   print the address and exit 0 when it answers, exit 1 otherwise
#
# State (zoo.cfg, data/, pid, port, addr, server.log) lives in $LBKIT_ZK_DIR, by default
# target/zookeeper in the repository; tests that restart their own server pass their own dir.
# Everything but the `export` line goes to stderr. Every wait is bounded.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DIR="${LBKIT_ZK_DIR:-$REPO/target/zookeeper}"
JARS=/usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
READY_WAIT_S=${LBKIT_ZK_READY_WAIT_S:-30} # the server is ready in 0.2-1.4 s here; JVM start under load is slower

log() { echo "zookeeper.sh: $*" >&2; }

install() {
    [[ -f /usr/share/java/zookeeper.jar ]] && return 0
    log "installing Debian's zookeeper package"
    local sudo=""
    [[ $(id -u) -ne 0 ]] && sudo="sudo"
    $sudo apt-get update -q >&2
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends zookeeper >&2
}

# Is something listening on 127.0.0.1:$1?
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# `ruok` -> `imok` on port $1 (ZooKeeper's four-letter readiness probe).
ruok() {
    local out
    out=$(timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1 && printf ruok >&3 && cat <&3" 2>/dev/null) || true
    [[ $out == imok ]]
}

running() { [[ -f $DIR/pid ]] && kill -0 "$(cat "$DIR/pid")" 2>/dev/null; }

free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 40000))
        listening "$p" || { echo "$p"; return 0; }
    done
    log "no free port found"
    return 1
}

write_cfg() { # port
    cat >"$DIR/zoo.cfg" <<CFG
# Written by scripts/zookeeper.sh: a standalone test server on loopback.
tickTime=500
minSessionTimeout=1000
maxSessionTimeout=10000
initLimit=10
syncLimit=5
dataDir=$DIR/data
clientPort=$1
clientPortAddress=127.0.0.1
maxClientCnxns=0
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,stat,mntr
CFG
}

launch() { # port
    local port=$1 waited=0
    write_cfg "$port"
    # -Xmx: tests run up to three servers beside two cargo builds on a 2-core machine.
    # Timestamps in server.log (slf4j-simple has none by default): a failed test's session
    # expiries and reconnections can then be lined up with the test's own log.
    setsid java -Xmx256m -Dorg.slf4j.simpleLogger.showDateTime=true \
        -Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS \
        -cp "$JARS" org.apache.zookeeper.server.ZooKeeperServerMain \
        "$DIR/zoo.cfg" >>"$DIR/server.log" 2>&1 </dev/null &
    echo $! >"$DIR/pid"
    while ! ruok "$port"; do
        if ! running; then
            log "server exited during start-up; last lines of $DIR/server.log:"
            tail -n 20 "$DIR/server.log" >&2
            return 1
        fi
        if ((waited >= READY_WAIT_S * 10)); then
            log "no imok after ${READY_WAIT_S}s; stopping it"
            stop
            return 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    echo "127.0.0.1:$port" >"$DIR/addr"
    echo "$port" >"$DIR/port"
    mkdir -p "$REPO/target"
    [[ -z ${LBKIT_ZK_DIR:-} ]] && echo "127.0.0.1:$port" >"$REPO/target/zk.addr"
    log "ready at 127.0.0.1:$port (pid $(cat "$DIR/pid"), state in $DIR)"
    echo "export LBKIT_ZK=127.0.0.1:$port"
}

start() {
    mkdir -p "$DIR"
    if running && [[ -f $DIR/addr ]] && ruok "$(cat "$DIR/port")"; then
        log "already running"
        echo "export LBKIT_ZK=$(cat "$DIR/addr")"
        return 0
    fi
    install
    rm -rf "$DIR/data"
    mkdir -p "$DIR/data"
    : >"$DIR/server.log"
    local tries
    for tries in 1 2 3; do # a port found free can be taken before java binds it
        launch "$(free_port)" && return 0
        log "start attempt $tries failed"
    done
    return 1
}

restart() {
    [[ -f $DIR/port ]] || { log "nothing to restart in $DIR"; return 1; }
    stop
    launch "$(cat "$DIR/port")"
}

stop() {
    if ! running; then
        log "not running"
        rm -f "$DIR/pid"
        return 0
    fi
    local pid waited=0
    pid=$(cat "$DIR/pid")
    kill -TERM "$pid" 2>/dev/null || true
    while kill -0 "$pid" 2>/dev/null; do
        if ((waited >= 100)); then
            log "pid $pid still alive after 10 s: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            break
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
    rm -f "$DIR/pid"
    log "stopped pid $pid"
}

status() {
    if running && [[ -f $DIR/port ]] && ruok "$(cat "$DIR/port")"; then
        echo "LBKIT_ZK=$(cat "$DIR/addr")"
        return 0
    fi
    log "not running"
    return 1
}

case "${1:-}" in
start) start ;;
install) install ;;
restart) restart ;;
stop) stop ;;
status) status ;;
*)
    echo "usage: $0 start|install|restart|stop|status" >&2
    exit 2
    ;;
esac
