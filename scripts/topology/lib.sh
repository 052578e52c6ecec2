# Shared shell functions of the topology scripts (sourced, not run).
#
# Each script builds its topology on loopback from Debian's packages, with
# its own data directories under one temporary directory and its own ports
# (TOPO_PORT_BASE, default per script; never 5432 or 3306), runs the driver
# conformance suite and a storm with chaos through it, and exits non-zero on
# any failed check. KEEP=1 keeps the temporary directory (logs, data) after
# the run; it is kept anyway when a check failed.
#
# Every check goes through check/fail, so the summary at the end lists what
# passed and what failed.

set -euo pipefail

TOPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
TOPO_NAME=$(basename "$0")
TOPO_FAILED=()
TOPO_PASSED=()
TOPO_PIDS=() # every process started here, killed by id at exit
TOPO_START=$(date +%s)

log() { echo "[$TOPO_NAME $(date +%H:%M:%S)] $*" >&2; }

# need_packages PKG...: installs the Debian packages that are missing.
need_packages() {
	local missing=()
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
	done
	[ ${#missing[@]} -eq 0 ] && return 0
	log "installing ${missing[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	# Debian's packages start their default servers; these scripts never use
	# them, and the machine's own servers are left as they are.
}

# topo_init: the temporary directory, the binaries, the exit trap.
topo_init() {
	TOPO_DIR=$(mktemp -d "/tmp/idem-topology-$TOPO_NAME.XXXXXX")
	chmod 755 "$TOPO_DIR"
	mkdir -p "$TOPO_DIR/bin" "$TOPO_DIR/logs"
	trap topo_exit EXIT
	log "working in $TOPO_DIR"
	(cd "$TOPO_ROOT" && go build -o "$TOPO_DIR/bin/" ./cmd/paymentsd ./cmd/idemstorm ./cmd/fakepsp)
}

topo_exit() {
	local rc=$?
	local f
	for f in "$TOPO_DIR"/app.*.pid; do # restarted by the chaos loop, in a subshell
		[ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
	done
	for pid in "${TOPO_PIDS[@]}"; do
		kill -9 "$pid" 2>/dev/null || true
	done
	# children of those (postgres backends, galera's rsync) exit with their parents
	sleep 0.5
	local took=$(($(date +%s) - TOPO_START))
	echo "=== $TOPO_NAME: ${#TOPO_PASSED[@]} checks passed, ${#TOPO_FAILED[@]} failed, ${took}s" >&2
	for c in "${TOPO_PASSED[@]}"; do echo "  PASS $c" >&2; done
	for c in "${TOPO_FAILED[@]}"; do echo "  FAIL $c" >&2; done
	if [ ${#TOPO_FAILED[@]} -gt 0 ] && [ "$rc" -eq 0 ]; then rc=1; fi
	if [ "$rc" -ne 0 ] || [ -n "${KEEP:-}" ]; then
		echo "  logs and data kept in $TOPO_DIR" >&2
	else
		rm -rf "$TOPO_DIR"
	fi
	exit "$rc"
}

pass() { TOPO_PASSED+=("$1"); log "PASS $1"; }
fail() { TOPO_FAILED+=("$1"); log "FAIL $1"; }

# checked NAME CMD...: runs CMD, records NAME as passed or failed, and
# returns CMD's verdict (for `if checked ...`); check goes on either way.
checked() {
	local name=$1
	shift
	if "$@"; then pass "$name"; else fail "$name"; return 1; fi
}
check() { checked "$@" || true; }

# started PID: remember a process to kill at exit.
started() {
	TOPO_PIDS+=("$1")
	disown "$1" 2>/dev/null || true # no "Killed" notices at exit
}

# wait_for WHAT SECONDS CMD...: polls CMD every 0.2 s.
wait_for() {
	local what=$1 secs=$2
	shift 2
	local end=$(($(date +%s) + secs))
	until "$@" >/dev/null 2>&1; do
		if [ "$(date +%s)" -ge "$end" ]; then
			log "$what did not come up in ${secs}s"
			return 1
		fi
		sleep 0.2
	done
}

# ---- PostgreSQL -----------------------------------------------------------

PGBIN=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)

as_postgres() { runuser -u postgres -- "$@"; }

# pg_init DIR: a new cluster (trust, superuser postgres) in DIR.
pg_init() {
	local dir=$1
	mkdir -p "$dir"
	chown postgres:postgres "$dir"
	as_postgres "$PGBIN/initdb" -D "$dir" -A trust -U postgres --no-sync >"$TOPO_DIR/logs/initdb.$(basename "$dir").log"
	cat >>"$dir/postgresql.conf" <<-EOF
		listen_addresses = '127.0.0.1'
		unix_socket_directories = '$dir'
		max_connections = 200
		fsync = on
		wal_level = replica
		max_wal_senders = 5
		hot_standby = on
		log_min_messages = warning
	EOF
}

# pg_start DIR PORT: starts the server in the background; sets PG_PID.
pg_start() {
	local dir=$1 port=$2
	# runuser itself in the background (not a function's subshell), so its
	# pid is runuser's
	runuser -u postgres -- "$PGBIN/postgres" -D "$dir" -p "$port" >>"$TOPO_DIR/logs/postgres.$port.log" 2>&1 &
	PG_PID=$!
	started "$PG_PID"
	wait_for "PostgreSQL on $port" 60 test -f "$dir/postmaster.pid"
	wait_for "PostgreSQL on $port" 60 "$PGBIN/pg_isready" -h 127.0.0.1 -p "$port" -q
	# runuser's child is the postmaster: remember its pid for kill -9
	local pm
	pm=$(head -1 "$dir/postmaster.pid")
	started "$pm"
	PG_PID=$pm
}

# psql_at PORT SQL: one statement as postgres on database postgres (or $PGDB).
psql_at() { "$PGBIN/psql" -h 127.0.0.1 -p "$1" -U postgres -d "${PGDB:-postgres}" -v ON_ERROR_STOP=1 -qtAc "$2"; }

# ---- pgbouncer ------------------------------------------------------------

# pgbouncer_start MODE PORT PGPORT POOL: pgbouncer in MODE (transaction or
# session) on PORT, in front of the server on PGPORT, POOL server
# connections per database and user; sets BOUNCER_PID.
pgbouncer_start() {
	local mode=$1 port=$2 pgport=$3 pool=$4 dir="$TOPO_DIR/pgbouncer.$2"
	mkdir -p "$dir"
	echo '"postgres" ""' >"$dir/userlist.txt"
	cat >"$dir/pgbouncer.ini" <<-EOF
		[databases]
		* = host=127.0.0.1 port=$pgport
		[pgbouncer]
		listen_addr = 127.0.0.1
		listen_port = $port
		unix_socket_dir =
		auth_type = trust
		auth_file = $dir/userlist.txt
		auth_user = postgres
		admin_users = postgres
		pool_mode = $mode
		default_pool_size = $pool
		max_client_conn = 2000
		server_reset_query = DISCARD ALL
		logfile = $dir/pgbouncer.log
		pidfile = $dir/pgbouncer.pid
	EOF
	chown -R postgres:postgres "$dir"
	runuser -u postgres -- pgbouncer "$dir/pgbouncer.ini" >>"$TOPO_DIR/logs/pgbouncer.$port.log" 2>&1 &
	started $!
	wait_for "pgbouncer on $port" 30 "$PGBIN/pg_isready" -h 127.0.0.1 -p "$port" -q
	BOUNCER_PID=$(cat "$dir/pgbouncer.pid")
	started "$BOUNCER_PID"
}

# ---- the application -----------------------------------------------------

# fakepsp_start PORT: the payment provider, on a SQLite file of its own.
fakepsp_start() {
	"$TOPO_DIR/bin/fakepsp" --addr "127.0.0.1:$1" --database-url "sqlite:$TOPO_DIR/fakepsp.db" \
		>>"$TOPO_DIR/logs/fakepsp.log" 2>&1 &
	started $!
	PSP_URL="http://127.0.0.1:$1"
	wait_for fakepsp 30 curl -fsS "$PSP_URL/v1/charges/stats"
}

# APPS holds "port database-url" per paymentsd, set by the script;
# app_start I starts (or restarts) the I-th.
APP_LEASE=${APP_LEASE:-3s}
declare -a APPS=()
app_start() {
	local i=$1 port url
	read -r port url <<<"${APPS[$i]}"
	"$TOPO_DIR/bin/paymentsd" --addr "127.0.0.1:$port" --database-url "$url" --psp-url "$PSP_URL" \
		--lease "$APP_LEASE" --relay-secret topology-secret >>"$TOPO_DIR/logs/paymentsd.$i.log" 2>&1 &
	echo $! >"$TOPO_DIR/app.$i.pid"
	started $!
}
app_healthy() { curl -fsS -o /dev/null "http://127.0.0.1:$1/healthz"; }

# app_wait I: waits (60 s at most) until paymentsd I answers /healthz; fails
# at once when it exited.
app_wait() {
	local i=$1 port url end=$(($(date +%s) + 60))
	read -r port url <<<"${APPS[$i]}"
	until app_healthy "$port" 2>/dev/null; do
		if ! kill -0 "$(cat "$TOPO_DIR/app.$i.pid")" 2>/dev/null || [ "$(date +%s)" -ge "$end" ]; then
			log "paymentsd $i did not start: $(tail -n 1 "$TOPO_DIR/logs/paymentsd.$i.log")"
			return 1
		fi
		sleep 0.2
	done
}
app_urls() {
	local out="" port url
	for a in "${APPS[@]}"; do
		read -r port url <<<"$a"
		out+="${out:+,}http://127.0.0.1:$port"
	done
	echo "$out"
}

# apps_start_at_once: starts every paymentsd at the same moment on a fresh
# database (their migrations race) and checks that each one comes up.
apps_start_at_once() {
	local i ok=0
	for i in "${!APPS[@]}"; do app_start "$i"; done
	for i in "${!APPS[@]}"; do app_wait "$i" || ok=1; done
	return $ok
}

# chaos_loop EVERY: SIGKILLs a random paymentsd every EVERY seconds (about)
# and restarts it on its address, until killed.
chaos_loop() {
	local every=$1 n=${#APPS[@]} i pid
	while sleep "$every"; do
		i=$((RANDOM % n))
		pid=$(cat "$TOPO_DIR/app.$i.pid")
		kill -9 "$pid" 2>/dev/null || true
		echo "$(date +%T.%N) SIGKILL paymentsd $i ($pid)" >>"$TOPO_DIR/logs/chaos.log"
		sleep 0.2
		app_start "$i"
	done
}

# apps_restart_dead: restarts every paymentsd that is not running (after
# chaos stopped, or one that exited because its database node was down).
apps_restart_dead() {
	local i
	for i in "${!APPS[@]}"; do
		kill -0 "$(cat "$TOPO_DIR/app.$i.pid")" 2>/dev/null || app_start "$i"
	done
}

# storm NAME DBURL ARGS...: idemstorm against the running paymentsd (--url),
# reconciled with the provider and idem's records on DBURL; its report in
# $TOPO_DIR/NAME.json. Returns idemstorm's status.
STORM_PAYMENTS=${STORM_PAYMENTS:-200}
STORM_DUPLICATES=${STORM_DUPLICATES:-4}
storm() {
	local name=$1 dburl=$2
	shift 2
	log "storm $name: $STORM_PAYMENTS payments x $STORM_DUPLICATES"
	local rc=0
	"$TOPO_DIR/bin/idemstorm" --url "$(app_urls)" --psp-url "$PSP_URL" --database-url "$dburl" \
		--payments "$STORM_PAYMENTS" --duplicates "$STORM_DUPLICATES" --concurrency 16 --progress=false \
		--deadline 5m --report "$TOPO_DIR/$name.json" "$@" >"$TOPO_DIR/logs/storm.$name.txt" 2>&1 || rc=$?
	cat "$TOPO_DIR/logs/storm.$name.txt" >&2
	return $rc
}

# storm_verdict NAME: idemstorm's verdict: no double, lost, unfinished or
# stuck payment (its exit status says the same; the report says which).
storm_verdict() {
	jq -e '.verdict.ok == true' "$TOPO_DIR/$1.json" >/dev/null 2>&1 ||
		{ log "storm $1: $(jq -c '.verdict.failures' "$TOPO_DIR/$1.json" 2>/dev/null || echo 'no report')"; return 1; }
}

# storm_5xx NAME MAX: at most MAX answers 5xx in storm NAME, and none 500.
storm_5xx() {
	local n500 n5xx
	n500=$(jq '.load.statuses["500"] // 0' "$TOPO_DIR/$1.json")
	n5xx=$(jq '.load.server_errors_5xx' "$TOPO_DIR/$1.json")
	log "storm $1: 5xx $n5xx (500: $n500); statuses $(jq -c '.load.statuses' "$TOPO_DIR/$1.json")"
	[ "$n500" -eq 0 ] && [ "$n5xx" -le "$2" ]
}

# LOST_RACE matches idem's log lines of a lost race or a pooler mismatch answered
# 5xx (a deadlock, a certification failure or a serialization failure that
# reached the client; pgbouncer's prepared-statement errors), never right.
LOST_RACE='Error 1213|Deadlock found|deadlock detected|could not serialize|SQLSTATE 40001|SQLSTATE 40P01|SQLSTATE 42P05|SQLSTATE 26000|prepared statement .* (already exists|does not exist)'

# no_lost_race_5xx: no paymentsd log line answers a lost race with 5xx.
no_lost_race_5xx() {
	local hits
	hits=$(grep -hE "$LOST_RACE" "$TOPO_DIR"/logs/paymentsd.*.log 2>/dev/null | grep -E '"msg":"idem: ' | grep -ciE '"level":"(ERROR|WARN)"' || true)
	if [ "$hits" -gt 0 ]; then
		log "$hits log lines of a lost race answered as an error:"
		grep -hE "$LOST_RACE" "$TOPO_DIR"/logs/paymentsd.*.log | head -3 >&2
		return 1
	fi
}

# latency_p50 NAME: the storm's request latency p50 in ms.
latency_p50() { jq '.load.request_latency.p50_ms' "$TOPO_DIR/$1.json"; }

# go_suite NAME ENV... -- GO-TEST-ARGS...: go test in the repository with
# ENV set (TEST_DATABASE_URL=..., ...); its output in logs/suite.NAME.txt.
go_suite() {
	local name=$1
	shift
	local envs=()
	while [ "$1" != "--" ]; do envs+=("$1"); shift; done
	shift
	log "suite $name: go test $*"
	local rc=0
	(cd "$TOPO_ROOT" && env CI=true "${envs[@]}" go test -count=1 "$@") >"$TOPO_DIR/logs/suite.$name.txt" 2>&1 || rc=$?
	if [ $rc -ne 0 ]; then
		grep -E '^\s*(--- FAIL|FAIL|panic:)|Error:|Error Trace|Messages:|in chain:' "$TOPO_DIR/logs/suite.$name.txt" | head -30 >&2 || true
		log "suite $name: full output in $TOPO_DIR/logs/suite.$name.txt"
	fi
	return $rc
}

# go_test_ran NAME TEST: the suite run NAME passed TEST (not skipped).
go_test_ran() { grep -q -- "--- PASS: $2 " "$TOPO_DIR/logs/suite.$1.txt"; }

# topo_hold: with TOPO_HOLD set, keeps the topology up after the checks
# (for running tests against it by hand) until $TOPO_DIR/release exists.
topo_hold() {
	[ -n "${TOPO_HOLD:-}" ] || return 0
	log "holding the topology up: touch $TOPO_DIR/release to end"
	until [ -f "$TOPO_DIR/release" ]; do sleep 1; done
}
