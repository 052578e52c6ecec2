package dbtest

import (
	"bytes"
	"context"
	"database/sql"
	"database/sql/driver"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
)

// SQLBusiness is the conformance suite's business table (idemdrivertest.Business)
// for the database/sql drivers (idemmysql, idemsqlite): it writes rows of
// business_rows (id) in the claim's *sql.Tx and counts them on DB. The suite
// creates the table.
type SQLBusiness struct{ DB *sql.DB }

// Insert writes the row id in tx, a *sql.Tx.
func (b SQLBusiness) Insert(ctx context.Context, tx any, id string) error {
	_, err := tx.(*sql.Tx).ExecContext(ctx, `INSERT INTO business_rows (id) VALUES (?)`, id)
	return err
}

// Count returns how many committed rows have id.
func (b SQLBusiness) Count(ctx context.Context, id string) (n int, err error) {
	err = b.DB.QueryRowContext(ctx, `SELECT count(*) FROM business_rows WHERE id = ?`, id).Scan(&n)
	return n, err
}

// CountingTx wraps a database/sql/driver transaction and adds one to N for
// each Commit and Rollback: a round trip, for the statement budgets
// (CONTRACT section 10).
type CountingTx struct {
	Inner driver.Tx
	N     *atomic.Int64
}

// Commit counts one round trip and commits Inner.
func (t CountingTx) Commit() error { t.N.Add(1); return t.Inner.Commit() }

// Rollback counts one round trip and rolls Inner back.
func (t CountingTx) Rollback() error { t.N.Add(1); return t.Inner.Rollback() }

// CountingStmt wraps a database/sql/driver statement, which must implement
// driver.StmtExecContext and driver.StmtQueryContext, and adds one to N for
// each execution: a round trip, for the statement budgets.
type CountingStmt struct {
	Inner driver.Stmt
	N     *atomic.Int64
}

type contextStmt interface {
	driver.StmtExecContext
	driver.StmtQueryContext
}

// Close closes Inner.
func (s *CountingStmt) Close() error { return s.Inner.Close() }

// NumInput returns Inner's.
func (s *CountingStmt) NumInput() int { return s.Inner.NumInput() }

// CheckNamedValue is Inner's when it has one, else driver.ErrSkip (the
// connection's or database/sql's conversion applies).
func (s *CountingStmt) CheckNamedValue(nv *driver.NamedValue) error {
	if c, ok := s.Inner.(driver.NamedValueChecker); ok {
		return c.CheckNamedValue(nv)
	}
	return driver.ErrSkip
}

// Exec counts one round trip and executes Inner.
func (s *CountingStmt) Exec(a []driver.Value) (driver.Result, error) {
	s.N.Add(1)
	//lint:ignore SA1019 driver.Stmt requires Exec; database/sql calls ExecContext when present
	return s.Inner.Exec(a)
}

// Query counts one round trip and queries Inner.
func (s *CountingStmt) Query(a []driver.Value) (driver.Rows, error) {
	s.N.Add(1)
	//lint:ignore SA1019 driver.Stmt requires Query; database/sql calls QueryContext when present
	return s.Inner.Query(a)
}

// ExecContext counts one round trip and executes Inner.
func (s *CountingStmt) ExecContext(ctx context.Context, a []driver.NamedValue) (driver.Result, error) {
	s.N.Add(1)
	return s.Inner.(contextStmt).ExecContext(ctx, a)
}

// QueryContext counts one round trip and queries Inner.
func (s *CountingStmt) QueryContext(ctx context.Context, a []driver.NamedValue) (driver.Rows, error) {
	s.N.Add(1)
	return s.Inner.(contextStmt).QueryContext(ctx, a)
}

// DumpSQL reads every column of every row of table on db as the database
// returns it: the raw bytes of text and binary columns, numbers and times in
// their text form. For Harness.Dump (idemdrivertest).
func DumpSQL(t testing.TB, db *sql.DB, table string) [][]byte {
	t.Helper()
	rows, err := db.QueryContext(context.Background(), `SELECT * FROM `+table)
	must(t, table, err)
	defer func() { _ = rows.Close() }()
	cols, err := rows.Columns()
	must(t, table, err)
	var out [][]byte
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		must(t, table, rows.Scan(dest...))
		for _, v := range vals {
			out = append(out, bytes.Clone(v))
		}
	}
	must(t, table, rows.Err())
	return out
}

func must(t testing.TB, table string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("dbtest: dump %s: %v", table, err)
	}
}

// TamperSQL sets columns of the idem_keys row (scope, key) on db, as
// someone who can write the table would: set maps column names to values
// (nil for NULL). Column names are quoted with backticks and values bound
// with ?, which MySQL/MariaDB and SQLite both read. For Harness.Tamper
// (idemdrivertest); it fails t unless exactly one row changed.
func TamperSQL(t testing.TB, db *sql.DB, scope, key string, set map[string]any) {
	t.Helper()
	cols := make([]string, 0, len(set))
	for c := range set {
		cols = append(cols, c)
	}
	slices.Sort(cols)
	assign := make([]string, len(cols))
	args := make([]any, 0, len(cols)+2)
	for i, c := range cols {
		assign[i] = "`" + c + "` = ?"
		args = append(args, set[c])
	}
	res, err := db.ExecContext(context.Background(), "UPDATE idem_keys SET "+strings.Join(assign, ", ")+
		" WHERE scope = ? AND `key` = ?", append(args, scope, key)...)
	if err != nil {
		t.Fatalf("dbtest: tamper with %s/%s: %v", scope, key, err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		t.Fatalf("dbtest: tamper with %s/%s: %d rows changed (%v)", scope, key, n, err)
	}
}
