package idemsql

import (
	"database/sql"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// ScanStep scans one idemdriver.Step from a row of the columns name,
// started_token, started_at (microseconds since the epoch), relay, done,
// result, finished_at (microseconds, or NULL), seal_key, at_most_once,
// reason, resolved_by, resolved_why and resolved_at (microseconds, or NULL),
// as idemmysql and idemsqlite read idem_steps (StepColumns).
func ScanStep(r interface{ Scan(dest ...any) error }) (idemdriver.Step, error) {
	var s idemdriver.Step
	var started int64
	var finished, resolved sql.NullInt64
	err := r.Scan(&s.Name, &s.StartedToken, &started, &s.Relay, &s.Done, &s.Result, &finished, &s.SealKey,
		&s.AtMostOnce, &s.Reason, &s.ResolvedBy, &s.ResolvedWhy, &resolved)
	s.StartedAt = time.UnixMicro(started).UTC()
	if finished.Valid {
		s.FinishedAt = time.UnixMicro(finished.Int64).UTC()
	}
	if resolved.Valid {
		s.ResolvedAt = time.UnixMicro(resolved.Int64).UTC()
	}
	return s, err
}

// ScanSteps is ScanStep for every row of rows, which it closes.
func ScanSteps(rows *sql.Rows) ([]idemdriver.Step, error) {
	return CollectRows(rows, func(rows *sql.Rows) (idemdriver.Step, error) { return ScanStep(rows) })
}
