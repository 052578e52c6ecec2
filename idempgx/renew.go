package idempgx

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Renewer = (*Driver)(nil)

// renewSQL renews many leases in one statement (Renew): one element of
// each array per lease, each row fenced as heartbeatSQL's (scope, key,
// fencing token, created_at, PROCESSING) and found through the primary key
// (TestFencedWritesUsePrimaryKey). It returns the ordinal (from 1) of each
// lease it extended. The arrays are parameters, so the text is one
// statement whatever the number of leases, prepared once per connection.
var renewSQL = bind(append(fenceArrays, "offset", "lease"),
	`UPDATE idem_keys AS k SET locked_until = `+clock+` + @lease::bigint * interval '1 microsecond',
	updated_at = `+now+`
	FROM unnest(@scopes::text[], @keys::text[], @tokens::bigint[], @created::timestamptz[])
		WITH ORDINALITY AS f(scope, key, token, created, i)
	WHERE k.scope = f.scope AND k.key = f.key AND k.fencing_token = f.token AND k.created_at = f.created
		AND (k.state || '') = 'PROCESSING'
	RETURNING f.i`)

// fenceArrays are renewSQL's first parameters: fenceParams's, one array each.
var fenceArrays = []string{"scopes", "keys", "tokens", "created"}

// renewBatch is the most leases one renewSQL carries: a longer list is
// sent as several statements, so that none holds its row locks for long.
const renewBatch = 1000

// Renew implements idemdriver.Renewer with renewSQL, on a connection of
// the driver's own outside the pool (renewConn), so that renewals never
// wait behind a burst of claims and business transactions for a pooled
// connection. It is opened from the pool's configuration (AfterConnect
// included) by the first renewal that needs it, and closed once no renewal
// came for a LeaseDuration; while it cannot be opened (the server's
// max_connections), renewals run on the pool. The statement takes no session state, so
// it works behind a transaction pooler too. A lease whose scope or key
// PostgreSQL text cannot hold was never claimed here: it is reported lost.
func (d *Driver) Renew(ctx context.Context, p idemdriver.RenewParams) ([]bool, error) {
	renewed := make([]bool, len(p.Leases))
	var scopes, keys []string
	var tokens []int64
	var created []time.Time
	var at []int // the index in p.Leases of each element sent
	for i, l := range p.Leases {
		if fenceTextable(l) != nil {
			continue
		}
		scopes, keys = append(scopes, l.Scope), append(keys, l.Key)
		tokens, created = append(tokens, l.FencingToken), append(created, l.CreatedAt)
		at = append(at, i)
	}
	if len(at) == 0 {
		return renewed, nil
	}
	idle := max(p.LeaseDuration, time.Second)
	for lo := 0; lo < len(at); lo += renewBatch {
		hi := min(lo+renewBatch, len(at))
		args := []any{scopes[lo:hi], keys[lo:hi], tokens[lo:hi], created[lo:hi], p.ClockOffset.Microseconds(), p.LeaseDuration.Microseconds()}
		got, err := d.renewal.run(ctx, d, idle, func(q querier) ([]int64, error) { return renewOnce(ctx, q, d.q(renewSQL), args) })
		if err != nil {
			return nil, err
		}
		for _, i := range got {
			if i >= 1 && int(i) <= hi-lo {
				renewed[at[lo+int(i)-1]] = true
			}
		}
	}
	return renewed, nil
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// renewOnce runs renewSQL on q, again after a serialization failure or a
// deadlock (on a partitioned table, a row a re-claim moved to another
// partition: see execFenced), and returns the ordinals it renewed.
func renewOnce(ctx context.Context, q querier, query string, args []any) ([]int64, error) {
	for try := 0; ; try++ {
		rows, err := q.Query(ctx, query, args...)
		if err == nil {
			var got []int64
			got, err = pgx.CollectRows(rows, pgx.RowTo[int64])
			if err == nil {
				return got, nil
			}
		}
		if try < 2 && retryable(err) {
			continue
		}
		return nil, unstorable(err)
	}
}

// renewConn is the connection Renew runs on, outside the pool: opened by
// the first renewal that finds none (which waits for it as long as its
// context lets it), closed after a renewal-free while (idle), and again
// after an error that may have broken it. A renewal runs on the pool only
// when the connection cannot be opened.
type renewConn struct {
	use sync.Mutex // held while a renewal runs on conn: one at a time, whatever the engine

	mu    sync.Mutex // guards the fields below
	conn  *pgx.Conn
	ready chan struct{} // closed when the opening in progress ends; nil when none is
	idle  time.Duration // the latest renewal's
	timer *time.Timer   // closes conn once idle
}

// connectTimeout bounds the opening of the renewal connection.
const connectTimeout = 10 * time.Second

// run calls f on the renewal connection, or on d's pool when it cannot be
// opened.
func (r *renewConn) run(ctx context.Context, d *Driver, idle time.Duration, f func(querier) ([]int64, error)) ([]int64, error) {
	conn, err := r.get(ctx, d, idle)
	switch {
	case err != nil:
		return nil, err
	case conn == nil:
		return f(d.pool)
	}
	r.use.Lock()
	defer r.use.Unlock()
	got, err := f(conn)
	var pgErr *pgconn.PgError
	if err != nil && !errors.As(err, &pgErr) {
		// Not the server's answer: the connection may be broken or in the
		// middle of the statement (a context that ended). Open another.
		r.drop(conn)
	}
	return got, err
}

// get returns the open connection, opening one when there is none and
// waiting for it until ctx ends; nil when it could not be opened.
func (r *renewConn) get(ctx context.Context, d *Driver, idle time.Duration) (*pgx.Conn, error) {
	r.mu.Lock()
	r.idle = idle
	r.idleAgain()
	if r.conn != nil {
		defer r.mu.Unlock()
		return r.conn, nil
	}
	if r.ready == nil {
		r.ready = make(chan struct{})
		go r.connect(d, r.ready)
	}
	ready := r.ready
	r.mu.Unlock()
	select {
	case <-ready:
	case <-ctx.Done():
		return nil, ctx.Err() // it goes on opening, for the next renewal
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conn, nil
}

// connect opens the renewal connection, then closes ready.
func (r *renewConn) connect(d *Driver, ready chan struct{}) {
	ctx, cancel := context.WithTimeout(context.Background(), connectTimeout)
	defer cancel()
	conn, err := d.connectOwn(ctx)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err == nil {
		r.conn = conn
		r.idleAgain()
	}
	r.ready = nil
	close(ready)
}

// idleAgain closes the connection once no renewal came for r.idle (r.mu held).
func (r *renewConn) idleAgain() {
	if r.timer != nil {
		r.timer.Stop()
	}
	r.timer = time.AfterFunc(r.idle, r.closeIdle)
}

func (r *renewConn) closeIdle() {
	r.mu.Lock()
	conn := r.conn
	r.conn = nil
	r.mu.Unlock()
	if conn != nil {
		r.use.Lock()
		defer r.use.Unlock()
		closeConn(conn)
	}
}

// drop closes conn, which r.use holds, and forgets it.
func (r *renewConn) drop(conn *pgx.Conn) {
	r.mu.Lock()
	if r.conn == conn {
		r.conn = nil
	}
	r.mu.Unlock()
	closeConn(conn)
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx) // a connection that fails to close is gone either way
}

// connectOwn opens a connection with the pool's configuration, outside it,
// and runs the pool's AfterConnect on it (which may set search_path).
func (d *Driver) connectOwn(ctx context.Context) (*pgx.Conn, error) {
	cfg := d.pool.Config()
	conn, err := pgx.ConnectConfig(ctx, cfg.ConnConfig.Copy())
	if err != nil {
		return nil, err
	}
	if cfg.AfterConnect != nil {
		if err := cfg.AfterConnect(ctx, conn); err != nil {
			return nil, errors.Join(err, conn.Close(ctx))
		}
	}
	return conn, nil
}
