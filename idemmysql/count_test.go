package idemmysql_test

import (
	"context"
	"database/sql/driver"
	"sync/atomic"

	"github.com/idemgo/idem/internal/dbtest"
)

// countingConnector wraps go-sql-driver's connector and counts the SQL
// statements its connections send, for the statement budget of CONTRACT
// section 10: every executed query or prepared statement, START TRANSACTION,
// the SET TRANSACTION that go-sql-driver sends before it when a transaction
// asks for an isolation level, COMMIT and ROLLBACK. Preparing a statement
// (COM_STMT_PREPARE, once per connection) and pings are not counted.
type countingConnector struct {
	inner driver.Connector
	n     *atomic.Int64
}

func (c countingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return &countingConn{inner: conn.(mysqlConn), n: c.n}, nil
}

func (c countingConnector) Driver() driver.Driver { return c.inner.Driver() }

// The interfaces go-sql-driver's connection implements.
type mysqlConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.ConnPrepareContext
	driver.ExecerContext
	driver.QueryerContext
	driver.Pinger
	driver.SessionResetter
	driver.Validator
	driver.NamedValueChecker
}

type countingConn struct {
	inner mysqlConn
	n     *atomic.Int64
}

func (c *countingConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}
func (c *countingConn) Close() error                           { return c.inner.Close() }
func (c *countingConn) Ping(ctx context.Context) error         { return c.inner.Ping(ctx) }
func (c *countingConn) ResetSession(ctx context.Context) error { return c.inner.ResetSession(ctx) }
func (c *countingConn) IsValid() bool                          { return c.inner.IsValid() }
func (c *countingConn) CheckNamedValue(nv *driver.NamedValue) error {
	return c.inner.CheckNamedValue(nv)
}
func (c *countingConn) Begin() (driver.Tx, error) {
	return c.BeginTx(context.Background(), driver.TxOptions{})
}
func (c *countingConn) BeginTx(ctx context.Context, o driver.TxOptions) (driver.Tx, error) {
	c.n.Add(1)
	if o.Isolation != 0 {
		c.n.Add(1) // SET TRANSACTION ISOLATION LEVEL ...
	}
	tx, err := c.inner.BeginTx(ctx, o)
	if err != nil {
		return nil, err
	}
	return dbtest.CountingTx{Inner: tx, N: c.n}, nil
}
func (c *countingConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	s, err := c.inner.PrepareContext(ctx, q)
	if err != nil {
		return nil, err
	}
	return &dbtest.CountingStmt{Inner: s, N: c.n}, nil
}

// ExecContext and QueryContext with arguments answer driver.ErrSkip (unless
// interpolateParams is set): database/sql then prepares the statement and
// executes it, which countingStmt counts.
func (c *countingConn) ExecContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Result, error) {
	res, err := c.inner.ExecContext(ctx, q, a)
	if err != driver.ErrSkip {
		c.n.Add(1)
	}
	return res, err
}
func (c *countingConn) QueryContext(ctx context.Context, q string, a []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.inner.QueryContext(ctx, q, a)
	if err != driver.ErrSkip {
		c.n.Add(1)
	}
	return rows, err
}

// counting returns a wrap function for idemmysql.OpenWrapped and the
// counter it feeds.
func counting() (func(driver.Connector) driver.Connector, *atomic.Int64) {
	n := &atomic.Int64{}
	return func(c driver.Connector) driver.Connector { return countingConnector{inner: c, n: n} }, n
}
