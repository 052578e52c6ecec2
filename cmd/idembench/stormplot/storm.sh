#!/usr/bin/env bash
# The storm behind docs/img/storm-metrics.png (docs/observability.md).
# Two paymentsd share one SQLite file, lease 1 s: A is never killed; B is
# SIGKILLed every ~0.8 s and restarted (what it had claimed is taken over,
# by A or by the next B, once the lease runs out). A's GET /metrics is
# scraped before and after an idemstorm of 200 payments x 4 duplicates
# spread over both, then stormplot draws the difference.
#
#   cmd/idembench/stormplot/storm.sh   (from the repository; ports 18081-18082)
#
# Writes docs/img/storm-metrics.png, docs/img/storm-metrics-{before,after}.prom
# and prints idemstorm's report. DIR (default: a new temporary directory)
# keeps the database and the logs.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../../.." && pwd)
DIR=${DIR:-$(mktemp -d)}
cd "$DIR"
(cd "$REPO" && go build -o "$DIR/paymentsd" ./cmd/paymentsd)
DB=sqlite:$DIR/p.db
ARGS=(--database-url "$DB" --lease 1s --psp-latency 100ms --log-format text)
./paymentsd --addr 127.0.0.1:18081 "${ARGS[@]}" 2>a.log & A=$!
sleep 1 # A migrates the database first
startb() { ./paymentsd --addr 127.0.0.1:18082 "${ARGS[@]}" 2>>b.log & echo $! > b.pid; }
startb
for _ in $(seq 50); do
	curl -fs 127.0.0.1:18081/healthz >/dev/null && curl -fs 127.0.0.1:18082/healthz >/dev/null && break
	sleep 0.2
done
curl -fs 127.0.0.1:18081/metrics > before.prom
( while true; do sleep 0.8; kill -9 "$(cat b.pid)" 2>/dev/null || true; sleep 0.3; startb; done ) 2>/dev/null & CHAOS=$!
set +e
(cd "$REPO" && go run ./cmd/idemstorm --url http://127.0.0.1:18081,http://127.0.0.1:18082 --database-url "$DB" \
	--payments 200 --duplicates 4 --concurrency 16 --seed 12 --progress=false) > storm.out 2>&1
rc=$?
set -e
kill "$CHAOS"; wait "$CHAOS" 2>/dev/null || true
kill -9 "$(cat b.pid)" 2>/dev/null || true
curl -fs 127.0.0.1:18081/metrics > after.prom
kill "$A"; wait "$A" || true
cat storm.out
[ "$rc" -eq 0 ] || { echo "idemstorm failed ($rc); logs in $DIR" >&2; exit "$rc"; }
cp before.prom "$REPO/docs/img/storm-metrics-before.prom"
cp after.prom "$REPO/docs/img/storm-metrics-after.prom"
(cd "$REPO/cmd/idembench" && go run ./stormplot -before "$DIR/before.prom" -after "$DIR/after.prom" \
	-o "$REPO/docs/img/storm-metrics.png" \
	-title "idem_decisions_total during the storm (server A)")
