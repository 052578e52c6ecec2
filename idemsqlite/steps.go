package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Stepper = (*Driver)(nil)

// stepColumns are the columns idemsql.ScanStep reads.
const stepColumns = `name, started_token, started_at, relay, done, result, finished_at, seal_key,
	at_most_once, reason, resolved_by, resolved_why, resolved_at`

const stepKey = ` scope = @scope AND key = @key AND created_at = @created AND name = @name`

// startStepSQL inserts the start marker, or marks a step without a result
// started again, when the life is owned under @token (one statement: SQLite
// writes one at a time, so no takeover commits in between). An at-most-once
// start is held (idemdriver.StepHeld): started again only once cleared
// (started_token 0). No row: fenced out, or the step has a result or is
// held (stepSQL tells).
var startStepSQL = `INSERT INTO idem_steps AS s (scope, key, created_at, name, started_token, started_at, relay, seal_key, at_most_once)
SELECT scope, key, created_at, @name, @token, ` + now + `, @relay, @sealkey, @atmostonce FROM idem_keys` + fenced + `
ON CONFLICT (scope, key, created_at, name) DO UPDATE
	SET started_token = excluded.started_token, started_at = excluded.started_at, at_most_once = excluded.at_most_once
	WHERE NOT s.done AND (NOT s.at_most_once OR s.started_token = 0)
RETURNING ` + stepColumns

var stepSQL = `SELECT ` + stepColumns + ` FROM idem_steps WHERE` + stepKey

// finishStepSQL records the result, first writer wins.
var finishStepSQL = `UPDATE idem_steps SET done = 1, result = @result, finished_at = ` + now + `, seal_key = @sealkey
WHERE` + stepKey + ` AND NOT done
RETURNING ` + stepColumns

var clearStepSQL = `DELETE FROM idem_steps WHERE` + stepKey + ` AND NOT done AND EXISTS (SELECT 1 FROM idem_keys` + fenced + `)`

var stepsSQL = `SELECT ` + stepColumns + ` FROM idem_steps
WHERE scope = @scope AND key = @key AND created_at = @created ORDER BY name`

// markUnknownKeySQL ends the life owned under @token UNKNOWN: no lease,
// expires_at far in the future (@farfuture), so no claim or purge takes it.
var markUnknownKeySQL = `UPDATE idem_keys SET state = 'UNKNOWN', locked_until = NULL, expires_at = @farfuture,
	updated_at = ` + now + fenced

// markUnknownStepSQL gives the step, when it exists, the reason.
var markUnknownStepSQL = `UPDATE idem_steps SET reason = @reason WHERE` + stepKey

// resolveKeySQL ends an UNKNOWN life, a compare-and-set on its token: FAILED
// (locked_until stays NULL), expiring after @retention, its attempts
// counted from 0 (a completer that gave up re-drives it).
var resolveKeySQL = `UPDATE idem_keys SET state = 'FAILED', attempts = 0, expires_at = ` + now + ` + @retention, updated_at = ` + now + `
WHERE scope = @scope AND key = @key AND created_at = @created AND fencing_token = @token AND state = 'UNKNOWN'`

// resolveStepSQL records the step's resolution: applied, @result is its
// result; not applied, its start is cleared (no result, started_token 0).
var resolveStepSQL = `UPDATE idem_steps SET done = @applied,
	result = CASE WHEN @applied THEN @result END,
	finished_at = CASE WHEN @applied THEN ` + now + ` END,
	seal_key = CASE WHEN @applied THEN @sealkey ELSE seal_key END,
	started_token = CASE WHEN @applied THEN started_token ELSE 0 END,
	resolved_by = @by, resolved_why = @why, resolved_at = ` + now + `
WHERE` + stepKey

func stepArgs(p idemdriver.StepParams, extra ...any) []any {
	return append([]any{sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("created", p.CreatedAt.UnixMicro()),
		sql.Named("name", p.Name), sql.Named("token", p.FencingToken), sql.Named("offset", p.ClockOffset.Microseconds())}, extra...)
}

// stepErr wraps idemdriver.ErrSchemaTooOld around SQLite's error for a
// table or column the schema does not have yet (migration 00006 or 00007
// not applied): SQLITE_ERROR, told apart only by its message ("no such
// table", "no such column", and an INSERT's "table ... has no column named").
func stepErr(err error) error {
	var se *sqlite.Error
	if errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_ERROR {
		msg := se.Error()
		if strings.Contains(msg, "no such table") || strings.Contains(msg, "no such column") || strings.Contains(msg, "has no column named") {
			return fmt.Errorf("idemsqlite: %w: %w", idemdriver.ErrSchemaTooOld, err)
		}
	}
	return err
}

// oneStep runs q and returns its one step; found is false with no row.
func (d *Driver) oneStep(ctx context.Context, q string, args []any) (s idemdriver.Step, found bool, err error) {
	err = retryBusy(ctx, func() error {
		s, err = idemsql.ScanStep(d.db.QueryRowContext(ctx, q, args...))
		return err
	})
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, stepErr(err)
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	s, ok, err := d.oneStep(ctx, startStepSQL, stepArgs(p.StepParams,
		sql.Named("relay", p.Relay), sql.Named("sealkey", p.SealKey), sql.Named("atmostonce", p.AtMostOnce)))
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, stepArgs(p.StepParams))
	if err == nil && (!ok || !(s.Done || idemdriver.StepHeld(s))) {
		err = idemdriver.ErrFencedOut
	}
	return s, err
}

// FinishStep implements idemdriver.Stepper.
func (d *Driver) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	s, ok, err := d.oneStep(ctx, finishStepSQL, stepArgs(p.StepParams, sql.Named("result", p.Result), sql.Named("sealkey", p.SealKey)))
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, stepArgs(p.StepParams))
	if err == nil && !ok {
		err = idemdriver.ErrNotFound
	}
	return s, err
}

// ClearStep implements idemdriver.Stepper.
func (d *Driver) ClearStep(ctx context.Context, p idemdriver.StepParams) (bool, error) {
	var n int64
	err := retryBusy(ctx, func() error {
		res, err := d.db.ExecContext(ctx, clearStepSQL, stepArgs(p)...)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	return n == 1, stepErr(err)
}

// Steps implements idemdriver.Stepper.
func (d *Driver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	rows, err := d.db.QueryContext(ctx, stepsSQL, stepArgs(p)...)
	if err != nil {
		return nil, stepErr(err)
	}
	return idemsql.ScanSteps(rows)
}

// MarkUnknown implements idemdriver.Stepper: the step's reason, then the
// record's fenced UPDATE, in one transaction (BEGIN IMMEDIATE), rolled back
// when the record's matches nothing.
func (d *Driver) MarkUnknown(ctx context.Context, p idemdriver.UnknownParams) error {
	args := stepArgs(p.StepParams, sql.Named("reason", p.Reason), sql.Named("farfuture", idemdriver.FarFuture.UnixMicro()))
	return stepErr(d.inTx(ctx, func(tx *sql.Tx) error {
		// The step first: on a schema without the column, that is the
		// error (ErrSchemaTooOld), not the record's CHECK.
		if _, err := idemsql.Exec(ctx, tx, markUnknownStepSQL, args...); err != nil {
			return err
		}
		switch n, err := idemsql.Exec(ctx, tx, markUnknownKeySQL, args...); {
		case err != nil:
			return err
		case n != 1:
			return idemdriver.ErrFencedOut // the step's reason is rolled back
		}
		return nil
	}))
}

// ResolveStep implements idemdriver.Stepper: the step's resolution, then
// the record's compare-and-set, in one transaction (BEGIN IMMEDIATE); either
// matching no row rolls both back (ErrNotFound).
func (d *Driver) ResolveStep(ctx context.Context, p idemdriver.ResolveStepParams) error {
	args := stepArgs(p.StepParams, sql.Named("retention", p.Retention.Microseconds()), sql.Named("applied", p.Applied),
		sql.Named("result", p.Result), sql.Named("sealkey", p.SealKey), sql.Named("by", p.By), sql.Named("why", p.Why))
	return stepErr(d.inTx(ctx, func(tx *sql.Tx) error {
		// The step first: on a schema without its columns, that is the
		// error (ErrSchemaTooOld), not a record that is not UNKNOWN.
		for _, q := range []string{resolveStepSQL, resolveKeySQL} {
			switch n, err := idemsql.Exec(ctx, tx, q, args...); {
			case err != nil:
				return err
			case n != 1:
				return idemdriver.ErrNotFound
			}
		}
		return nil
	}))
}

// inTx runs f in a transaction (BEGIN IMMEDIATE, through _txlock), which it
// commits when f returns nil and rolls back otherwise (a failed rollback
// leaves nothing committed either); the whole is retried on SQLITE_BUSY
// (retryBusy).
func (d *Driver) inTx(ctx context.Context, f func(*sql.Tx) error) error {
	return retryBusy(ctx, func() error { return idemsql.InTx(ctx, d.db, nil, f) })
}

var _ idemdriver.AbandonedLister = (*Driver)(nil)

// abandonedSQL reads the abandoned records past a started step (a result
// or a start; a start an operator cleared is none). One
// table of two SELECTs, which SQLite flattens into a compound, each arm
// through a partial index (an OR of the two would scan idem_keys): the
// PROCESSING records by lease up to now (idem_keys_processing), the FAILED
// ones (idem_keys_failed, 00008); each arm sorted by updated_at, merged
// up to @limit. Each record is looked up in idem_steps by its primary
// key's prefix (scope, key, created_at). GLOB, not LIKE: SQLite's LIKE
// ignores ASCII case, and 'idem:' (idemdriver.InternalStepPrefix) holds
// no GLOB wildcard.
var abandonedSQL = `SELECT ` + columns + `, ` + now + `
	FROM (SELECT * FROM idem_keys WHERE state = 'PROCESSING' AND locked_until <= ` + now + `
		UNION ALL SELECT * FROM idem_keys WHERE state = 'FAILED') AS k
	WHERE k.updated_at <= ` + now + ` - @grace
		AND EXISTS (SELECT 1 FROM idem_steps AS s WHERE s.scope = k.scope AND s.key = k.key AND s.created_at = k.created_at
			AND s.name NOT GLOB 'idem:*' AND (s.done OR s.started_token <> 0))
	ORDER BY k.updated_at LIMIT @limit`

// Abandoned implements idemdriver.AbandonedLister.
func (d *Driver) Abandoned(ctx context.Context, p idemdriver.AbandonedParams) ([]idemdriver.Record, time.Time, error) {
	if p.Limit <= 0 || p.Grace < 0 {
		return nil, time.Time{}, fmt.Errorf("idemsqlite: abandoned: Limit %d must be positive, Grace %s not negative", p.Limit, p.Grace)
	}
	rows, err := d.db.QueryContext(ctx, abandonedSQL, sql.Named("limit", p.Limit), sql.Named("grace", p.Grace.Microseconds()),
		sql.Named("offset", p.ClockOffset.Microseconds()))
	if err != nil {
		return nil, time.Time{}, stepErr(err)
	}
	recs, dbNow, err := idemsql.CollectRecords(rows, func(rows *sql.Rows, nowUS *int64) (idemdriver.Record, error) {
		return scanRecord(rows, nil, nowUS)
	})
	return recs, dbNow, stepErr(err)
}

var _ idemdriver.UnknownCounter = (*Driver)(nil)

// countUnknownSQL reads the far end of the expires_at index.
var countUnknownSQL = `SELECT COUNT(*), MIN(updated_at), ` + now + `
	FROM idem_keys WHERE expires_at >= @farfuture AND state = 'UNKNOWN'`

// CountUnknown implements idemdriver.UnknownCounter.
func (d *Driver) CountUnknown(ctx context.Context, offset time.Duration) (n int64, oldest, now time.Time, err error) {
	var min sql.NullInt64
	var nowUS int64
	err = d.db.QueryRowContext(ctx, countUnknownSQL, sql.Named("farfuture", idemdriver.FarFuture.UnixMicro()),
		sql.Named("offset", offset.Microseconds())).Scan(&n, &min, &nowUS)
	if min.Valid {
		oldest = idemsql.MicrosTime(min.Int64)
	}
	return n, oldest, idemsql.MicrosTime(nowUS), err
}
