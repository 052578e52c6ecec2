package idemmysql

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Stepper = (*Driver)(nil)

// Column bounds of the idem_steps table that StartStep, MarkUnknown and
// ResolveStep check before they write, refusing a longer value with an error
// wrapping ErrTooLong (nothing written), as Claim does for idem_keys.
const (
	MaxStepReasonBytes   = 64  // reason, VARBINARY(64)
	MaxStepResolverBytes = 200 // resolved_by and resolved_why, VARBINARY(200) each
)

var stepColumns = "name, started_token, " + micros("started_at") + ", relay, done, result, " + micros("finished_at") + ", seal_key,\n" +
	"	at_most_once, reason, resolved_by, resolved_why, " + micros("resolved_at")

// stepKey names one step. Args: scope, key, created_at (µs), name.
const stepKey = " scope = ? AND `key` = ? AND created_at = " + at + " AND name = ?"

// startKept is true of a stored step that a start leaves as it is: done (a
// result is recorded), or held (idemdriver.StepHeld: an at-most-once start
// without a result, not cleared by ResolveStep), whatever the new start is.
const startKept = "(done OR (at_most_once AND started_token <> 0))"

// startStepSQL inserts the start marker, or marks a step that is not kept
// (startKept) started again, when the life is owned under the token; the
// SELECT's shared row lock keeps a takeover's UPDATE of the record from
// committing in between (on Galera the foreign key's reference to the
// record is certified against it). Args: name, token, offset, relay, seal
// key, at-most-once, then scope, key, token, created_at (µs). Rows affected:
// 1 inserted, 2 started again, 0 neither (fenced out, or the step is kept).
//
// The assignments give the same row whether the server evaluates them left
// to right, each seeing the columns assigned before it (MySQL, MariaDB by
// default), or all against the row as it was (MariaDB's sql_mode
// SIMULTANEOUS_ASSIGNMENT, which covers ON DUPLICATE KEY UPDATE too;
// TestStartStepAssignments). started_at and started_token come first and
// read only columns that nothing assigned before them. at_most_once comes
// last and may read their new values: a kept row still holds an earlier
// start's token or time, one started again holds this start's, so a held
// row is the one whose started_token or started_at differs from this
// start's.
var startStepSQL = "INSERT INTO idem_steps (scope, `key`, created_at, name, started_token, started_at, relay, seal_key, at_most_once)\n" +
	"SELECT scope, `key`, created_at, ?, ?, " + now + ", ?, ?, ? FROM idem_keys" + fenced + "\n" +
	"LOCK IN SHARE MODE\n" +
	"ON DUPLICATE KEY UPDATE started_at = IF(" + startKept + ", started_at, VALUES(started_at)),\n" +
	"	started_token = IF(" + startKept + ", started_token, VALUES(started_token)),\n" +
	"	at_most_once = IF(done OR (at_most_once AND started_token <> 0\n" +
	"		AND (started_token <> VALUES(started_token) OR started_at <> VALUES(started_at))), at_most_once, VALUES(at_most_once))"

var stepSQL = "SELECT " + stepColumns + " FROM idem_steps WHERE" + stepKey

// finishStepSQL records the result, first writer wins. Args: result, offset,
// seal key, then stepKey's.
var finishStepSQL = "UPDATE idem_steps SET done = TRUE, result = ?, finished_at = " + now + ", seal_key = ?\nWHERE" + stepKey + " AND NOT done"

// clearStepSQL: args stepKey's, then scope, key, token, created_at (µs).
var clearStepSQL = "DELETE FROM idem_steps WHERE" + stepKey + " AND NOT done AND EXISTS (SELECT 1 FROM idem_keys" + fenced + ")"

var stepsSQL = "SELECT " + stepColumns + " FROM idem_steps WHERE scope = ? AND `key` = ? AND created_at = " + at + " ORDER BY name"

// markUnknownKeySQL ends the owned life UNKNOWN (CONTRACT section 11.3):
// no lease, and an expires_at past any retention, so that no claim or
// purge takes it. Args: far future (µs), offset, then scope, key, token,
// created_at (µs).
var markUnknownKeySQL = "UPDATE idem_keys SET state = 'UNKNOWN', locked_until = NULL, expires_at = " + at + ", " + touch + fenced

// markUnknownStepSQL keeps the reason on the step, done or not. Args:
// reason, then stepKey's.
var markUnknownStepSQL = "UPDATE idem_steps SET reason = ? WHERE" + stepKey

// resolveKeySQL ends an UNKNOWN life FAILED, a compare-and-set on its
// token; it expires after the retention again, its attempts counted from 0
// (a completer that gave up re-drives it). Args: offset, retention
// (µs), offset, then scope, key, created_at (µs), token.
var resolveKeySQL = "UPDATE idem_keys SET state = 'FAILED', attempts = 0, expires_at = " + now + " + INTERVAL ? MICROSECOND, " + touch + "\n" +
	"WHERE scope = ? AND `key` = ? AND created_at = " + at + " AND fencing_token = ? AND state = 'UNKNOWN'"

// resolveAppliedSQL records the step's result, whatever it held. Args:
// result, seal key, offset, by, why, offset, then stepKey's.
var resolveAppliedSQL = "UPDATE idem_steps SET done = TRUE, result = ?, seal_key = ?, finished_at = " + now + ",\n" +
	"	resolved_by = ?, resolved_why = ?, resolved_at = " + now + "\nWHERE" + stepKey

// resolveNotAppliedSQL clears the step's start (and a result, if any): the
// next execution starts it again. Args: by, why, offset, then stepKey's.
var resolveNotAppliedSQL = "UPDATE idem_steps SET done = FALSE, result = NULL, finished_at = NULL, started_token = 0,\n" +
	"	resolved_by = ?, resolved_why = ?, resolved_at = " + now + "\nWHERE" + stepKey

// stepExistsSQL: args stepKey's.
var stepExistsSQL = "SELECT COUNT(*) FROM idem_steps WHERE" + stepKey

func stepKeyArgs(p idemdriver.StepParams) []any {
	return []any{p.Scope, p.Key, p.CreatedAt.UnixMicro(), p.Name}
}

func ownerArgs(p idemdriver.StepParams) []any {
	return []any{p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro()}
}

// stepErr wraps idemdriver.ErrSchemaTooOld around an error of a step
// statement that names a table or column the schema does not have yet
// (schemaTooOld): its migrations are not applied.
func stepErr(err error) error {
	if schemaTooOld(err) {
		return fmt.Errorf("idemmysql: %w: %w", idemdriver.ErrSchemaTooOld, err)
	}
	return err
}

// checkStepBounds refuses a value longer than its idem_steps column.
func checkStepBounds(fields ...boundedField) error {
	for _, f := range fields {
		if f.n > f.max {
			return fmt.Errorf("%w (%w): %s is %d bytes, the column holds %d", ErrTooLong, idemdriver.ErrUnstorable, f.name, f.n, f.max)
		}
	}
	return nil
}

type boundedField struct {
	name   string
	n, max int
}

// step reads one step; found is false when it does not exist.
func (d *Driver) step(ctx context.Context, p idemdriver.StepParams) (s idemdriver.Step, found bool, err error) {
	s, err = idemsql.ScanStep(d.db.QueryRowContext(ctx, stepSQL, stepKeyArgs(p)...))
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, stepErr(err)
}

// exec runs q and returns its rows affected.
func (d *Driver) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, stepErr(err)
	}
	return res.RowsAffected()
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	if err := checkStepBounds(boundedField{"step name", len(p.Name), idemdriver.MaxStepNameBytes},
		boundedField{"seal key", len(p.SealKey), idemdriver.MaxSealKeyBytes}); err != nil {
		return idemdriver.Step{}, err
	}
	args := append([]any{p.Name, p.FencingToken, p.ClockOffset.Microseconds(), p.Relay, p.SealKey, p.AtMostOnce}, ownerArgs(p.StepParams)...)
	n, err := d.exec(ctx, startStepSQL, args...)
	if err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.step(ctx, p.StepParams)
	switch {
	case err != nil:
	case !ok:
		err = idemdriver.ErrFencedOut
	case s.Done, idemdriver.StepHeld(s):
		// As stored, whoever owns the life: a result to use, or an
		// at-most-once start never started again.
	case n == 0:
		err = idemdriver.ErrFencedOut
	}
	return s, err
}

// FinishStep implements idemdriver.Stepper.
func (d *Driver) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	args := append([]any{p.Result, p.ClockOffset.Microseconds(), p.SealKey}, stepKeyArgs(p.StepParams)...)
	if _, err := d.exec(ctx, finishStepSQL, args...); err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.step(ctx, p.StepParams)
	if err == nil && !ok {
		err = idemdriver.ErrNotFound
	}
	return s, err
}

// ClearStep implements idemdriver.Stepper.
func (d *Driver) ClearStep(ctx context.Context, p idemdriver.StepParams) (bool, error) {
	n, err := d.exec(ctx, clearStepSQL, append(stepKeyArgs(p), ownerArgs(p)...)...)
	return n == 1, err
}

// Steps implements idemdriver.Stepper.
func (d *Driver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	rows, err := d.db.QueryContext(ctx, stepsSQL, p.Scope, p.Key, p.CreatedAt.UnixMicro())
	if err != nil {
		return nil, stepErr(err)
	}
	s, err := idemsql.ScanSteps(rows)
	return s, stepErr(err)
}

// MarkUnknown implements idemdriver.Stepper: in one READ COMMITTED
// transaction, the fenced UPDATE of the record, then the step's reason.
func (d *Driver) MarkUnknown(ctx context.Context, p idemdriver.UnknownParams) error {
	if err := checkStepBounds(boundedField{"reason", len(p.Reason), MaxStepReasonBytes}); err != nil {
		return err
	}
	off := p.ClockOffset.Microseconds()
	return d.stepTx(ctx, func(tx *sql.Tx) error {
		n, err := txExec(ctx, tx, markUnknownKeySQL, append([]any{idemdriver.FarFuture.UnixMicro(), off}, ownerArgs(p.StepParams)...)...)
		if checkViolated(err) {
			// The CHECK constraint idem_keys_state of a schema before
			// 00008_idem_keys_unknown.sql, which knows no UNKNOWN.
			return fmt.Errorf("idemmysql: %w: %w", idemdriver.ErrSchemaTooOld, err)
		}
		if err != nil {
			return err
		}
		if n != 1 {
			return idemdriver.ErrFencedOut
		}
		_, err = txExec(ctx, tx, markUnknownStepSQL, append([]any{p.Reason}, stepKeyArgs(p.StepParams)...)...)
		return err
	})
}

// ResolveStep implements idemdriver.Stepper: in one READ COMMITTED
// transaction, the compare-and-set on the UNKNOWN record, then the step.
func (d *Driver) ResolveStep(ctx context.Context, p idemdriver.ResolveStepParams) error {
	if err := checkStepBounds(boundedField{"resolved by", len(p.By), MaxStepResolverBytes},
		boundedField{"resolved why", len(p.Why), MaxStepResolverBytes},
		boundedField{"seal key", len(p.SealKey), idemdriver.MaxSealKeyBytes}); err != nil {
		return err
	}
	off := p.ClockOffset.Microseconds()
	return d.stepTx(ctx, func(tx *sql.Tx) error {
		n, err := txExec(ctx, tx, resolveKeySQL, off, p.Retention.Microseconds(), off,
			p.Scope, p.Key, p.CreatedAt.UnixMicro(), p.FencingToken)
		if err != nil {
			return err
		}
		if n != 1 {
			return idemdriver.ErrNotFound
		}
		q, args := resolveNotAppliedSQL, []any{p.By, p.Why, off}
		if p.Applied {
			result := p.Result
			if result == nil {
				result = []byte{} // done: a result, even an empty one, is not NULL
			}
			q, args = resolveAppliedSQL, []any{result, p.SealKey, off, p.By, p.Why, off}
		}
		if n, err = txExec(ctx, tx, q, append(args, stepKeyArgs(p.StepParams)...)...); err != nil || n == 1 {
			return err
		}
		// No row changed: none, or one already so (rows affected counts
		// changed rows unless the pool sets clientFoundRows).
		var found int
		if err := tx.QueryRowContext(ctx, stepExistsSQL, stepKeyArgs(p.StepParams)...).Scan(&found); err != nil {
			return stepErr(err)
		}
		if found == 0 {
			return idemdriver.ErrNotFound
		}
		return nil
	})
}

// txExec runs q in tx and returns the rows it changed.
func txExec(ctx context.Context, tx *sql.Tx, q string, args ...any) (int64, error) {
	n, err := idemsql.Exec(ctx, tx, q, args...)
	return n, stepErr(err)
}

// stepTx runs fn in a READ COMMITTED transaction and commits it when fn
// returns nil; otherwise it rolls back and returns fn's error. A
// transaction the server rolled back in a conflict (a deadlock, a Galera
// certification failure: 1213; 1020) runs again, as a fenced write does
// (execFenced): each statement of fn checks its row again.
func (d *Driver) stepTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	for try := 1; ; try++ {
		err := idemsql.InTx(ctx, d.db, d.beginOpts, fn)
		if k := classify(err); (k == kindDeadlock || k == kindChanged) && try < maxClaimTries && ctx.Err() == nil {
			if err := sleepJitter(ctx); err != nil {
				return err
			}
			continue
		}
		return err
	}
}

var _ idemdriver.AbandonedLister = (*Driver)(nil)

// abandonedSQL reads the abandoned records past a started step: two ranges
// of the index idem_keys_processing (state, locked_until), the PROCESSING
// records up to now (not the NULLs, the damaged records) and every FAILED
// one, each looked up in idem_steps by its primary key's prefix (scope,
// key, created_at). name is binary: LIKE compares it byte by byte, and
// 'idem:' (idemdriver.InternalStepPrefix) holds no wildcard. Args: offset,
// grace (µs), limit.
var abandonedSQL = `SELECT ` + micros(`n.now`) + `, ` + recordColumns + `
FROM ` + nowTable + `
JOIN idem_keys AS k ON ((k.state = 'PROCESSING' AND k.locked_until <= n.now) OR k.state = 'FAILED')
	AND k.updated_at <= n.now - INTERVAL ? MICROSECOND
	AND EXISTS (SELECT 1 FROM idem_steps AS s WHERE s.scope = k.scope AND s.` + "`key`" + ` = k.` + "`key`" + `
		AND s.created_at = k.created_at AND s.name NOT LIKE 'idem:%' AND (s.done OR s.started_token <> 0))
ORDER BY k.updated_at LIMIT ?`

// Abandoned implements idemdriver.AbandonedLister: one SELECT.
func (d *Driver) Abandoned(ctx context.Context, p idemdriver.AbandonedParams) ([]idemdriver.Record, time.Time, error) {
	if p.Limit <= 0 || p.Grace < 0 {
		return nil, time.Time{}, fmt.Errorf("idemmysql: abandoned: Limit %d must be positive, Grace %s not negative", p.Limit, p.Grace)
	}
	rows, err := d.db.QueryContext(ctx, abandonedSQL, p.ClockOffset.Microseconds(), p.Grace.Microseconds(), p.Limit)
	if err != nil {
		return nil, time.Time{}, stepErr(err)
	}
	recs, dbNow, err := idemsql.CollectRecords(rows, func(rows *sql.Rows, nowUS *int64) (idemdriver.Record, error) {
		s, err := scanSnapshot(rows)
		*nowUS = s.nowUS
		return s.rec, err
	})
	return recs, dbNow, stepErr(err)
}

var _ idemdriver.UnknownCounter = (*Driver)(nil)

// countUnknownSQL reads the far end of the expires_at index. Args: offset,
// the far future (µs).
var countUnknownSQL = "SELECT COUNT(*), " + micros("MIN(updated_at)") + ", " + micros(now) +
	" FROM idem_keys WHERE expires_at >= " + at + " AND state = 'UNKNOWN'"

// CountUnknown implements idemdriver.UnknownCounter.
func (d *Driver) CountUnknown(ctx context.Context, offset time.Duration) (n int64, oldest, now time.Time, err error) {
	var min sql.NullInt64
	var nowUS int64
	err = d.db.QueryRowContext(ctx, countUnknownSQL, offset.Microseconds(), idemdriver.FarFuture.UnixMicro()).Scan(&n, &min, &nowUS)
	if min.Valid {
		oldest = idemsql.MicrosTime(min.Int64)
	}
	return n, oldest, idemsql.MicrosTime(nowUS), err
}
