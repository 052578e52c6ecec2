package e2e

import (
	"bufio"
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // database/sql driver "pgx", for inspection
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/supervise"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// The binaries under test, cmd/paymentsd and cmd/fakepsp, built once per
// test binary with -tags idemfaults (paymentsd's crash points and stalls)
// and with -race when this test binary has it.
var builds = supervise.Binaries{Names: []string{"paymentsd", "fakepsp", "idem"}, Race: raceEnabled}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := builds.Remove(); err != nil {
		fmt.Fprintln(os.Stderr, "removing the test binaries:", err)
	}
	os.Exit(code)
}

// binaries builds the binaries under test on first use and returns their
// paths.
func binaries(t *testing.T) (paymentsd, fakepsp string) {
	t.Helper()
	paths, err := builds.Paths()
	if err != nil {
		t.Fatal(err)
	}
	return paths[0], paths[1]
}

// idemCLI builds the idem command on first use and runs it with args,
// requiring that it succeeds; it returns its standard output.
func idemCLI(t *testing.T, args ...string) string {
	t.Helper()
	paths, err := builds.Paths()
	require.NoError(t, err)
	out, err := exec.Command(paths[2], args...).Output()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		t.Fatalf("idem %v: %v: %s", args, err, exit.Stderr)
	}
	require.NoError(t, err)
	return string(out)
}

// target is a database paymentsd runs against in the tests.
type target struct {
	name string
	// newDB returns the --database-url of a fresh database, dropped (or
	// removed) when t ends.
	newDB func(t *testing.T) string
	// newProviderDB returns fakepsp's --database-url: a fresh database of
	// the same kind where fakepsp supports it, else an SQLite file.
	newProviderDB func(t *testing.T) string
}

func sqliteDB(t *testing.T) string   { return filepath.Join(t.TempDir(), "e2e.db") }
func postgresDB(t *testing.T) string { url, _ := dbtest.PostgresURL(t); return url }
func mysqlDB(t *testing.T) string    { url, _ := dbtest.MySQLURL(t); return url }

var targets = []target{
	{"sqlite", sqliteDB, sqliteDB},
	{"postgres", postgresDB, postgresDB},
	{"mysql", mysqlDB, sqliteDB}, // MySQL or MariaDB; fakepsp has no MySQL store
}

// partitioned is PostgreSQL with idem_keys partitioned by expires_at
// (migrated so before paymentsd starts, which then opens it partitioned),
// for the tests of what the partitioned table does differently: its steps
// without a foreign key, its far-future partition of UNKNOWN records.
var partitioned = target{"postgres-partitioned", postgresPartitionedDB, postgresDB}

func postgresPartitionedDB(t *testing.T) string {
	url, _ := dbtest.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	defer pool.Close()
	require.NoError(t, idempgx.NewPartitioned(pool, idempgx.PartitionConfig{}).Migrate(context.Background()))
	return url
}

// forEachTarget runs f as a parallel subtest per target, and per extra
// target.
func forEachTarget(t *testing.T, f func(t *testing.T, tgt target), extra ...target) {
	for _, tgt := range append(targets[:len(targets):len(targets)], extra...) {
		t.Run(tgt.name, func(t *testing.T) {
			t.Parallel()
			f(t, tgt)
		})
	}
}

// proc is one service run as a child process (cmd/internal/supervise, as
// cmd/idemstorm's fleet); restarts keep its address, arguments (unless
// replaced) and log.
type proc struct {
	t *testing.T
	*supervise.Process

	mu   sync.Mutex
	logs []*supervise.Buffer // one per generation
}

// startProc starts bin with args on a free local port, waits until its
// /healthz answers 200, and stops it when t ends (logs shown if t failed; a
// data race in them fails t).
func startProc(t *testing.T, name, bin string, args []string, env ...string) *proc {
	t.Helper()
	p := &proc{t: t}
	p.Process = &supervise.Process{Name: name, Bin: bin, Args: args,
		Env: append(append(os.Environ(), "GORACE=atexit_sleep_ms=0"), env...),
		Output: func(int) (io.Writer, func(), error) {
			log := &supervise.Buffer{}
			p.mu.Lock()
			p.logs = append(p.logs, log)
			p.mu.Unlock()
			return log, func() {}, nil
		}}
	t.Cleanup(p.cleanup)
	var err error
	for range 5 {
		if p.Addr, err = supervise.FreeAddr(); err != nil {
			break
		}
		if err = p.Start(); err == nil {
			return p
		}
		if !strings.Contains(p.lastLog(), "address already in use") {
			break
		}
	}
	t.Fatalf("%s did not start: %v\n%s", name, err, p.lastLog())
	return nil
}

func (p *proc) url() string { return p.URL() }

// restart starts a new generation on the same address, with args replacing
// the arguments when given. The previous generation must have exited.
func (p *proc) restart(args ...string) {
	p.t.Helper()
	if err := p.tryRestart(args...); err != nil {
		p.t.Fatal(err)
	}
}

// tryRestart is restart for goroutines other than the test's: it returns
// the error instead of failing the test.
func (p *proc) tryRestart(args ...string) error {
	if args != nil {
		p.Args = args
	}
	err := p.StartRetrying(50, 100*time.Millisecond, func(error) bool {
		// The old socket may take a moment to go; and a paymentsd with
		// --crash-after-charge serves the clients' retries at once, so
		// its injected crash may come before the health check answered.
		log := p.lastLog()
		return strings.Contains(log, "address already in use") || strings.Contains(log, "fault injected: crashing now")
	})
	if err != nil {
		return fmt.Errorf("%s did not restart: %v\n%s", p.Name, err, p.lastLog())
	}
	return nil
}

// exitedChan is closed when the current generation exits.
func (p *proc) exitedChan() <-chan struct{} { return p.Exited() }

// waitExit waits for the current generation to exit and returns its state.
func (p *proc) waitExit(timeout time.Duration) *os.ProcessState {
	p.t.Helper()
	select {
	case <-p.Exited():
	case <-time.After(timeout):
		p.t.Fatalf("%s did not exit within %s", p.Name, timeout)
	}
	return p.State()
}

// running reports whether the current generation is alive.
func (p *proc) running() bool { return p.Running() }

// signal sends sig to the current generation.
func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	require.NoError(p.t, p.Signal(sig), "%s: %s", p.Name, sig)
}

// kill9 kills the current generation with SIGKILL and waits for it (at
// most 10 s; false if it did not die). Safe from any goroutine.
func (p *proc) kill9() bool { return p.Kill(10 * time.Second) }

// killedBySIGKILL reports whether state is a death by SIGKILL.
func killedBySIGKILL(state *os.ProcessState) bool {
	ws, ok := state.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

func (p *proc) lastLog() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.logs) == 0 {
		return ""
	}
	return p.logs[len(p.logs)-1].String()
}

// allLogs returns every generation's output, each headed by its number.
func (p *proc) allLogs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var b strings.Builder
	for i, l := range p.logs {
		fmt.Fprintf(&b, "--- %s generation %d ---\n%s", p.Name, i+1, l.String())
	}
	return b.String()
}

// logLines returns the JSON log lines of every generation, in order.
func (p *proc) logLines() []map[string]any {
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(p.allLogs()))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) == nil {
			lines = append(lines, m)
		}
	}
	return lines
}

// logged counts the log lines whose msg is msg and whose other fields match.
func (p *proc) logged(msg string, fields ...any) int {
	n := 0
	for _, l := range p.logLines() {
		if l["msg"] != msg {
			continue
		}
		ok := true
		for i := 0; i+1 < len(fields); i += 2 {
			if fmt.Sprint(l[fields[i].(string)]) != fmt.Sprint(fields[i+1]) {
				ok = false
			}
		}
		if ok {
			n++
		}
	}
	return n
}

// waitLogged waits (at most 10 s) until at least n log lines match msg and
// fields (see logged), and returns how many do. A child's output reaches the
// test through a pipe, some time after the child wrote it; and a service may
// log a request after answering it.
func (p *proc) waitLogged(t *testing.T, n int, msg string, fields ...any) int {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := p.logged(msg, fields...)
		if got >= n || time.Now().After(deadline) {
			return got
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// cleanup stops the process (SIGTERM, then SIGKILL), fails t on a data race
// in any generation's output, and shows the logs when t failed.
func (p *proc) cleanup() {
	p.Stop(15 * time.Second) // with SIGCONT, for a process left stopped
	logs := p.allLogs()
	if dir := os.Getenv("E2E_LOG_DIR"); dir != "" { // keep every process's output, for debugging
		name := strings.NewReplacer("/", "_").Replace(p.t.Name()) + "." + p.Name + "." + strings.ReplaceAll(p.Addr, ":", "_") + ".log"
		_ = os.WriteFile(filepath.Join(dir, name), []byte(logs), 0o644)
	}
	if strings.Contains(logs, "WARNING: DATA RACE") {
		p.t.Errorf("%s reported a data race:\n%s", p.Name, logs)
		return
	}
	if p.t.Failed() {
		const max = 64 << 10
		if len(logs) > max {
			logs = "...\n" + logs[len(logs)-max:]
		}
		p.t.Logf("%s output:\n%s", p.Name, logs)
	}
}

// httpClient opens one connection per request, so that no request lands on
// a pooled connection to a process killed since.
var httpClient = &http.Client{
	Timeout:   60 * time.Second,
	Transport: &http.Transport{DisableKeepAlives: true},
}

type response struct {
	status int
	header http.Header
	body   []byte
}

func (r response) replayed() bool { return r.header.Get(idem.HeaderReplayed) == "true" }

// problemType returns the type member of a problem details body ("" if none).
func (r response) problemType() string {
	var p struct{ Type string }
	_ = json.Unmarshal(r.body, &p)
	return p.Type
}

// retryAfter returns the Retry-After header in seconds, -1 when absent.
func (r response) retryAfter() int {
	n, err := strconv.Atoi(r.header.Get("Retry-After"))
	if err != nil {
		return -1
	}
	return n
}

func (r response) String() string {
	return fmt.Sprintf("%d replayed=%v retry-after=%q %s", r.status, r.replayed(), r.header.Get("Retry-After"), bytes.TrimSpace(r.body))
}

// do sends one request; headers are name, value pairs.
func do(ctx context.Context, method, url, body string, headers ...string) (response, error) {
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return response{}, err
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return response{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, err
	}
	return response{status: resp.StatusCode, header: resp.Header, body: b}, nil
}

// pay sends POST /v1/payments once.
func pay(ctx context.Context, baseURL, merchant, key, body string) (response, error) {
	return do(ctx, http.MethodPost, baseURL+"/v1/payments", body,
		"Authorization", "Bearer sk_test_"+merchant, idem.HeaderKey, key, "Content-Type", "application/json")
}

// getJSON GETs path as merchant ("" for none) and decodes the 200 answer into v.
func getJSON(t *testing.T, baseURL, merchant, path string, v any) {
	t.Helper()
	var headers []string
	if merchant != "" {
		headers = []string{"Authorization", "Bearer sk_test_" + merchant}
	}
	r, err := do(context.Background(), http.MethodGet, baseURL+path, "", headers...)
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, r.status, "GET %s: %s", path, r.body)
	require.NoError(t, json.Unmarshal(r.body, v), "GET %s: %s", path, r.body)
}

// attempt is one try of a logical payment.
type attempt struct {
	resp response
	err  error     // transport error: no answer
	at   time.Time // when the answer (or the error) came
}

func (a attempt) String() string {
	if a.err != nil {
		return a.at.Format("15:04:05.000") + " no answer: " + a.err.Error()
	}
	return a.at.Format("15:04:05.000") + " " + a.resp.String()
}

// retryable answers: the server asks to come back (409 in flight, 5xx
// recorded FAILED by idem's default policy).
func retryable(status int) bool {
	return status == http.StatusConflict || status >= 500
}

// payUntilDone retries one logical payment with the same key until it gets
// a 201, as a well-behaved client does: after a retryable answer it waits
// the Retry-After (else a short backoff); after a transport error (the
// server is down or restarting) a short backoff. It returns every attempt;
// the last is the 201 unless ctx ended first or an answer was not retryable.
func payUntilDone(ctx context.Context, baseURL, merchant, key, body string) ([]attempt, error) {
	var attempts []attempt
	for {
		r, err := pay(ctx, baseURL, merchant, key, body)
		if ctx.Err() != nil {
			return attempts, fmt.Errorf("payment %s/%s not done: %w (attempts: %d)", merchant, key, ctx.Err(), len(attempts))
		}
		attempts = append(attempts, attempt{resp: r, err: err, at: time.Now()})
		wait := 100 * time.Millisecond
		switch {
		case err != nil:
		case r.status == http.StatusCreated:
			return attempts, nil
		case retryable(r.status):
			if s := r.retryAfter(); s > 0 {
				wait = time.Duration(s) * time.Second
			}
		default:
			return attempts, fmt.Errorf("payment %s/%s: unexpected answer %s", merchant, key, r)
		}
		select {
		case <-ctx.Done():
			return attempts, fmt.Errorf("payment %s/%s not done: %w", merchant, key, ctx.Err())
		case <-time.After(wait):
		}
	}
}

// pspStats is fakepsp's GET /v1/charges/stats.
type pspStats struct {
	Merchants map[string]struct {
		Charges int64            `json:"charges"`
		Amount  map[string]int64 `json:"amount"`
	} `json:"merchants"`
	Charges int64 `json:"charges"`
}

func stats(t *testing.T, psp *proc) pspStats {
	t.Helper()
	var st pspStats
	getJSON(t, psp.url(), "", "/v1/charges/stats", &st)
	return st
}

// chargesOf returns the number of distinct charges fakepsp made for merchant.
func chargesOf(t *testing.T, psp *proc, merchant string) int64 {
	t.Helper()
	return stats(t, psp).Merchants[merchant].Charges
}

// pspRequest is one POST /v1/charges as fakepsp logged it.
type pspRequest struct {
	status   int
	replayed bool
}

// pspRequests waits until fakepsp has logged n charge requests with the
// relayed key (at most 10 s: it logs a request after answering it), and
// returns all it logged, in order.
func pspRequests(t *testing.T, psp *proc, relayKey string, n int) []pspRequest {
	t.Helper()
	psp.waitLogged(t, n, "request", "method", "POST", "path", "/v1/charges", "idempotency_key", relayKey)
	var out []pspRequest
	for _, l := range psp.logLines() {
		if l["msg"] == "request" && l["method"] == "POST" && l["path"] == "/v1/charges" && l["idempotency_key"] == relayKey {
			status, _ := l["status"].(float64)
			replayed, _ := l["replayed"].(bool)
			out = append(out, pspRequest{status: int(status), replayed: replayed})
		}
	}
	return out
}

type balance struct {
	Merchant string           `json:"merchant"`
	Payments int64            `json:"payments"`
	Totals   map[string]int64 `json:"totals"`
}

type payment struct {
	ID       string `json:"id"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

type paymentList struct {
	Data    []payment `json:"data"`
	HasMore bool      `json:"has_more"`
}

// inspector reads a paymentsd database directly: the ledger and idem's
// records, as an auditor would.
type inspector struct {
	db        *sql.DB
	pg, mysql bool
}

func inspect(t *testing.T, databaseURL string) *inspector {
	t.Helper()
	i := &inspector{pg: strings.HasPrefix(databaseURL, "postgres"), mysql: strings.HasPrefix(databaseURL, "mysql")}
	var err error
	switch {
	case i.pg:
		i.db, err = sql.Open("pgx", databaseURL)
	case i.mysql:
		cfg, perr := idemmysql.ParseURL(databaseURL)
		require.NoError(t, perr)
		i.db, err = sql.Open("mysql", cfg.FormatDSN())
	default:
		i.db, err = sql.Open("sqlite", idemsqlite.DSN(databaseURL))
	}
	require.NoError(t, err)
	t.Cleanup(func() { i.db.Close() })
	return i
}

// query rewrites ? placeholders for PostgreSQL, and quotes the column key
// (a reserved word in MySQL) for MySQL.
func (i *inspector) query(q string) string {
	if i.mysql {
		return strings.ReplaceAll(q, " key = ", " `key` = ")
	}
	if !i.pg {
		return q
	}
	var b strings.Builder
	n := 0
	for _, c := range q {
		if c == '?' {
			n++
			fmt.Fprintf(&b, "$%d", n)
			continue
		}
		b.WriteRune(c)
	}
	return b.String()
}

// record is idem's record of one key.
type record struct {
	found        bool
	state        string
	fencingToken int64
	attempts     int
}

func (i *inspector) record(t *testing.T, scope, key string) record {
	t.Helper()
	var r record
	err := i.db.QueryRow(i.query(`SELECT state, fencing_token, attempts FROM idem_keys WHERE scope = ? AND key = ?`), scope, key).
		Scan(&r.state, &r.fencingToken, &r.attempts)
	if errors.Is(err, sql.ErrNoRows) {
		return r
	}
	require.NoError(t, err)
	r.found = true
	return r
}

// stepStarted reports whether the step name of (scope, key) has its
// start marker committed (idem_steps; any life).
func (i *inspector) stepStarted(t *testing.T, scope, key, name string) bool {
	t.Helper()
	var n int
	require.NoError(t, i.db.QueryRow(i.query(`SELECT COUNT(*) FROM idem_steps WHERE scope = ? AND key = ? AND name = ?`), scope, key, name).Scan(&n))
	return n > 0
}

// createdAt is the created_at of idem's record of (scope, key), read in
// each database's own representation: timestamptz, DATETIME(6) in UTC, or
// SQLite's INTEGER microseconds.
func (i *inspector) createdAt(t *testing.T, scope, key string) time.Time {
	t.Helper()
	q := `SELECT created_at FROM idem_keys WHERE scope = ? AND key = ?`
	switch {
	case i.pg:
		q = `SELECT (EXTRACT(EPOCH FROM created_at) * 1000000)::bigint FROM idem_keys WHERE scope = ? AND key = ?`
	case i.mysql:
		q = `SELECT TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', created_at) FROM idem_keys WHERE scope = ? AND key = ?`
	}
	var us int64
	require.NoError(t, i.db.QueryRow(i.query(q), scope, key).Scan(&us))
	return time.UnixMicro(us)
}

// ledgerRow is one payment with its ledger entries counted.
type ledgerRow struct {
	id, chargeID string
	amount       int64
	entries      int
}

// ledger returns merchant's payments, each with its number of ledger entries.
func (i *inspector) ledger(t *testing.T, merchant string) []ledgerRow {
	t.Helper()
	rows, err := i.db.Query(i.query(`SELECT p.id, p.provider_charge_id, p.amount,
		(SELECT COUNT(*) FROM ledger_entries l WHERE l.payment_id = p.id)
		FROM payments p WHERE p.merchant = ? ORDER BY p.id`), merchant)
	require.NoError(t, err)
	defer rows.Close()
	var out []ledgerRow
	for rows.Next() {
		var r ledgerRow
		require.NoError(t, rows.Scan(&r.id, &r.chargeID, &r.amount, &r.entries))
		out = append(out, r)
	}
	require.NoError(t, rows.Err())
	return out
}

// ledgerEntries counts merchant's ledger entries.
func (i *inspector) ledgerEntries(t *testing.T, merchant string) int {
	t.Helper()
	var n int
	require.NoError(t, i.db.QueryRow(i.query(`SELECT COUNT(*) FROM ledger_entries WHERE merchant = ?`), merchant).Scan(&n))
	return n
}
