#!/bin/sh
# fleet.sh - a whole autoreply fleet on one machine, for trying it and for tests: PostgreSQL,
# Redis and RabbitMQ (deploy/services.sh), N `autoreply serve` instances on free loopback ports
# sharing them, and nginx in front with the settings of deploy/nginx/autoreply.conf.
#
#   fleet.sh up --instances N --port P --dir DIR [--threads T] [--bin PATH] [--no-backends]
#               [--wait S] [-- more serve flags]
#       installs what is missing (Debian packages, as root), starts everything with its state,
#       data and logs under DIR, prints one line per process ("NAME pid PID URL") and returns
#       once each instance and nginx answer GET /health with 200 (else stops what it started,
#       shows the log and fails).
#   fleet.sh down --dir DIR        stops everything `up` started, by pid (instances: SIGTERM,
#                                  SIGKILL after --grace S, 15 by default); idempotent
#   fleet.sh kill I --dir DIR      SIGKILL to instance I (i2 or 2): a crash, for trying failover
#   fleet.sh start I --dir DIR     starts instance I again, same port and flags
#   fleet.sh status --dir DIR      one line per process, running or stopped (exit 3: not all run)
#
# Instance iK: data dir DIR/iK, log DIR/iK.log, pid DIR/iK.pid, port DIR/iK.port, its serve
# command line DIR/iK.cmd; nginx: DIR/nginx/ (nginx.conf, autoreply.conf, logs, pid). Any shell
# can run kill/start/status/down later from those files. Progress goes to stderr; only the
# process lines go to stdout.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
services="$here/services.sh"

# serve's flags for the shared servers (one place to change if serve renames them)
FLAG_STORE=--store
FLAG_CACHE=--cache
FLAG_QUEUE=--queue
FLAG_NAME=--instance-name

say() { echo "fleet.sh: $*" >&2; }
die() { echo "fleet.sh: $*" >&2; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: fleet.sh up --instances N --port P --dir DIR [--threads T] [--bin PATH] [--no-backends]
                   [--wait S] [-- more serve flags]
       fleet.sh down --dir DIR [--grace S]
       fleet.sh kill I --dir DIR
       fleet.sh start I --dir DIR [--wait S]
       fleet.sh status --dir DIR
EOF
    exit 2
}

# ---- helpers ---------------------------------------------------------------------------------

is_uint() { case $1 in '' | *[!0-9]*) return 1 ;; *) return 0 ;; esac; }

# one argument quoted for sh: 'it'\''s'
quote() { printf "'%s'" "$(printf '%s' "$1" | sed "s/'/'\\\\''/g")"; }

need_pkg() { # need_pkg BINARY PACKAGE: installs PACKAGE when BINARY is neither on PATH nor a path
    command -v "$1" >/dev/null 2>&1 && return 0
    [ -x "$1" ] && return 0
    [ "$(id -u)" -eq 0 ] || die "missing $2 and not root to install it (apt-get install $2)"
    say "installing $2"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$2" >&2 ||
        { apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends "$2" >&2; } ||
        die "cannot install $2"
}

nginx_bin() {
    if command -v nginx >/dev/null 2>&1; then command -v nginx; else echo /usr/sbin/nginx; fi
}

port_busy() { ss -Htln "sport = :$1" 2>/dev/null | grep -q .; }

# fp = a free TCP port, not one of those already handed out ($taken); a variable, not output,
# so that $taken grows in this shell
taken=""
free_port() {
    i=0
    while [ $i -lt 200 ]; do
        fp=$(( ( $(od -An -N2 -tu2 /dev/urandom | tr -d ' ') % 20000 ) + 20000 ))
        case " $taken " in *" $fp "*) ;; *)
            if ! port_busy "$fp"; then taken="$taken $fp"; return 0; fi ;;
        esac
        i=$((i + 1))
    done
    die "no free port found"
}

# alive PID: the process exists and is not a zombie
alive() {
    is_uint "${1:-}" || return 1
    kill -0 "$1" 2>/dev/null || return 1
    st=$(sed -n 's/^[0-9]* (.*) \([A-Za-z]\).*/\1/p' "/proc/$1/stat" 2>/dev/null || true)
    [ "$st" != Z ]
}

# the pid in PIDFILE when that process still runs and its command line holds MARK (so that a
# stale file never names a process that took the pid over); else nothing
live_pid() { # live_pid PIDFILE MARK
    [ -s "$1" ] || return 0
    pid=$(head -n 1 "$1")
    alive "$pid" || return 0
    if [ -r "/proc/$pid/cmdline" ]; then
        tr '\0' ' ' <"/proc/$pid/cmdline" | grep -qF -- "$2" || return 0
    fi
    echo "$pid"
}

gone() { # gone PID SECONDS: waits up to SECONDS for PID to end; fails if it still runs
    n=$(( $2 * 20 ))
    while alive "$1"; do
        [ $n -gt 0 ] || return 1
        sleep 0.05; n=$((n - 1))
    done
}

health() { # health URL: GET URL/health answers 200
    [ "$(curl -s -o /dev/null -m 3 -w '%{http_code}' "$1/health" 2>/dev/null || true)" = 200 ]
}

show_log() { # show_log FILE: its last lines on stderr
    [ -s "$1" ] || { echo "  ($1 is empty)" >&2; return 0; }
    echo "---- last lines of $1:" >&2
    tail -n 25 "$1" | sed 's/^/  /' >&2
    echo "----" >&2
}

# wait_health NAME PID URL LOG DEADLINE: 0 once URL/health answers 200; else says why and fails
wait_health() {
    while :; do
        if ! alive "$2"; then
            say "$1 (pid $2, $3) exited before answering /health"
            show_log "$4"; return 1
        fi
        health "$3" && return 0
        if [ "$(date +%s)" -ge "$5" ]; then
            say "$1 (pid $2, $3) did not answer GET /health with 200 in time (--wait)"
            show_log "$4"; return 1
        fi
        sleep 0.2
    done
}

# ---- state -----------------------------------------------------------------------------------

load_state() {
    [ -s "$dir/fleet.conf" ] || die "no fleet in $dir (fleet.sh up --dir $dir ...)"
    # shellcheck disable=SC1090,SC1091
    . "$dir/fleet.conf"
}

inst_name() { # i2 or 2 -> i2, checked against the fleet's instances
    case $1 in i*) n=${1#i} ;; *) n=$1 ;; esac
    is_uint "$n" && [ "$n" -ge 1 ] && [ "$n" -le "$N" ] ||
        die "no instance '$1' in $dir (i1..i$N)"
    echo "i$n"
}

# ---- instances -------------------------------------------------------------------------------

inst_mark() { echo "--port $(cat "$dir/$1.port") "; }

# starts instance NAME from DIR/NAME.cmd, in its own session (a Ctrl-C in the shell that ran
# fleet.sh does not reach it), stdin closed, output appended to its log
spawn_instance() {
    name=$1
    eval "set -- $(cat "$dir/$name.cmd")"
    echo "---- $(date '+%F %T') fleet.sh starts $name" >>"$dir/$name.log"
    setsid "$@" </dev/null >>"$dir/$name.log" 2>&1 &
    echo $! >"$dir/$name.pid"
}

stop_instances() { # stop_instances GRACE NAME...: SIGTERM to all, SIGKILL after GRACE seconds
    grace=$1; shift
    pids=""
    for name in "$@"; do
        [ -s "$dir/$name.port" ] || continue
        pid=$(live_pid "$dir/$name.pid" "$(inst_mark "$name")")
        if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; pids="$pids $pid"; fi
    done
    end=$(( $(date +%s) + grace ))
    for pid in $pids; do
        while alive "$pid" && [ "$(date +%s)" -lt "$end" ]; do sleep 0.1; done
        if alive "$pid"; then
            say "pid $pid did not stop within ${grace} s of SIGTERM: SIGKILL"
            kill -KILL "$pid" 2>/dev/null || true
            gone "$pid" 5 || { say "pid $pid survives SIGKILL (another user's?)"; stuck=1; }
        fi
    done
    for name in "$@"; do rm -f "$dir/$name.pid"; done
}

# ---- nginx -----------------------------------------------------------------------------------

# DIR/nginx/autoreply.conf: the shipped file with the real instances and listen address;
# DIR/nginx/nginx.conf: a main config keeping pid, logs and temporary files under DIR/nginx
gen_nginx() {
    nd=$dir/nginx
    mkdir -p "$nd/tmp"
    : >"$nd/instances.inc"
    k=1
    while [ $k -le "$N" ]; do
        echo "    server 127.0.0.1:$(cat "$dir/i$k.port") weight=1 max_fails=3 fail_timeout=10s;" \
            >>"$nd/instances.inc"
        k=$((k + 1))
    done
    awk -v inc="$nd/instances.inc" -v listen="    listen 127.0.0.1:$PORT;" '
        /^[ \t]*# -+ BEGIN instances/ { print; while ((getline line < inc) > 0) print line; skip = 1; next }
        /^[ \t]*# -+ END instances/   { skip = 0; ends++; print; next }
        skip              { next }
        !done && /^[ \t]*listen[ \t]/ { print listen; done = 1; next }
        { print }
        END { if (ends != 1 || !done) exit 3 }' "$root/deploy/nginx/autoreply.conf" \
        >"$nd/autoreply.conf" ||
        die "deploy/nginx/autoreply.conf lacks its '# ---- BEGIN instances' / '# ---- END instances' lines or a listen line"
    cat >"$nd/nginx.conf" <<EOF
# generated by deploy/fleet.sh for the fleet in $dir
worker_processes 2;
pid "$nd/nginx.pid";
error_log "$nd/error.log" warn;
events { worker_connections 1024; }
http {
    default_type application/octet-stream;
    client_body_temp_path "$nd/tmp/client_body";
    proxy_temp_path "$nd/tmp/proxy";
    fastcgi_temp_path "$nd/tmp/fastcgi";
    uwsgi_temp_path "$nd/tmp/uwsgi";
    scgi_temp_path "$nd/tmp/scgi";
    include "$nd/autoreply.conf";
    access_log "$nd/access.log" autoreply;
}
EOF
}

nginx_mark() { echo "$dir/nginx/nginx.conf"; }

start_nginx() {
    nd=$dir/nginx
    ngx=$(nginx_bin)
    if ! "$ngx" -t -q -c "$nd/nginx.conf" -p "$nd" -e "$nd/error.log" >"$nd/test.log" 2>&1; then
        say "nginx -t rejects $nd/nginx.conf:"
        sed 's/^/  /' "$nd/test.log" >&2
        return 1
    fi
    rm -f "$nd/nginx.pid"
    if ! "$ngx" -c "$nd/nginx.conf" -p "$nd" -e "$nd/error.log" >"$nd/start.log" 2>&1; then
        say "nginx did not start"; show_log "$nd/start.log"; show_log "$nd/error.log"; return 1
    fi
    n=50
    while [ $n -gt 0 ] && ! [ -s "$nd/nginx.pid" ]; do sleep 0.1; n=$((n - 1)); done
    [ -s "$nd/nginx.pid" ] || { say "nginx wrote no pid file"; show_log "$nd/error.log"; return 1; }
}

stop_nginx() {
    pid=$(live_pid "$dir/nginx/nginx.pid" "$(nginx_mark)")
    if [ -n "$pid" ]; then
        kill -QUIT "$pid" 2>/dev/null || true # graceful: finishes requests in progress
        n=100
        while [ $n -gt 0 ] && alive "$pid"; do sleep 0.1; n=$((n - 1)); done
        if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; gone "$pid" 2 || true; fi
        if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
        gone "$pid" 5 || { say "nginx (pid $pid) survives SIGKILL (another user's?)"; stuck=1; }
    fi
    rm -f "$dir/nginx/nginx.pid"
}

# ---- commands --------------------------------------------------------------------------------

all_instances() {
    k=1
    while [ $k -le "$N" ]; do echo "i$k"; k=$((k + 1)); done
}

do_down() {
    grace=${1:-15}
    stuck=0
    stop_nginx
    # shellcheck disable=SC2046
    stop_instances "$grace" $(all_instances)
    if [ -e "$dir/postgres.pid" ] || [ -e "$dir/redis.pid" ] || [ -e "$dir/rabbitmq.pid" ] ||
       [ -e "$dir/postgres/postmaster.pid" ]; then
        sh "$services" stop-all "$dir" >&2 || { say "services.sh stop-all reported a failure"; stuck=1; }
    fi
    return $stuck
}

anything_runs() {
    [ -s "$dir/fleet.conf" ] || return 1
    (
        load_state
        [ -n "$(live_pid "$dir/nginx/nginx.pid" "$(nginx_mark)")" ] && exit 0
        for name in $(all_instances); do
            [ -s "$dir/$name.port" ] || continue
            [ -n "$(live_pid "$dir/$name.pid" "$(inst_mark "$name")")" ] && exit 0
        done
        for k in postgres redis rabbitmq; do
            [ -s "$dir/$k.pid" ] && alive "$(head -n 1 "$dir/$k.pid")" && exit 0
        done
        exit 1
    )
}

cmd_up() {
    [ -n "$N" ] && [ -n "$PORT" ] || usage
    is_uint "$N" && [ "$N" -ge 1 ] && [ "$N" -le 64 ] || die "--instances: 1 to 64, not '$N'"
    is_uint "$PORT" && [ "$PORT" -ge 1 ] && [ "$PORT" -le 65535 ] || die "--port: 1 to 65535"
    is_uint "$THREADS" && [ "$THREADS" -ge 1 ] || die "--threads: a positive number, not '$THREADS'"
    is_uint "$WAIT" || die "--wait: seconds, not '$WAIT'"
    [ -x "$BIN" ] || die "$BIN is not an executable (build it with make, or give --bin PATH)"
    BIN=$(cd "$(dirname "$BIN")" && pwd)/$(basename "$BIN")
    help=$("$BIN" serve --help 2>&1 || true)
    if [ "$BACKENDS" = 1 ]; then
        for f in "$FLAG_STORE" "$FLAG_CACHE" "$FLAG_QUEUE"; do
            printf '%s\n' "$help" | grep -q -- "$f " ||
                die "$BIN serve has no $f flag: this build cannot share servers (--no-backends starts the instances without them)"
        done
    fi
    name_flag=1
    if ! printf '%s\n' "$help" | grep -q -- "$FLAG_NAME "; then
        say "warning: $BIN serve has no $FLAG_NAME: answers will not say which instance gave them"
        name_flag=0
    fi
    if anything_runs; then die "a fleet already runs in $dir (fleet.sh down --dir $dir first)"; fi
    port_busy "$PORT" && die "port $PORT is in use"

    need_pkg curl curl
    need_pkg "$(nginx_bin)" nginx
    # the folder must be reachable by the servers' users and nginx's workers
    chmod a+rx "$dir"
    if [ "$(id -u)" -eq 0 ] && ! runuser -u nobody -- test -x "$dir" 2>/dev/null; then
        die "$dir is not reachable by nginx's workers (user nobody): use a folder under /tmp or /srv"
    fi

    cat >"$dir/fleet.conf" <<EOF
N=$N
PORT=$PORT
BACKENDS=$BACKENDS
WAIT=$WAIT
EOF
    # from here on a failure stops whatever was started
    trap 'say "stopping what was started"; do_down 5 || true; exit 1' INT TERM
    fail() { say "$*"; say "stopping what was started"; do_down 5 || true; exit 1; }

    taken=" $PORT"
    store="" cache="" queue=""
    if [ "$BACKENDS" = 1 ]; then
        for k in postgres redis rabbitmq; do
            url=$(sh "$services" start "$k" "$dir") || fail "$k did not start"
            echo "$k pid $(head -n 1 "$dir/$k.pid") $url"
            case $k in postgres) store=$url ;; redis) cache=$url ;; rabbitmq) queue=$url ;; esac
        done
    fi

    k=1
    while [ $k -le "$N" ]; do
        name=i$k
        free_port
        p=$fp
        echo "$p" >"$dir/$name.port"
        echo "http://127.0.0.1:$p" >"$dir/$name.url"
        mkdir -p "$dir/$name"
        : >"$dir/$name.log"
        cmd="$(quote "$BIN") serve --host 127.0.0.1 --port $p --data-dir $(quote "$dir/$name")"
        # every connection comes from nginx's one address: no per-address cap (idle ones are
        # still closed when the instance nears --max-conns)
        cmd="$cmd -t $THREADS --max-conns-per-ip 0"
        [ $name_flag = 1 ] && cmd="$cmd $FLAG_NAME $name"
        if [ "$BACKENDS" = 1 ]; then
            cmd="$cmd $FLAG_STORE $(quote "$store") $FLAG_CACHE $(quote "$cache")"
            cmd="$cmd $FLAG_QUEUE $(quote "$queue")"
        fi
        cmd="$cmd$EXTRA"
        echo "$cmd" >"$dir/$name.cmd"
        spawn_instance "$name"
        k=$((k + 1))
    done
    deadline=$(( $(date +%s) + WAIT ))
    for name in $(all_instances); do
        pid=$(cat "$dir/$name.pid")
        wait_health "$name" "$pid" "$(cat "$dir/$name.url")" "$dir/$name.log" "$deadline" ||
            fail "$name is not serving"
        echo "$name pid $pid $(cat "$dir/$name.url")"
    done

    gen_nginx
    start_nginx || fail "nginx is not serving"
    pid=$(head -n 1 "$dir/nginx/nginx.pid")
    echo "http://127.0.0.1:$PORT" >"$dir/nginx.url"
    wait_health nginx "$pid" "http://127.0.0.1:$PORT" "$dir/nginx/error.log" \
        $(( $(date +%s) + 10 )) || fail "nginx is not serving"
    echo "nginx pid $pid http://127.0.0.1:$PORT"
    trap - INT TERM
}

cmd_kill() {
    name=$(inst_name "$1")
    pid=$(live_pid "$dir/$name.pid" "$(inst_mark "$name")")
    [ -n "$pid" ] || { say "$name is not running"; return 0; }
    kill -KILL "$pid" 2>/dev/null || true
    gone "$pid" 5 || die "$name (pid $pid) survives SIGKILL (another user's?)"
    rm -f "$dir/$name.pid"
    echo "$name pid $pid killed"
}

cmd_start() {
    name=$(inst_name "$1")
    pid=$(live_pid "$dir/$name.pid" "$(inst_mark "$name")")
    if [ -z "$pid" ]; then
        port_busy "$(cat "$dir/$name.port")" &&
            die "$name's port $(cat "$dir/$name.port") is taken by another process"
        spawn_instance "$name"
        pid=$(cat "$dir/$name.pid")
        wait_health "$name" "$pid" "$(cat "$dir/$name.url")" "$dir/$name.log" \
            $(( $(date +%s) + WAIT )) || exit 1
    fi
    echo "$name pid $pid $(cat "$dir/$name.url")"
}

cmd_status() {
    all=0
    line() { # line NAME PID URL
        if [ -n "$2" ]; then echo "$1 pid $2 $3 running"; else echo "$1 - $3 stopped"; all=3; fi
    }
    for k in postgres redis rabbitmq; do
        [ -s "$dir/$k.url" ] || continue
        pid=""
        [ -s "$dir/$k.pid" ] && alive "$(head -n 1 "$dir/$k.pid")" && pid=$(head -n 1 "$dir/$k.pid")
        line "$k" "$pid" "$(cat "$dir/$k.url")"
    done
    for name in $(all_instances); do
        [ -s "$dir/$name.port" ] || continue
        line "$name" "$(live_pid "$dir/$name.pid" "$(inst_mark "$name")")" "$(cat "$dir/$name.url")"
    done
    line nginx "$(live_pid "$dir/nginx/nginx.pid" "$(nginx_mark)")" "http://127.0.0.1:$PORT"
    return $all
}

# ---- arguments -------------------------------------------------------------------------------

cmd=${1:-}
[ -n "$cmd" ] || usage
shift
N="" PORT="" dir="" THREADS=1 BIN="$root/bin/autoreply" BACKENDS=1 WAIT="" GRACE=15 EXTRA=""
inst=""
while [ $# -gt 0 ]; do
    case $1 in
    --instances) [ $# -ge 2 ] || usage; N=$2; shift 2 ;;
    --port) [ $# -ge 2 ] || usage; PORT=$2; shift 2 ;;
    --dir) [ $# -ge 2 ] || usage; dir=$2; shift 2 ;;
    --threads) [ $# -ge 2 ] || usage; THREADS=$2; shift 2 ;;
    --bin) [ $# -ge 2 ] || usage; BIN=$2; shift 2 ;;
    --wait) [ $# -ge 2 ] || usage; WAIT=$2; shift 2 ;;
    --grace) [ $# -ge 2 ] || usage; GRACE=$2; shift 2 ;;
    --no-backends) BACKENDS=0; shift ;;
    --) shift
        for a in "$@"; do EXTRA="$EXTRA $(quote "$a")"; done
        break ;;
    -h | --help) usage ;;
    -*) die "unknown option '$1' (fleet.sh --help)" ;;
    *) [ -z "$inst" ] || die "unexpected argument '$1'"; inst=$1; shift ;;
    esac
done
[ -n "$dir" ] || die "--dir DIR is required"
is_uint "$GRACE" || die "--grace: seconds, not '$GRACE'"

case $cmd in
up)
    [ -z "$inst" ] || die "unexpected argument '$inst'"
    mkdir -p "$dir"; dir=$(cd "$dir" && pwd)
    WAIT=${WAIT:-60}
    cmd_up ;;
down | kill | start | status)
    [ -d "$dir" ] || die "no folder $dir"
    dir=$(cd "$dir" && pwd)
    wait_arg=$WAIT
    load_state
    [ -z "$wait_arg" ] || WAIT=$wait_arg
    is_uint "$WAIT" || die "--wait: seconds, not '$WAIT'"
    case $cmd in
    down) [ -z "$inst" ] || die "unexpected argument '$inst'"; do_down "$GRACE" ;;
    kill) [ -n "$inst" ] || die "usage: fleet.sh kill I --dir DIR"; cmd_kill "$inst" ;;
    start) [ -n "$inst" ] || die "usage: fleet.sh start I --dir DIR"; cmd_start "$inst" ;;
    status) [ -z "$inst" ] || die "unexpected argument '$inst'"; cmd_status ;;
    esac ;;
*) die "unknown command '$cmd' (up, down, kill, start, status)" ;;
esac
