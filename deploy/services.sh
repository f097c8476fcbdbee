#!/bin/sh
# services.sh - starts and stops the servers a fleet shares (PostgreSQL, Redis, RabbitMQ) for
# trying and for tests: each on a free loopback port, its data under DIR/<kind>, stopped by pid.
#
#   deploy/services.sh start KIND DIR [PORT]   KIND: postgres | redis | rabbitmq
#       starts it (installing the Debian package when missing), waits until it answers and
#       prints its URL on stdout; DIR/<kind>.url, DIR/<kind>.pid and DIR/<kind>.port keep them.
#   deploy/services.sh stop KIND DIR           stops what start started (by pid)
#   deploy/services.sh url KIND DIR            prints the URL of a running one
#   deploy/services.sh stop-all DIR
#
# Runs as root (the servers themselves run as their packages' users) or as an ordinary user
# for Redis. Messages go to stderr; only the URL goes to stdout.
set -eu

die() { echo "services.sh: $*" >&2; exit 1; }

# a TCP port nobody listens on, from a range kept clear of the kernel's ephemeral ports
free_port() {
    i=0
    while [ $i -lt 200 ]; do
        p=$(( ( $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 20000 ) + 20000 ))
        if ! ss -Htln "sport = :$p" 2>/dev/null | grep -q . &&
           ! ss -Htln "sport = :$((p + 1))" 2>/dev/null | grep -q . &&
           ! ss -Htln "sport = :$((p + 2))" 2>/dev/null | grep -q .; then
            echo "$p"; return 0
        fi
        i=$((i + 1))
    done
    die "no free port found"
}

need_pkg() { # need_pkg BINARY PACKAGE...
    command -v "$1" >/dev/null 2>&1 && return 0
    [ -x "$1" ] && return 0
    shift
    [ "$(id -u)" -eq 0 ] || die "missing $* and not root to install it"
    echo "services.sh: installing $*" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >&2 ||
        { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "$@" >&2; }
}

wait_for() { # wait_for SECONDS COMMAND...
    n=$(( $1 * 10 )); shift
    while [ $n -gt 0 ]; do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1; n=$((n - 1))
    done
    # stop-all finds the broker by this file, which the broker itself writes
    wait_for 20 test -s "$dir/rabbitmq.pid" || die "RabbitMQ wrote no pid file: see $r/out.log"
    return 1
}

pg_bin() {
    for d in /usr/lib/postgresql/*/bin; do [ -x "$d/pg_ctl" ] && { echo "$d"; return; }; done
    echo ""
}

# the folder must be reachable by the servers' users (a+rx, not 755: that would take the sticky
# bit and group write from a shared folder given as DIR)
open_dir() { mkdir -p "$1"; chmod a+rx "$1"; }

start_postgres() {
    dir=$1; port=$2
    [ -n "$(pg_bin)" ] || need_pkg /nonexistent postgresql
    bin=$(pg_bin)
    data=$dir/postgres
    mkdir -p "$data"
    run=""
    if [ "$(id -u)" -eq 0 ]; then chown postgres "$data"; run="runuser -u postgres --"; fi
    chmod 700 "$data"
    [ -f "$data/PG_VERSION" ] || $run "$bin/initdb" -D "$data" -A trust -U postgres -E UTF8 \
        --locale=C >"$dir/postgres.init.log" 2>&1 || die "initdb failed: see $dir/postgres.init.log"
    $run "$bin/pg_ctl" -D "$data" -l "$data/server.log" -w -t 30 \
        -o "-p $port -k $data -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=on" \
        start >&2 || die "PostgreSQL did not start: see $data/server.log"
    $run "$bin/psql" -h 127.0.0.1 -p "$port" -U postgres -d postgres -qtAc \
        "SELECT 1 FROM pg_database WHERE datname='autoreply'" | grep -q 1 ||
        $run "$bin/createdb" -h 127.0.0.1 -p "$port" -U postgres autoreply
    head -n 1 "$data/postmaster.pid" >"$dir/postgres.pid"
    echo "postgres://postgres@127.0.0.1:$port/autoreply"
}

start_redis() {
    dir=$1; port=$2
    need_pkg redis-server redis-server
    mkdir -p "$dir/redis"
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir/redis" --daemonize yes \
        --pidfile "$dir/redis.pid" --logfile "$dir/redis/redis.log" --save "" --appendonly no \
        --maxmemory 64mb --maxmemory-policy allkeys-lru >&2 || die "Redis did not start"
    wait_for 10 redis-cli -p "$port" ping || die "Redis does not answer: see $dir/redis/redis.log"
    echo "redis://127.0.0.1:$port/0"
}

rmq_env() { # rmq_env DIR PORT: the environment of one private RabbitMQ node
    echo "HOME=$1/rabbitmq RABBITMQ_NODENAME=rabbit-$2@localhost RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
RABBITMQ_NODE_PORT=$2 RABBITMQ_DIST_PORT=$(($2 + 1)) ERL_EPMD_PORT=$(($2 + 2)) \
ERL_EPMD_ADDRESS=127.0.0.1 RABBITMQ_MNESIA_BASE=$1/rabbitmq/mnesia \
RABBITMQ_LOG_BASE=$1/rabbitmq/log RABBITMQ_LOGS=$1/rabbitmq/log/rabbit.log \
RABBITMQ_ENABLED_PLUGINS_FILE=$1/rabbitmq/enabled_plugins \
RABBITMQ_CONFIG_FILE=$1/rabbitmq/rabbitmq RABBITMQ_PID_FILE=$1/rabbitmq.pid"
}

start_rabbitmq() {
    dir=$1; port=$2
    need_pkg /usr/lib/rabbitmq/bin/rabbitmq-server rabbitmq-server
    r=$dir/rabbitmq
    mkdir -p "$r/log"
    echo '[].' >"$r/enabled_plugins"
    printf 'listeners.tcp.default = 127.0.0.1:%s\nloopback_users = none\n' "$port" >"$r/rabbitmq.conf"
    run=""
    if [ "$(id -u)" -eq 0 ]; then chown -R rabbitmq "$r"; touch "$dir/rabbitmq.pid"
        chown rabbitmq "$dir/rabbitmq.pid"; run="runuser -u rabbitmq --"; fi
    env=$(rmq_env "$dir" "$port")
    # shellcheck disable=SC2086
    $run env $env /usr/lib/rabbitmq/bin/rabbitmq-server >"$r/out.log" 2>&1 &
    bg=$! # the start script (under runuser when root): it lives as long as the broker
    # the broker is up when its AMQP port takes connections; one that exits is not waited for
    n=600
    until ss -Htln "sport = :$port" 2>/dev/null | grep -q .; do
        kill -0 "$bg" 2>/dev/null || die "RabbitMQ exited: see $r/out.log and $r/log/"
        [ $n -gt 0 ] || die "RabbitMQ did not start in 60 s: see $r/out.log"
        sleep 0.1; n=$((n - 1))
    done
    # stop-all finds the broker by this file, which the broker itself writes
    wait_for 20 test -s "$dir/rabbitmq.pid" || die "RabbitMQ wrote no pid file: see $r/out.log"
    echo "$port" >"$dir/rabbitmq.port"
    echo "amqp://guest:guest@127.0.0.1:$port/"
}

stop_pid() { # stop_pid PIDFILE SECONDS
    [ -s "$1" ] || return 0
    pid=$(head -n 1 "$1")
    if kill "$pid" 2>/dev/null; then
        n=$(( $2 * 10 ))
        while [ $n -gt 0 ] && kill -0 "$pid" 2>/dev/null; do sleep 0.1; n=$((n - 1)); done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$1"
}

stop_kind() {
    kind=$1; dir=$2
    case $kind in
    postgres)
        bin=$(pg_bin)
        if [ -n "$bin" ] && [ -f "$dir/postgres/postmaster.pid" ]; then
            run=""; [ "$(id -u)" -eq 0 ] && run="runuser -u postgres --"
            $run "$bin/pg_ctl" -D "$dir/postgres" -m fast -w -t 20 stop >&2 || stop_pid "$dir/postgres.pid" 5
        fi
        rm -f "$dir/postgres.pid" ;;
    redis) stop_pid "$dir/redis.pid" 5 ;;
    rabbitmq)
        stop_pid "$dir/rabbitmq.pid" 15
        # the node's own port mapper daemon, found by its port (it runs as plain "epmd -daemon",
        # so no command line tells one node's epmd from another's)
        if [ -s "$dir/rabbitmq.port" ]; then
            ep=$(( $(cat "$dir/rabbitmq.port") + 2 ))
            ERL_EPMD_PORT=$ep epmd -kill >/dev/null 2>&1 || true
        fi ;;
    *) die "unknown kind '$kind'" ;;
    esac
    rm -f "$dir/$kind.url" "$dir/$kind.port"
}

cmd=${1:-}; kind=${2:-}; dir=${3:-}
case $cmd in
start)
    [ -n "$kind" ] && [ -n "$dir" ] || die "usage: services.sh start KIND DIR [PORT]"
    open_dir "$dir"; dir=$(cd "$dir" && pwd)
    if [ -s "$dir/$kind.url" ] && [ -s "$dir/$kind.pid" ] && kill -0 "$(head -n 1 "$dir/$kind.pid")" 2>/dev/null; then
        cat "$dir/$kind.url"; exit 0
    fi
    port=${4:-$(free_port)}
    # a given port must be free: a server that cannot bind it would look started
    ! ss -Htln "sport = :$port" 2>/dev/null | grep -q . || die "port $port is in use"
    case $kind in
    postgres) url=$(start_postgres "$dir" "$port") ;;
    redis) url=$(start_redis "$dir" "$port") ;;
    rabbitmq) url=$(start_rabbitmq "$dir" "$port") ;;
    *) die "unknown kind '$kind' (postgres, redis, rabbitmq)" ;;
    esac
    echo "$port" >"$dir/$kind.port"
    echo "$url" >"$dir/$kind.url"
    echo "$url" ;;
stop) [ -n "$dir" ] || die "usage: services.sh stop KIND DIR"; stop_kind "$kind" "$dir" ;;
url) cat "$dir/$kind.url" ;;
stop-all)
    dir=$kind
    [ -n "$dir" ] || die "usage: services.sh stop-all DIR"
    for k in rabbitmq redis postgres; do stop_kind "$k" "$dir"; done ;;
*) die "usage: services.sh start|stop|url KIND DIR | stop-all DIR" ;;
esac
