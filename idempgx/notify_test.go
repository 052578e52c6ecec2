package idempgx_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/protocol"
)

// waitEngines returns two engines on one database through pools of their
// own (two processes), whose waiters poll once an hour: only a notification
// wakes a waiter of the second for the first's outcome. Behind a transaction
// pooler (IDEMPGX_TEST_POOLER) nothing listens, and they poll every 100 ms.
func waitEngines(t *testing.T) (owner, other *idem.Engine, pool *pgxpool.Pool) {
	t.Helper()
	d := openDriver(t, false, nil)
	d2 := secondDriver(t, d).(*idempgx.Driver)
	poll := time.Hour
	if testPooler == "transaction" {
		require.False(t, d2.Notifies())
		poll = 100 * time.Millisecond
	}
	cfg := idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, Poll: poll}, Logger: slog.New(slog.DiscardHandler)}
	owner, err := idem.NewEngineWith(d, cfg)
	require.NoError(t, err)
	other, err = idem.NewEngineWith(d2, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close(); _ = other.Close() })
	return owner, other, d2.Pool()
}

func waitParams() idem.DoParams {
	return idem.DoParams{Scope: "acct", Key: "k", Payload: []byte("a")}
}

// runHeld runs the key's first execution on g until release is closed.
func runHeld(t *testing.T, g *idem.Engine) (release chan struct{}, done chan error) {
	started := make(chan struct{})
	release, done = make(chan struct{}), make(chan error, 1)
	go func() {
		_, err := g.Do(context.Background(), waitParams(), func(context.Context) (idem.Result, error) {
			close(started)
			<-release
			return idem.Result{Status: 201, Body: []byte("one")}, nil
		})
		done <- err
	}()
	<-started
	return release, done
}

// waiters starts n duplicates on g and returns their errors' channel once
// all of them wait.
func waiters(t *testing.T, g *idem.Engine, n int) chan error {
	out := make(chan error, n)
	var runs atomic.Int32
	for range n {
		go func() {
			res, err := g.Do(context.Background(), waitParams(), func(context.Context) (idem.Result, error) {
				runs.Add(1)
				return idem.Result{Status: 201, Body: []byte("two")}, nil
			})
			if err == nil && string(res.Body) != "one" {
				err = context.Canceled // a wrong answer: reported below
			}
			out <- err
		}()
	}
	deadline := time.Now().Add(time.Minute)
	for g.Waiters() < n {
		require.True(t, time.Now().Before(deadline), "%d waiters, not %d", g.Waiters(), n)
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
	t.Cleanup(func() { require.Zero(t, runs.Load(), "no duplicate ran") })
	return out
}

// The commit of another process's execution wakes this process's waiters
// through LISTEN/NOTIFY: they poll once an hour, and get the answer.
func TestNotificationWakesAnotherProcess(t *testing.T) {
	owner, other, _ := waitEngines(t)
	release, done := runHeld(t, owner)
	out := waiters(t, other, 20)
	close(release)
	require.NoError(t, <-done)
	for range 20 {
		require.NoError(t, <-out)
	}
}

// A listener whose connection is killed reconnects, and the waiters read
// their record again once it listens: none misses the outcome.
func TestListenerReconnects(t *testing.T) {
	owner, other, pool := waitEngines(t)
	release, done := runHeld(t, owner)
	out := waiters(t, other, 5)
	if testPooler != "transaction" {
		killListener(t, pool)
	}
	// Reconnected (a second later) before the owner commits, or after it:
	// either way every waiter gets the answer, never an hour's poll.
	close(release)
	require.NoError(t, <-done)
	for range 5 {
		require.NoError(t, <-out)
	}
}

// killListener ends the connection that LISTENs on idem_keys.
func killListener(t *testing.T, pool *pgxpool.Pool) {
	deadline := time.Now().Add(time.Minute)
	for {
		var n int64
		require.NoError(t, pool.QueryRow(t.Context(), `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
			WHERE query ILIKE 'listen %' AND pid <> pg_backend_pid()`).Scan(&n))
		if n > 0 {
			return
		}
		require.True(t, time.Now().Before(deadline), "the listener's connection is found")
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
}

// Behind a transaction pooler, without Options.ListenConfig, the driver
// does not notify this process (its waiters poll); with it, it does.
func TestNotifiesBehindATransactionPooler(t *testing.T) {
	d := openDriver(t, false, nil)
	plain, err := idempgx.NewWithOptions(d.Pool(), idempgx.Options{})
	require.NoError(t, err)
	require.True(t, plain.Notifies())
	cfg := d.Pool().Config()
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec // as behind a transaction pooler
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	pooled, err := idempgx.NewWithOptions(pool, idempgx.Options{TransactionPooler: true})
	require.NoError(t, err)
	require.False(t, pooled.Notifies())
	require.Error(t, pooled.Listen(t.Context(), func(bool) {}, func(string) {}))
	direct, err := idempgx.NewWithOptions(pool, idempgx.Options{TransactionPooler: true, ListenConfig: d.Pool().Config().ConnConfig})
	require.NoError(t, err)
	require.True(t, direct.Notifies())
}

// A closed engine starts no listener: its waiters poll, and get the answer.
func TestClosedEngineDoesNotListen(t *testing.T) {
	if testPooler == "transaction" {
		t.Skip("behind a transaction pooler nothing listens anyway")
	}
	d := openDriver(t, false, nil)
	cfg := d.Pool().Config()
	cfg.ConnConfig.RuntimeParams["application_name"] = "idem-closed-engine-test"
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d2, err := idempgx.NewWithOptions(pool, idempgx.Options{Schema: d.Schema()})
	require.NoError(t, err)
	owner, err := idem.NewEngineWith(d, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close() })
	closed, err := idem.NewEngineWith(d2, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, Poll: 20 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	require.NoError(t, closed.Close())
	release, done := runHeld(t, owner)
	out := waiters(t, closed, 3)
	var listeners int
	require.NoError(t, d.Pool().QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
		WHERE application_name = 'idem-closed-engine-test' AND query ILIKE 'listen %'`).Scan(&listeners))
	require.Zero(t, listeners)
	close(release)
	require.NoError(t, <-done)
	for range 3 {
		require.NoError(t, <-out)
	}
}

// A durable-claim end with NotifyMarked notifies only a record a waiter
// marked (MarkWaited): none for an execution nobody waits for. A mark
// never waits for the row's lock, and holds only for the execution it
// names. Whether a notification was sent is told without waiting: a
// sentinel sent after the end arrives after any notification of the end
// (PostgreSQL delivers them in commit order).
func TestNotifiesOnlyWhenMarked(t *testing.T) {
	if testPooler == "transaction" {
		t.Skip("LISTEN needs a server connection of its own; run in the plain suite")
	}
	t.Parallel()
	for name, open := range map[string]func(testing.TB) *idempgx.Driver{
		"plain":       func(t testing.TB) *idempgx.Driver { return openDriver(t, false, nil) },
		"partitioned": newPartitioned,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			notifiesOnlyWhenMarked(t, open(t))
		})
	}
}

func notifiesOnlyWhenMarked(t *testing.T, d *idempgx.Driver) {
	ctx := t.Context()
	notified := listen(t, d)
	tag := fmt.Sprintf("marked-test-%d-", time.Now().UnixNano())
	claim := func(key string) idemdriver.FenceParams {
		res, err := d.Claim(ctx, claimParams(key, 0))
		require.NoError(t, err)
		require.True(t, res.Claimed)
		return idemdriver.FenceParams{Scope: res.Record.Scope, Key: res.Record.Key, FencingToken: res.Record.FencingToken,
			CreatedAt: res.Record.CreatedAt, Notify: tag + key, NotifyMarked: true}
	}
	ends := map[string]func(idemdriver.FenceParams) (bool, error){
		"complete": func(f idemdriver.FenceParams) (bool, error) {
			c := completion(idemdriver.Record{Scope: f.Scope, Key: f.Key, FencingToken: f.FencingToken, CreatedAt: f.CreatedAt}, 0)
			c.FenceParams = f
			return d.Complete(ctx, c)
		},
		"fail":    func(f idemdriver.FenceParams) (bool, error) { return d.Fail(ctx, f) },
		"release": func(f idemdriver.FenceParams) (bool, error) { return d.Release(ctx, f) },
	}
	for name, end := range ends {
		f := claim(name + "-unmarked")
		ok, err := end(f)
		require.NoError(t, err)
		require.True(t, ok)
		require.False(t, notified(f.Notify), "%s: nobody marked the record, nothing is sent", name)

		f = claim(name + "-marked")
		for range 2 { // marked, then found marked
			marked, err := d.MarkWaited(ctx, f)
			require.NoError(t, err)
			require.True(t, marked)
		}
		ok, err = end(f)
		require.NoError(t, err)
		require.True(t, ok)
		require.True(t, notified(f.Notify), "%s: a waiter marked the record", name)
		marked, err := d.MarkWaited(ctx, f)
		require.NoError(t, err)
		require.False(t, marked, "%s: the execution ended; a mark would wake nobody", name)
	}

	// A row locked by a write in progress (its owner's end) is not waited
	// for: the mark is refused at once.
	f := claim("locked")
	tx, err := d.Pool().Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	table := "idem_keys"
	if d.Schema() != "" {
		table = d.Schema() + "." + table
	}
	_, err = tx.Exec(ctx, "UPDATE "+table+" SET updated_at = updated_at WHERE scope = $1 AND key = $2", f.Scope, f.Key)
	require.NoError(t, err)
	marked, err := d.MarkWaited(ctx, f)
	require.NoError(t, err)
	require.False(t, marked)
	require.NoError(t, tx.Rollback(ctx))

	// Another execution of the record (a takeover's token) is not marked.
	stale := f
	stale.FencingToken++
	marked, err = d.MarkWaited(ctx, stale)
	require.NoError(t, err)
	require.False(t, marked)
}

// listen LISTENs on idem_keys on a connection of its own to d's database,
// and returns notified, which reports whether payload was sent before a
// sentinel that it sends: PostgreSQL delivers notifications in commit
// order, so the answer needs no wait. Other tests' notifications (any
// package's, on the same database) are passed over.
func listen(t *testing.T, d *idempgx.Driver) (notified func(payload string) bool) {
	ctx := t.Context()
	conn, err := pgx.ConnectConfig(ctx, d.Pool().Config().ConnConfig.Copy())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, "LISTEN "+idempgx.NotifyChannel)
	require.NoError(t, err)
	return func(payload string) bool {
		sentinel := fmt.Sprintf("sentinel-%d-%s", time.Now().UnixNano(), payload)
		_, err := d.Pool().Exec(ctx, "SELECT pg_notify($1, $2)", idempgx.NotifyChannel, sentinel)
		require.NoError(t, err)
		seen := false
		for {
			n, err := conn.WaitForNotification(ctx)
			require.NoError(t, err)
			switch n.Payload {
			case payload:
				seen = true
			case sentinel:
				return seen
			}
		}
	}
}

// An engine in wait mode notifies its durable-claim executions' ends only
// when a waiter marked the record, and every one-commit execution's end
// (its owner holds the row's lock while it runs: no waiter can mark it).
func TestEngineNotifiesByMode(t *testing.T) {
	if testPooler == "transaction" {
		t.Skip("LISTEN needs a server connection of its own; run in the plain suite")
	}
	t.Parallel()
	d := openDriver(t, false, nil)
	notified := listen(t, d)
	for _, oneCommit := range []bool{false, true} {
		g, err := idem.NewEngineWith(d, idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour},
			OneCommit: idem.OneCommitOptions{Enabled: oneCommit}, Logger: slog.New(slog.DiscardHandler)})
		require.NoError(t, err)
		t.Cleanup(func() { _ = g.Close() })
		key := fmt.Sprintf("by-mode-%v", oneCommit)
		_, err = g.Do(t.Context(), idem.DoParams{Scope: "acct", Key: key}, func(context.Context) (idem.Result, error) {
			return idem.Result{Status: 201}, nil
		})
		require.NoError(t, err)
		require.Equal(t, oneCommit, notified(protocol.NotifyPayload("acct", key)), "one-commit %v, nobody waiting", oneCommit)
	}
}

// markTracer counts the mark statements (MarkWaited's) a pool sends.
type markTracer struct{ n atomic.Int64 }

func (m *markTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.Contains(data.SQL, "SKIP LOCKED") {
		m.n.Add(1)
	}
	return ctx
}
func (m *markTracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// A waiter whose mark is refused (the row locked by a write in progress:
// here the test's) marks again when it wakes, at Waiting.Poll: the record
// ends up marked, so its owner's end notifies. The state is read, not
// waited for.
func TestRefusedMarkIsMadeAgain(t *testing.T) {
	if testPooler == "transaction" {
		t.Skip("nothing listens behind a transaction pooler, so nothing marks")
	}
	t.Parallel()
	d := openDriver(t, false, nil)
	marks := &markTracer{}
	cfg := d.Pool().Config()
	cfg.ConnConfig.Tracer = marks
	pool, err := pgxpool.NewWithConfig(t.Context(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d2, err := idempgx.NewWithOptions(pool, idempgx.Options{Schema: d.Schema()})
	require.NoError(t, err)
	opts := idem.EngineOptions{Waiting: idem.WaitOptions{Wait: time.Hour, Poll: 50 * time.Millisecond}, Logger: slog.New(slog.DiscardHandler)}
	owner, err := idem.NewEngineWith(d, opts)
	require.NoError(t, err)
	other, err := idem.NewEngineWith(d2, opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = owner.Close(); _ = other.Close() })

	table := "idem_keys"
	if d.Schema() != "" {
		table = d.Schema() + "." + table
	}
	waited := func() bool {
		var w bool
		require.NoError(t, d.Pool().QueryRow(t.Context(), "SELECT waited FROM "+table+" WHERE scope = 'acct' AND key = 'k'").Scan(&w))
		return w
	}
	release, done := runHeld(t, owner)
	lock, err := d.Pool().Begin(t.Context())
	require.NoError(t, err)
	defer func() { _ = lock.Rollback(context.Background()) }()
	_, err = lock.Exec(t.Context(), "SELECT 1 FROM "+table+" WHERE scope = 'acct' AND key = 'k' FOR UPDATE")
	require.NoError(t, err)
	out := waiters(t, other, 1)
	deadline := time.Now().Add(time.Minute)
	for marks.n.Load() == 0 {
		require.True(t, time.Now().Before(deadline), "the waiter tried no mark")
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
	require.False(t, waited(), "a locked row is not marked")
	require.NoError(t, lock.Rollback(t.Context()))
	for !waited() {
		require.True(t, time.Now().Before(deadline), "the refused mark was not made again")
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
	close(release)
	require.NoError(t, <-done)
	require.NoError(t, <-out)
}
