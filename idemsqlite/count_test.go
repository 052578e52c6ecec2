package idemsqlite_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"sync/atomic"

	"modernc.org/sqlite"

	"github.com/idemgo/idem/internal/dbtest"
)

// countingConnector opens modernc.org/sqlite connections that count every
// statement they execute (BEGIN, COMMIT and ROLLBACK included), for the
// statement budget of CONTRACT section 10.
type countingConnector struct {
	dsn string
	n   *atomic.Int64
}

func (c countingConnector) Connect(context.Context) (driver.Conn, error) {
	conn, err := (&sqlite.Driver{}).Open(c.dsn)
	if err != nil {
		return nil, err
	}
	return &countingConn{inner: conn, n: c.n}, nil
}

func (c countingConnector) Driver() driver.Driver { return &sqlite.Driver{} }

// The interfaces modernc.org/sqlite's connection implements and idem uses.
type sqliteConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
}

type countingConn struct {
	inner driver.Conn
	n     *atomic.Int64
}

func (c *countingConn) conn() sqliteConn { return c.inner.(sqliteConn) }
func (c *countingConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}
func (c *countingConn) Close() error { return c.inner.Close() }
func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}
func (c *countingConn) ResetSession(ctx context.Context) error {
	return c.inner.(driver.SessionResetter).ResetSession(ctx)
}
func (c *countingConn) IsValid() bool { return c.inner.(driver.Validator).IsValid() }
func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	s, err := c.conn().PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &dbtest.CountingStmt{Inner: s, N: c.n}, nil
}
func (c *countingConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	tx, err := c.conn().BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return dbtest.CountingTx{Inner: tx, N: c.n}, nil
}
func (c *countingConn) ExecContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Result, error) {
	c.n.Add(1)
	return c.conn().ExecContext(ctx, q, a)
}
func (c *countingConn) QueryContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Rows, error) {
	c.n.Add(1)
	return c.conn().QueryContext(ctx, q, a)
}

func openCounting(dsn string) (*sql.DB, *atomic.Int64) {
	n := &atomic.Int64{}
	return sql.OpenDB(countingConnector{dsn: dsn, n: n}), n
}
