package idemmysql_test

// MySQL's traps, one named test each, beside the conformance suite.

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemdrivertest"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/seal"
)

const (
	lease     = 30 * time.Second
	retention = 24 * time.Hour
	racers    = 64
)

func params(scope, key, body string) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: scope, Key: key, Method: "POST", Path: "/v1/payments",
		Fingerprint: []byte("fp:" + body), LeaseDuration: lease, Retention: retention}
}

func fence(rec idemdriver.Record) idemdriver.FenceParams {
	return idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
		LeaseDuration: lease}
}

func okResponse(body []byte) idemdriver.Response {
	return idemdriver.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/octet-stream"}},
		Body: body, BodyStored: true, BodySize: int64(len(body))}
}

// isolationVar is the name of the session isolation variable on this server:
// transaction_isolation (MySQL 8, MariaDB 11.1+) or tx_isolation (older MariaDB).
func isolationVar(t *testing.T, db *sql.DB) string {
	t.Helper()
	var v string
	err := db.QueryRow(`SELECT @@SESSION.transaction_isolation`).Scan(&v)
	if err == nil {
		return "transaction_isolation"
	}
	var me *mysql.MySQLError
	require.True(t, errors.As(err, &me) && me.Number == 1193, "unexpected error: %v", err)
	return "tx_isolation"
}

// barrier returns a beforeWrite hook that holds every claim between its
// read and its write until n claims have read: all n then write at once,
// and n-1 of them lose.
func barrier(n int) func() {
	var arrived atomic.Int32
	all := make(chan struct{})
	return func() {
		if arrived.Add(1) == int32(n) {
			close(all)
		}
		<-all
	}
}

// race runs racers concurrent claims of p and returns their results; it
// fails the test on any error.
func race(t *testing.T, d idemdriver.Driver, p idemdriver.ClaimParams) []idemdriver.ClaimResult {
	t.Helper()
	results, err := dbtest.Race(racers, func() (idemdriver.ClaimResult, error) { return d.Claim(context.Background(), p) })
	require.NoError(t, err)
	return results
}

// requireOneWinner checks that exactly one result claimed and that every
// other one answers from the winner's row.
func requireOneWinner(t *testing.T, results []idemdriver.ClaimResult) idemdriver.Record {
	t.Helper()
	require.Len(t, results, racers)
	var winner *idemdriver.Record
	for i := range results {
		if results[i].Claimed {
			require.Nil(t, winner, "two winners")
			winner = &results[i].Record
		}
	}
	require.NotNil(t, winner, "no winner")
	for _, r := range results {
		if !r.Claimed {
			require.Equal(t, winner.FencingToken, r.Record.FencingToken, "a loser sees the winner's row")
			require.Equal(t, idemdriver.StateProcessing, r.Record.State)
			require.Positive(t, r.Record.LeaseLeft, "a loser sees the winner's live lease")
		}
	}
	return *winner
}

// Under REPEATABLE READ (the server default), a plain SELECT in a
// transaction that had read before losing an INSERT would read the old
// snapshot and miss the winner's row. The claim holds no transaction across
// statements, so it answers correctly whatever the sessions' isolation.
func TestRepeatableReadPool(t *testing.T) {
	t.Parallel()
	probe := dbtest.MySQLDB(t)
	name := isolationVar(t, probe)
	d := open(t, name+"=%27REPEATABLE-READ%27")
	for i := 0; i < 4; i++ { // every connection the race may use reports REPEATABLE READ
		var level string
		require.NoError(t, d.DB().QueryRow(`SELECT @@SESSION.`+name).Scan(&level))
		require.Equal(t, "REPEATABLE-READ", level)
	}

	// A new key: every racer reads "no record", then all insert at once.
	idemmysql.SetBeforeWrite(d, barrier(racers))
	winner := requireOneWinner(t, race(t, d, params("acct", "new", "b")))
	require.Equal(t, int64(racers-1), idemmysql.Resolved(d)["duplicate"], "every loser lost its INSERT (1062) and read again")

	// A FAILED record: every racer reads it claimable, then all compare-and-set.
	ok, err := d.Fail(context.Background(), fence(winner))
	require.NoError(t, err)
	require.True(t, ok)
	idemmysql.SetBeforeWrite(d, barrier(racers))
	again := requireOneWinner(t, race(t, d, params("acct", "new", "b")))
	require.Equal(t, winner.FencingToken+1, again.FencingToken)
	require.Equal(t, 2, again.Attempts)
	require.Equal(t, int64(racers-1), idemmysql.Resolved(d)["raced"], "every loser's compare-and-set matched no row")
}

func TestErrorMapping(t *testing.T) {
	t.Parallel()
	my := func(n uint16) error { return &mysql.MySQLError{Number: n, Message: "test"} }
	for _, tc := range []struct {
		err  error
		want string
	}{
		{my(1062), "duplicate"},
		{my(1213), "deadlock"},
		{my(1205), "lock-wait"},
		{my(1020), "changed"},
		{my(1193), "unknown-variable"},
		{fmt.Errorf("exec: %w", my(1062)), "duplicate"},
		{fmt.Errorf("exec: %w", my(1213)), "deadlock"},
		{my(1146), "other"}, // table doesn't exist
		{my(1406), "other"}, // data too long
		{my(2013), "other"}, // lost connection
		{mysql.ErrInvalidConn, "other"},
		{context.DeadlineExceeded, "other"},
		{errors.New("dial tcp: connection refused"), "other"},
		{nil, "other"},
	} {
		require.Equal(t, tc.want, idemmysql.Classify(tc.err), "%v", tc.err)
	}
}

// The classic InnoDB insert deadlock: a transaction inserts the key and
// holds it; the claims' INSERTs queue behind it with shared locks; it rolls
// back, and the queued INSERTs deadlock on each other. InnoDB picks victims
// (1213); the driver runs their round again and they answer from the row
// that won.
func TestDeadlockRace(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	blocker, err := d.DB().BeginTx(ctx, nil)
	require.NoError(t, err)
	_, err = blocker.ExecContext(ctx, "INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token,"+
		" created_at, updated_at, expires_at, attempts) VALUES ('acct', 'dl', 'POST', '/', '', 'FAILED', 1,"+
		" UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1)")
	require.NoError(t, err)
	defer blocker.Rollback() // also when the test fails, so that the claims end

	const n = 8
	idemmysql.SetBeforeWrite(d, barrier(n))
	results := make(chan idemdriver.ClaimResult, n)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			res, err := d.Claim(ctx, params("acct", "dl", "b"))
			errs <- err
			results <- res
		}()
	}
	// Wait until every claim's INSERT waits on the blocker's row lock.
	// INNODB_TRX is server-wide: count this database's waiters only. It is
	// a cache that InnoDB refreshes only after 0.1 s without readers: poll
	// more slowly than that.
	require.Eventually(t, func() bool {
		var waiting int
		err := d.DB().QueryRow(`SELECT COUNT(*) FROM information_schema.INNODB_TRX AS t
			JOIN information_schema.PROCESSLIST AS p ON p.ID = t.trx_mysql_thread_id
			WHERE t.trx_state = 'LOCK WAIT' AND p.DB = DATABASE()`).Scan(&waiting)
		return err == nil && waiting == n
	}, 20*time.Second, 250*time.Millisecond)
	require.NoError(t, blocker.Rollback())

	winners := 0
	var all []idemdriver.ClaimResult
	for i := 0; i < n; i++ {
		require.NoError(t, <-errs)
		res := <-results
		all = append(all, res)
		if res.Claimed {
			winners++
		}
	}
	require.Equal(t, 1, winners)
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "dl"})
	require.NoError(t, err)
	for _, r := range all {
		require.Equal(t, rec.FencingToken, r.Record.FencingToken)
	}
	resolved := idemmysql.Resolved(d)
	t.Logf("resolved by reading again: %v", resolved)
	require.Positive(t, resolved["deadlock"], "InnoDB chose deadlock victims (1213), and none became an error")
}

// A business transaction has written its completion (the row is locked) but
// not committed yet, and the lease has run out meanwhile. A takeover's
// compare-and-set waits for the row lock until innodb_lock_wait_timeout
// (1205); the claim then answers from the row (PROCESSING: the core answers
// 409 request-in-flight), never with an error, and the handler does not run.
// Once the transaction commits, the same request replays its response.
func TestLockWaitTimeout(t *testing.T) {
	t.Parallel()
	d := open(t, "innodb_lock_wait_timeout=1")
	ctx := context.Background()
	const body = `{"amount":1}`
	newRequest := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(body))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idem.HeaderKey, "lw")
		return r
	}
	// The record as the middleware claims it (scope "global").
	p := idemdriver.ClaimParams{Scope: "global", Key: "lw", Method: http.MethodPost, Path: "/v1/payments",
		Fingerprint: fingerprint.Request(newRequest(), []byte(body)), LeaseDuration: lease, Retention: retention}
	res, err := d.Claim(ctx, p)
	require.NoError(t, err)
	tx, err := d.Begin(ctx)
	require.NoError(t, err)
	defer tx.Rollback(ctx)
	ok, err := tx.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: okResponse([]byte("done"))})
	require.NoError(t, err)
	require.True(t, ok)

	late := p
	late.ClockOffset = lease + time.Second
	start := time.Now()
	got, err := d.Claim(ctx, late)
	require.NoError(t, err)
	require.False(t, got.Claimed)
	require.Equal(t, idemdriver.StateProcessing, got.Record.State)
	require.Equal(t, res.Record.FencingToken, got.Record.FencingToken)
	require.Equal(t, int64(1), idemmysql.Resolved(d)["lock-wait"])
	require.Less(t, time.Since(start), 5*time.Second, "one lock wait, not one per try")

	// Through the middleware, on a clock past the lease: 409, handler not run.
	clock := &idemdrivertest.Clock{}
	clock.Advance(lease + time.Second)
	m, err := idem.NewMiddleware(idemdrivertest.Shift(d, clock), idem.Options{Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int32
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, newRequest())
	require.Equal(t, http.StatusConflict, w.Code, w.Body.String())
	require.Contains(t, w.Body.String(), "request-in-flight")
	require.Zero(t, runs.Load())
	// Regression: a 409 for a record whose lease had run out went out
	// without Retry-After (CONTRACT section 3 asks for at least 1 s).
	require.Equal(t, "1", w.Header().Get("Retry-After"))

	require.NoError(t, tx.Commit(ctx))
	got, err = d.Claim(ctx, late)
	require.NoError(t, err)
	require.False(t, got.Claimed)
	require.Equal(t, idemdriver.StateSucceeded, got.Record.State)
	require.Equal(t, "done", string(got.Record.Response.Body))
	w = httptest.NewRecorder()
	h.ServeHTTP(w, newRequest())
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, "true", w.Header().Get(idem.HeaderReplayed))
	require.Equal(t, "done", w.Body.String())
	require.Zero(t, runs.Load())
}

// INSERT IGNORE and a lax sql_mode would truncate an over-long value and let
// two scopes that share a 255-byte prefix meet. Claim refuses such values
// itself, whatever the sql_mode; Open's sessions are strict besides, so the
// application's own writes error too.
func TestNoSilentTruncation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	long := strings.Repeat("s", idemmysql.MaxScopeBytes)
	for _, url := range []string{"", "sql_mode=%27%27"} { // Open's strict default; a lax mode
		d := open(t, url)
		res, err := d.Claim(ctx, params(long, "k", "b"))
		require.NoError(t, err, "255 bytes fit")
		require.True(t, res.Claimed)
		_, err = d.Claim(ctx, params(long+"x", "k", "b"))
		require.ErrorIs(t, err, idemmysql.ErrTooLong)
		require.ErrorContains(t, err, "scope is 256 bytes")
		_, err = d.Claim(ctx, params("acct", strings.Repeat("k", 256), "b"))
		require.ErrorIs(t, err, idemmysql.ErrTooLong)
		var n int
		require.NoError(t, d.DB().QueryRow(`SELECT COUNT(*) FROM idem_keys`).Scan(&n))
		require.Equal(t, 1, n, "nothing written for the over-long values")
	}

	d := open(t, "")
	var mode string
	require.NoError(t, d.DB().QueryRow(`SELECT @@SESSION.sql_mode`).Scan(&mode))
	require.Contains(t, mode, "STRICT_TRANS_TABLES")
	_, err := d.DB().Exec("INSERT INTO idem_keys (scope, `key`, method, path, fingerprint, state, fencing_token,"+
		" created_at, updated_at, expires_at, attempts) VALUES (?, 'k', 'POST', '/', '', 'FAILED', 1,"+
		" UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 1)", long+"x")
	var me *mysql.MySQLError
	require.ErrorAs(t, err, &me)
	require.EqualValues(t, 1406, me.Number, "Data too long: an error, not a truncation")
}

// Times are UTC_TIMESTAMP(6) in DATETIME(6) columns: a session whose
// time_zone is '+09:00' writes and reads the same instants as a UTC one, to
// the microsecond.
func TestTimeZoneNoDrift(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.MySQLURL(t)
	tokyo, err := idemmysql.Open(context.Background(), url+sep(url)+"time_zone=%27%2B09%3A00%27")
	require.NoError(t, err)
	t.Cleanup(func() { tokyo.Close() })
	require.NoError(t, tokyo.Migrate(context.Background()))
	utc, err := idemmysql.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { utc.Close() })
	ctx := context.Background()

	var zone string
	var skew int64
	require.NoError(t, tokyo.DB().QueryRow(`SELECT @@SESSION.time_zone, TIMESTAMPDIFF(SECOND, UTC_TIMESTAMP(), NOW())`).Scan(&zone, &skew))
	require.Equal(t, "+09:00", zone)
	require.EqualValues(t, 9*3600, skew, "the session really runs nine hours ahead")

	for _, tc := range []struct {
		name   string
		writer *idemmysql.Driver
		reader *idemmysql.Driver
	}{{"tokyo-writes", tokyo, utc}, {"utc-writes", utc, tokyo}} {
		res, err := tc.writer.Claim(ctx, params("acct", tc.name, "b"))
		require.NoError(t, err)
		var serverUTC time.Time
		require.NoError(t, tc.writer.DB().QueryRow(`SELECT UTC_TIMESTAMP(6)`).Scan(&serverUTC))
		require.WithinDuration(t, serverUTC, res.Record.CreatedAt, time.Second, "created_at is the server's UTC now")
		require.Equal(t, time.UTC, res.Record.CreatedAt.Location())

		got, err := tc.reader.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: tc.name})
		require.NoError(t, err)
		require.True(t, got.CreatedAt.Equal(res.Record.CreatedAt), "%s: %s vs %s", tc.name, got.CreatedAt, res.Record.CreatedAt)
		require.True(t, got.ExpiresAt.Equal(res.Record.ExpiresAt))
		require.True(t, got.LockedUntil.Equal(*res.Record.LockedUntil))
		require.InDelta(t, lease.Seconds(), got.LeaseLeft.Seconds(), 2)

		// The stored DATETIME(6) is the UTC wall clock, with microseconds.
		var stored time.Time
		require.NoError(t, tc.reader.DB().QueryRow("SELECT created_at FROM idem_keys WHERE `key` = ?", tc.name).Scan(&stored))
		require.True(t, stored.Equal(res.Record.CreatedAt), "%s vs %s", stored, res.Record.CreatedAt)
	}
}

// Every statement adds ClockOffset to the database's now, and LeaseLeft is
// computed by the database from its own now.
func TestClockOffset(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	var serverUTC time.Time
	require.NoError(t, d.DB().QueryRow(`SELECT UTC_TIMESTAMP(6)`).Scan(&serverUTC))

	// Every time column keeps microseconds.
	rows, err := d.DB().Query(`SELECT COLUMN_NAME, DATETIME_PRECISION FROM information_schema.COLUMNS
		WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = 'idem_keys' AND DATA_TYPE = 'datetime'`)
	require.NoError(t, err)
	precision := map[string]int{}
	for rows.Next() {
		var col string
		var p int
		require.NoError(t, rows.Scan(&col, &p))
		precision[col] = p
	}
	require.NoError(t, rows.Err())
	require.Equal(t, map[string]int{"locked_until": 6, "created_at": 6, "updated_at": 6, "completed_at": 6, "expires_at": 6}, precision)

	p := params("acct", "k", "b")
	p.ClockOffset = -10 * time.Second
	res, err := d.Claim(ctx, p)
	require.NoError(t, err)
	require.WithinDuration(t, serverUTC.Add(-10*time.Second), res.Record.CreatedAt, time.Second)
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"}) // at the database's own now
	require.NoError(t, err)
	require.InDelta(t, (lease - 10*time.Second).Seconds(), rec.LeaseLeft.Seconds(), 1)

	ok, err := d.Heartbeat(ctx, idemdriver.FenceParams{Scope: "acct", Key: "k", FencingToken: rec.FencingToken,
		CreatedAt: rec.CreatedAt, LeaseDuration: lease, ClockOffset: time.Hour})
	require.NoError(t, err)
	require.True(t, ok)
	rec, err = d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
	require.NoError(t, err)
	require.InDelta(t, (time.Hour + lease).Seconds(), rec.LeaseLeft.Seconds(), 1)
}

// MySQL reports an UPDATE that leaves its row unchanged as 0 rows affected
// (unless clientFoundRows is set). With the server's clock frozen (SET
// timestamp), two heartbeats compute the same locked_until; the second must
// still report ownership, with clientFoundRows off (Open) and on (New).
func TestFencedWriteAlwaysCounts(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url, _ := dbtest.MySQLURL(t)
	frozen := "timestamp=1700000000.123456"
	opened, err := idemmysql.Open(ctx, url+sep(url)+frozen)
	require.NoError(t, err)
	t.Cleanup(func() { opened.Close() })
	require.NoError(t, opened.Migrate(ctx))

	cfg, err := idemmysql.ParseURL(url + sep(url) + frozen)
	require.NoError(t, err)
	cfg.ClientFoundRows = true
	found, _ := fromConfig(t, cfg)

	for _, tc := range []struct {
		name string
		d    *idemmysql.Driver
	}{{"clientFoundRows=false", opened}, {"clientFoundRows=true", found}} {
		var now time.Time
		require.NoError(t, tc.d.DB().QueryRow(`SELECT UTC_TIMESTAMP(6)`).Scan(&now))
		require.Equal(t, time.Date(2023, 11, 14, 22, 13, 20, 123456000, time.UTC), now, "the clock is frozen")

		res, err := tc.d.Claim(ctx, params("acct", tc.name, "b"))
		require.NoError(t, err)
		for i := 0; i < 3; i++ {
			ok, err := tc.d.Heartbeat(ctx, fence(res.Record))
			require.NoError(t, err)
			require.True(t, ok, "%s: heartbeat %d on an unchanged lease still owns the record", tc.name, i)
		}
		stale := fence(res.Record)
		stale.FencingToken--
		ok, err := tc.d.Heartbeat(ctx, stale)
		require.NoError(t, err)
		require.False(t, ok, "%s: a stale token never counts", tc.name)
		ok, err = tc.d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: okResponse([]byte("x"))})
		require.NoError(t, err)
		require.True(t, ok)
		rec, err := tc.d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: tc.name})
		require.NoError(t, err)
		require.True(t, rec.UpdatedAt.After(rec.CreatedAt), "updated_at moved on by a microsecond per write")
	}
}

// A 2 MiB response body round-trips byte-exact (LONGBLOB; the server's
// max_allowed_packet is 16 MiB on MariaDB 10.11 and 64 MiB on MySQL 8).
func TestLargeBodyRoundTrip(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	body := make([]byte, 2<<20)
	_, err := rand.Read(body)
	require.NoError(t, err)
	res, err := d.Claim(ctx, params("acct", "big", "b"))
	require.NoError(t, err)
	ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: okResponse(body)})
	require.NoError(t, err)
	require.True(t, ok)
	again, err := d.Claim(ctx, params("acct", "big", "b"))
	require.NoError(t, err)
	require.False(t, again.Claimed)
	require.True(t, bytes.Equal(body, again.Record.Response.Body), "replay is byte-exact")
	require.EqualValues(t, len(body), again.Record.Response.BodySize)

	// Also inside a business transaction.
	res, err = d.Claim(ctx, params("acct", "big-tx", "b"))
	require.NoError(t, err)
	tx, err := d.Begin(ctx)
	require.NoError(t, err)
	ok, err = tx.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: okResponse(body)})
	require.NoError(t, err)
	require.True(t, ok)
	require.NoError(t, tx.Commit(ctx))
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "big-tx"})
	require.NoError(t, err)
	require.True(t, bytes.Equal(body, rec.Response.Body))
}

// A response larger than the server's max_allowed_packet (16 MiB on MariaDB
// 10.11) but within MaxResponseBytes is recorded as not stored: the replay
// answers 410 response-not-stored and the handler never runs twice (issue 13
// item 4). It was refused with an error: the core answered 503, the record
// stayed PROCESSING, and every retry ran the handler again.
func TestResponseOverMaxAllowedPacket(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	var maxPacket int
	require.NoError(t, d.DB().QueryRow(`SELECT @@max_allowed_packet`).Scan(&maxPacket))
	if maxPacket > 64<<20 {
		t.Skipf("max_allowed_packet is %d bytes", maxPacket)
	}
	body := bytes.Repeat([]byte("x"), maxPacket+1)

	// At the driver, alone and in a business transaction.
	for _, inTx := range []bool{false, true} {
		key := fmt.Sprintf("huge-tx=%v", inTx)
		res, err := d.Claim(ctx, params("acct", key, "b"))
		require.NoError(t, err)
		resp := okResponse(body)
		resp.Header["Location"] = []string{"/v1/payments/1"}
		cp := idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: resp}
		var ok bool
		if inTx {
			tx, err := d.Begin(ctx)
			require.NoError(t, err)
			ok, err = tx.Complete(ctx, cp)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
		} else {
			ok, err = d.Complete(ctx, cp)
			require.NoError(t, err)
		}
		require.True(t, ok)
		rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: key})
		require.NoError(t, err)
		require.Equal(t, idemdriver.StateSucceeded, rec.State)
		require.False(t, rec.Response.BodyStored)
		require.Empty(t, rec.Response.Body)
		require.EqualValues(t, len(body), rec.Response.BodySize)
		require.Equal(t, 201, rec.Response.Status)
		require.Equal(t, []string{"/v1/payments/1"}, rec.Response.Header["Location"], "the headers still fit")
	}

	// Through the middleware, with MaxResponseBytes above the server's limit.
	newRequest := func() *http.Request {
		r := httptest.NewRequest(http.MethodPost, "/v1/payments", strings.NewReader(`{"amount":1}`))
		r.Header.Set("Content-Type", "application/json")
		r.Header.Set(idem.HeaderKey, "huge-http")
		return r
	}
	m, err := idem.NewMiddleware(d, idem.Options{Engine: idem.EngineOptions{Response: idem.ResponseOptions{MaxBytes: 2 * int64(maxPacket)}}, Scope: idem.SingleTenant})
	require.NoError(t, err)
	var runs atomic.Int32
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		runs.Add(1)
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write(body)
	}))
	w := httptest.NewRecorder()
	h.ServeHTTP(w, newRequest())
	require.Equal(t, http.StatusCreated, w.Code)
	require.Equal(t, len(body), w.Body.Len(), "the first caller gets the whole response")
	for range 3 {
		w = httptest.NewRecorder()
		h.ServeHTTP(w, newRequest())
		require.Equal(t, http.StatusGone, w.Code, w.Body.String())
		require.Contains(t, w.Body.String(), "response-not-stored")
	}
	require.EqualValues(t, 1, runs.Load(), "the handler ran once")
}

// Keys and scopes are binary strings: case, trailing spaces and accents all
// make different keys (no case-insensitive or PAD SPACE collation).
func TestKeysAreBinary(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	for _, sk := range [][2]string{
		{"acct", "key-a"}, {"acct", "KEY-A"}, {"acct", "Key-A"}, {"acct", "key-a "},
		{"ACCT", "key-a"}, {"acct ", "key-a"}, {"acct\x00", "key-a"}, {"caf\u00e9", "key-a"}, {"cafe", "key-a"},
	} {
		res, err := d.Claim(ctx, params(sk[0], sk[1], "b"))
		require.NoError(t, err)
		require.True(t, res.Claimed, "%q/%q is a key of its own", sk[0], sk[1])
		rec, err := d.Get(ctx, idemdriver.GetParams{Scope: sk[0], Key: sk[1]})
		require.NoError(t, err)
		require.Equal(t, sk[0], rec.Scope)
		require.Equal(t, sk[1], rec.Key)
	}
	_, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "KEY-a"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound)
}

// Open's sessions default to READ COMMITTED, so a business transaction is
// START TRANSACTION alone; on a New pool whose sessions are REPEATABLE READ,
// Begin still runs the transaction at READ COMMITTED: a second read in it
// sees a row committed in between (REPEATABLE READ would not).
func TestBusinessTransactionIsolation(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	seesNewRows := func(d *idemmysql.Driver) bool {
		_, err := d.DB().Exec(`CREATE TABLE IF NOT EXISTS business_rows (id VARCHAR(255) PRIMARY KEY) ENGINE = InnoDB`)
		require.NoError(t, err)
		tx, err := d.Begin(ctx)
		require.NoError(t, err)
		defer tx.Rollback(ctx)
		count := func() (n int) {
			require.NoError(t, tx.Native().(*sql.Tx).QueryRowContext(ctx, `SELECT COUNT(*) FROM business_rows`).Scan(&n))
			return n
		}
		before := count()
		_, err = d.DB().Exec(`INSERT INTO business_rows (id) VALUES (UUID())`)
		require.NoError(t, err)
		return count() == before+1
	}
	opened := open(t, "")
	name := isolationVar(t, opened.DB())
	var session string
	require.NoError(t, opened.DB().QueryRow(`SELECT @@SESSION.`+name).Scan(&session))
	require.Equal(t, "READ-COMMITTED", session)
	require.True(t, seesNewRows(opened), "READ COMMITTED")

	db := dbtest.MySQLDB(t) // go-sql-driver's defaults: the server's REPEATABLE READ
	require.NoError(t, db.QueryRow(`SELECT @@SESSION.`+name).Scan(&session))
	require.Equal(t, "REPEATABLE-READ", session)
	d := idemmysql.New(db)
	t.Cleanup(func() { d.Close() })
	require.NoError(t, d.Migrate(ctx))
	require.True(t, seesNewRows(d), "READ COMMITTED, set per transaction")

	// The control: a plain REPEATABLE READ transaction on the same pool
	// does not see the row.
	tx, err := db.BeginTx(ctx, nil)
	require.NoError(t, err)
	defer tx.Rollback()
	var before, after int
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM business_rows`).Scan(&before))
	_, err = db.Exec(`INSERT INTO business_rows (id) VALUES (UUID())`)
	require.NoError(t, err)
	require.NoError(t, tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM business_rows`).Scan(&after))
	require.Equal(t, before, after)
}

// New works on a pool with go-sql-driver's defaults (parseTime off, the
// server's time zone, sql_mode and isolation, clientFoundRows off), and with
// a loc far from UTC: no time crosses as a DATETIME value.
func TestNewOnPlainPool(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cfg, err := mysql.ParseDSN(dbtest.MySQLDSN(t))
	require.NoError(t, err)
	cfg.ParseTime, cfg.Loc = false, time.FixedZone("JST", 9*3600)
	d, db := fromConfig(t, cfg)
	require.NoError(t, d.Migrate(ctx))
	res, err := d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
	require.True(t, res.Claimed)
	ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: okResponse([]byte("ok"))})
	require.NoError(t, err)
	require.True(t, ok)
	rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
	require.NoError(t, err)
	require.Equal(t, "ok", string(rec.Response.Body))
	require.True(t, rec.CreatedAt.Equal(res.Record.CreatedAt))
	var serverUTC []byte // parseTime is off: DATETIME comes back as text
	require.NoError(t, db.QueryRow(`SELECT UTC_TIMESTAMP(6)`).Scan(&serverUTC))
	now, err := time.Parse("2006-01-02 15:04:05.999999", string(serverUTC))
	require.NoError(t, err)
	require.WithinDuration(t, now, rec.CreatedAt, time.Second)
	require.NoError(t, d.Close())
	require.NoError(t, db.Ping(), "Close leaves a pool it did not open")
}

func TestParseURL(t *testing.T) {
	t.Parallel()
	cfg, err := idemmysql.ParseURL("mysql://app:p%40ss%3Aw%2Frd@db.internal:3307/payments?timeout=3s&readTimeout=7s&innodb_lock_wait_timeout=5")
	require.NoError(t, err)
	require.Equal(t, "app", cfg.User)
	require.Equal(t, "p@ss:w/rd", cfg.Passwd)
	require.Equal(t, "tcp", cfg.Net)
	require.Equal(t, "db.internal:3307", cfg.Addr)
	require.Equal(t, "payments", cfg.DBName)
	require.Equal(t, 3*time.Second, cfg.Timeout)
	require.Equal(t, 7*time.Second, cfg.ReadTimeout)
	require.True(t, cfg.ParseTime)
	require.Equal(t, time.UTC, cfg.Loc)
	require.Equal(t, "5", cfg.Params["innodb_lock_wait_timeout"])
	require.Equal(t, "'+00:00'", cfg.Params["time_zone"])
	require.Contains(t, cfg.Params["sql_mode"], "STRICT_TRANS_TABLES")
	require.False(t, cfg.ClientFoundRows)

	cfg, err = idemmysql.ParseURL("mariadb://root@[::1]/test?time_zone=%27%2B09%3A00%27")
	require.NoError(t, err)
	require.Equal(t, "[::1]:3306", cfg.Addr)
	require.Equal(t, "'+09:00'", cfg.Params["time_zone"], "the URL's session settings win")
	require.Equal(t, idemmysql.DefaultDialTimeout, cfg.Timeout)

	for _, bad := range []string{
		"postgres://root@localhost/test", "mysql://root@localhost", "mysql://root@localhost/",
		"mysql://root@localhost/a/b", "mysql:///test", "mysql://root@localhost/test?timeout=soon", "::",
	} {
		_, err := idemmysql.ParseURL(bad)
		require.Error(t, err, bad)
	}
}

// The takeover's compare-and-set pins the state and created_at it read, not
// only the token (a completion keeps the token). Regression: a claim read a
// dead owner's expired record as the same request's unfinished execution;
// the owner's completion committed before the takeover's UPDATE, which then
// continued the SUCCEEDED record's life (old created_at, so the old relayed
// key, attempts 2) instead of starting a new one.
func TestTakeoverPinsTheStateItRead(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	d := open(t, "")
	p := params("acct", "k", "b")
	p.ClockOffset = -25 * time.Hour // the owner claimed 25 h ago and stalled
	owner, err := d.Claim(ctx, p)
	require.NoError(t, err)
	require.True(t, owner.Claimed)

	var once sync.Once
	idemmysql.SetBeforeWrite(d, func() {
		once.Do(func() { // between the claim's read and its write, the owner completes
			f := fence(owner.Record)
			ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: f, Response: okResponse([]byte("late"))})
			require.NoError(t, err)
			require.True(t, ok)
		})
	})
	res, err := d.Claim(ctx, params("acct", "k", "b"))
	require.NoError(t, err)
	require.True(t, res.Claimed, "the expired record is claimed")
	require.Equal(t, 1, res.Record.Attempts, "as a new life: the completion ended the old one")
	require.True(t, res.Record.CreatedAt.After(owner.Record.CreatedAt), "a new created_at, so a new relayed key")
}

// A completion past max_allowed_packet loses its kept request first (the
// response still replays), then a sealed response's blob whole: the record
// is SUCCEEDED, not stored, and opens with no headers instead of failing
// (a 410 on replay, never a 500 or a re-execution).
func TestSealedOverMaxAllowedPacket(t *testing.T) {
	t.Parallel()
	d := open(t, "")
	ctx := context.Background()
	var maxPacket int
	require.NoError(t, d.DB().QueryRow(`SELECT @@max_allowed_packet`).Scan(&maxPacket))
	if maxPacket > 64<<20 {
		t.Skipf("max_allowed_packet is %d bytes", maxPacket)
	}
	kr, err := seal.NewKeyring([]seal.Key{{ID: "A", Secret: make([]byte, 32)}})
	require.NoError(t, err)
	huge := bytes.Repeat([]byte("x"), maxPacket+1)
	for _, tc := range []struct {
		key           string
		body, request []byte
	}{{"big-request", []byte("ok"), huge}, {"big-body", huge, []byte("req")}} {
		res, err := d.Claim(ctx, params("acct", tc.key, "b"))
		require.NoError(t, err)
		resp := okResponse(tc.body)
		resp.Header["Location"] = []string{"/v1/payments/1"}
		resp.Request = seal.EncodeRequest(seal.Request{Size: int64(len(tc.request)), Body: tc.request})
		sealed, err := kr.SealResponse(seal.LifeOf(res.Record), resp)
		require.NoError(t, err)
		ok, err := d.Complete(ctx, idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: sealed})
		require.NoError(t, err, tc.key)
		require.True(t, ok)
		rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: tc.key})
		require.NoError(t, err)
		require.Equal(t, idemdriver.StateSucceeded, rec.State)
		require.Nil(t, rec.Response.Request, "%s: the request did not fit", tc.key)
		opened, err := kr.OpenResponse(seal.LifeOf(rec), *rec.Response)
		require.NoError(t, err, tc.key)
		if tc.key == "big-request" {
			require.True(t, opened.BodyStored)
			require.Equal(t, "ok", string(opened.Body))
			require.Equal(t, []string{"/v1/payments/1"}, opened.Header["Location"])
			require.Equal(t, sealed.SealTag, rec.Response.SealTag)
		} else {
			require.False(t, opened.BodyStored)
			require.EqualValues(t, len(huge), opened.BodySize)
			require.Empty(t, opened.Header)
			require.Equal(t, sealed.SealTagDropped, rec.Response.SealTag, "the tag of the response stored without its blob")
			// The dropped record's columns stay bound: neither its status
			// nor its body flag can be edited.
			for _, edit := range []func(r *idemdriver.Response){
				func(r *idemdriver.Response) { r.Status = 200 },
				func(r *idemdriver.Response) { r.BodyStored = true },
			} {
				r := *rec.Response
				edit(&r)
				_, err := kr.OpenResponse(seal.LifeOf(rec), r)
				require.ErrorIs(t, err, seal.ErrBroken)
			}
		}
	}
}
