# The pgbouncer topologies (sourced by pgbouncer-transaction and
# pgbouncer-session): one PostgreSQL server, pgbouncer in front of it in
# POOL_MODE. Checks:
#   - idempgx's conformance suite through pgbouncer (its second process,
#     the other maintainer, straight on the server: TEST_DATABASE_URL_2;
#     the partitioned store as a role whose search_path names its schema),
#     under pgx's default exec mode and, in transaction pooling, under the
#     others (default_query_exec_mode in the URL); a mode idempgx cannot
#     use behind the pooler must be refused with an error that names
#     default_query_exec_mode, never half work;
#   - three paymentsd started at once through pgbouncer on a fresh database
#     (their migrations race);
#   - a storm with chaos (SIGKILL of paymentsd) during which pgbouncer is
#     killed with SIGKILL and started again: 0 double, 0 lost, 0 stuck, no
#     500, no lost race or prepared-statement error answered 5xx.
# See docs/deployment.md.
source "$(dirname "$0")/lib.sh"
need_packages postgresql pgbouncer curl jq

pgbouncer_topology() {
	local mode=$1 base=$2
	local pg=$base bouncer=$((base + 1)) psp=$((base + 2))
	# Session pooling holds a server connection per client connection: the
	# pool must cover every process's pool (paymentsd x3: 4 each; the suite:
	# 16 per test pool, a few at once). Transaction pooling shares them.
	local pool=20
	[ "$mode" = session ] && pool=150
	topo_init
	pg_init "$TOPO_DIR/pg"
	echo "max_connections = 300" >>"$TOPO_DIR/pg/postgresql.conf"
	pg_start "$TOPO_DIR/pg" "$pg"
	psql_at "$pg" "CREATE DATABASE test"
	psql_at "$pg" "CREATE DATABASE storm"
	pgbouncer_start "$mode" "$bouncer" "$pg" "$pool"
	local via="postgres://postgres@127.0.0.1:$bouncer" direct="postgres://postgres@127.0.0.1:$pg"

	local modes=(default)
	[ "$mode" = transaction ] && modes+=(exec simple_protocol cache_describe describe_exec cache_statement)
	for m in "${modes[@]}"; do
		local q="sslmode=disable"
		[ "$m" != default ] && q+="&default_query_exec_mode=$m"
		check "suite idempgx through pgbouncer ($mode pooling, exec mode $m)" \
			suite_or_refused "$m" TEST_DATABASE_URL="$via/test?$q" TEST_DATABASE_URL_2="$direct" IDEMPGX_TEST_POOLER="$mode"
	done

	fakepsp_start "$psp"
	# The URL docs/deployment.md gives for each mode.
	local url="$via/storm?sslmode=disable"
	[ "$mode" = transaction ] && url+="&default_query_exec_mode=exec"
	APPS=("$((base + 10)) $url" "$((base + 11)) $url" "$((base + 12)) $url")
	if ! checked "paymentsd x3 started at once through pgbouncer on a fresh database" apps_start_at_once; then
		log "starting them one at a time on a new database, for the checks that follow"
		for i in 0 1 2; do kill -9 "$(cat "$TOPO_DIR/app.$i.pid")" 2>/dev/null || true; done
		psql_at "$pg" "DROP DATABASE storm WITH (FORCE)"
		psql_at "$pg" "CREATE DATABASE storm"
		for i in 0 1 2; do app_start "$i"; app_wait "$i" || true; done
	fi

	storm chaos "$direct/storm?sslmode=disable" &
	local storm_pid=$!
	chaos_loop 2 &
	local chaos_pid=$!
	started "$chaos_pid"
	sleep 3
	log "SIGKILL of pgbouncer"
	kill -9 "$BOUNCER_PID"
	sleep 1
	pgbouncer_start "$mode" "$bouncer" "$pg" "$pool"
	sleep 3
	kill "$chaos_pid" 2>/dev/null || true
	wait "$chaos_pid" 2>/dev/null || true
	apps_restart_dead
	local storm_rc=0
	wait "$storm_pid" || storm_rc=$?
	check "storm through pgbouncer ($mode), pgbouncer killed: 0 double, 0 lost, 0 stuck (idemstorm exit $storm_rc)" storm_verdict chaos
	check "storm through pgbouncer ($mode): no 500 answer" storm_5xx chaos 1000000
	check "storm through pgbouncer ($mode): no lost race or prepared-statement error answered 5xx" no_lost_race_5xx

	if [ "$mode" = transaction ]; then
		# pgx's defaults behind transaction pooling: paymentsd refuses to
		# start naming default_query_exec_mode, or works (issue 10: 500s
		# and 503s from 42P05 and 26000).
		for i in 0 1 2; do kill -9 "$(cat "$TOPO_DIR/app.$i.pid")" 2>/dev/null || true; done
		psql_at "$pg" "CREATE DATABASE plain"
		APPS=("$((base + 10)) $via/plain?sslmode=disable" "$((base + 11)) $via/plain?sslmode=disable")
		: >"$TOPO_DIR/logs/paymentsd.0.log"
		: >"$TOPO_DIR/logs/paymentsd.1.log"
		if apps_start_at_once; then
			STORM_PAYMENTS=100 storm plain "$direct/plain?sslmode=disable" --timeout-rate 0 --cancel-rate 0 || true
			check "pgx's default exec mode behind transaction pooling: every payment once" storm_verdict plain
			check "pgx's default exec mode behind transaction pooling: no 5xx" storm_5xx plain 0
		else
			# every paymentsd that exited names the knob, whichever of its
			# first statements met the pooler
			check "pgx's default exec mode behind transaction pooling: refused at start, naming default_query_exec_mode" \
				refused_naming_exec_mode 0 1
		fi
	fi
	topo_hold
}

# suite_or_refused MODE ENV...: the conformance suite passes, or every case
# is refused up front with an error naming default_query_exec_mode (the
# exec mode cannot work behind this pooler; issue 10 item 1).
suite_or_refused() {
	local m=$1
	shift
	local out="$TOPO_DIR/logs/suite.$m.txt"
	if go_suite "$m" "$@" -- -v -run 'TestConformance' ./idempgx/; then
		# each suite ran through the pooler, none skipped: the plain store,
		# Options.Schema, and the partitioned store (as a role whose
		# search_path names its schema)
		local t
		for t in TestConformance TestConformanceSchemaOption TestConformancePartitioned; do
			go_test_ran "$m" "$t" || { log "$t did not pass (skipped?) in exec mode $m"; return 1; }
		done
		return 0
	fi
	if grep -q 'default_query_exec_mode' "$out" && ! grep -qE 'SQLSTATE (42P05|26000)|prepared statement' "$out"; then
		log "exec mode $m refused, naming default_query_exec_mode"
		return 0
	fi
	return 1
}

# refused_naming_exec_mode I...: each paymentsd I that is not running
# logged an error naming default_query_exec_mode (and one did exit).
refused_naming_exec_mode() {
	local i exited=0 ok=0
	for i in "$@"; do
		kill -0 "$(cat "$TOPO_DIR/app.$i.pid")" 2>/dev/null && continue
		exited=1
		if ! grep -q default_query_exec_mode "$TOPO_DIR/logs/paymentsd.$i.log"; then
			log "paymentsd $i exited without naming default_query_exec_mode: $(tail -n 1 "$TOPO_DIR/logs/paymentsd.$i.log")"
			ok=1
		fi
	done
	[ $exited -eq 1 ] && [ $ok -eq 0 ]
}
