package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Stepper = (*Driver)(nil)

// lifeParams name a record life (fenceParams name it and its owner).
var lifeParams = []string{"scope", "key", "created"}

const stepColumns = `s.name, s.started_token, s.started_at, s.relay, s.done, s.result, s.finished_at, s.seal_key,
	s.at_most_once, s.reason, s.resolved_by, s.resolved_why, s.resolved_at`

const stepKey = ` s.scope = @scope AND s.key = @key AND s.created_at = @created AND s.name = @name`

// startStepSQL inserts the start marker, or marks a step without a result
// started again, when the life is owned under @token; the SELECT's row lock
// (FOR SHARE) keeps a takeover's UPDATE of the record from committing in
// between. An at-most-once start is held: started again only once cleared
// (started_token 0). No row: fenced out, or the step has a result or is
// held (stepSQL tells).
var startStepSQL = bind(append(fenceParams, "name", "offset", "relay", "sealkey", "atmostonce"), `INSERT INTO idem_steps AS s
	(scope, key, created_at, name, started_token, started_at, relay, seal_key, at_most_once)
SELECT scope, key, created_at, @name, @token, `+now+`, @relay, @sealkey, @atmostonce FROM idem_keys`+fenced+`
FOR SHARE
ON CONFLICT (scope, key, created_at, name) DO UPDATE
	SET started_token = excluded.started_token, started_at = excluded.started_at, at_most_once = excluded.at_most_once
	WHERE NOT s.done AND (NOT s.at_most_once OR s.started_token = 0)
RETURNING `+stepColumns)

// stepSQL reads one step.
var stepSQL = bind(append(lifeParams, "name"), `SELECT `+stepColumns+` FROM idem_steps s WHERE`+stepKey)

// finishStepSQL records the result, first writer wins.
var finishStepSQL = bind(append(lifeParams, "name", "offset", "result", "sealkey"), `UPDATE idem_steps s
SET done = true, result = @result, finished_at = `+now+`, seal_key = @sealkey
WHERE`+stepKey+` AND NOT s.done
RETURNING `+stepColumns)

// clearStepSQL removes a start marker without a result while the life is
// owned under @token.
var clearStepSQL = bind(append(fenceParams, "name"), `DELETE FROM idem_steps s
WHERE`+stepKey+` AND NOT s.done AND EXISTS (SELECT 1 FROM idem_keys`+fenced+`)`)

// markUnknownSQL ends the life owned under @token UNKNOWN and gives its
// step the reason; it returns the record's row (none: fenced out).
var markUnknownSQL = bind(append(fenceParams, "name", "offset", "reason", "farfuture"), `WITH k AS (
	UPDATE idem_keys SET state = 'UNKNOWN', locked_until = NULL, expires_at = @farfuture, updated_at = `+now+fenced+`
	RETURNING scope, key, created_at
), s AS (
	UPDATE idem_steps s SET reason = @reason FROM k
	WHERE s.scope = k.scope AND s.key = k.key AND s.created_at = k.created_at AND s.name = @name
)
SELECT 1 FROM k`)

// resolveStepSQL ends an UNKNOWN life (compare-and-set on its token) with
// its step applied (@applied: the result recorded) or not (the start
// cleared); both statements of a transaction, the step first: each returns
// a row when it took effect. The record's attempts count from 0 again, so
// that a completer that gave up (MaxAttempts) re-drives it.
var (
	resolveKeySQL = bind(append(lifeParams, "token", "offset", "retention"), `UPDATE idem_keys
SET state = 'FAILED', attempts = 0, expires_at = `+now+` + @retention::bigint * interval '1 microsecond', updated_at = `+now+`
WHERE scope = @scope AND key = @key AND created_at = @created AND fencing_token = @token AND state = 'UNKNOWN'
RETURNING 1`)
	resolveStepSQL = bind(append(lifeParams, "name", "offset", "applied", "result", "sealkey", "by", "why"), `UPDATE idem_steps s
SET done = @applied, result = CASE WHEN @applied THEN @result::bytea END,
	finished_at = CASE WHEN @applied THEN `+now+` END,
	seal_key = CASE WHEN @applied THEN @sealkey ELSE s.seal_key END,
	started_token = CASE WHEN @applied THEN s.started_token ELSE 0 END,
	resolved_by = @by, resolved_why = @why, resolved_at = `+now+`
WHERE`+stepKey+`
RETURNING 1`)
)

// stepsSQL lists a life's steps.
var stepsSQL = bind(lifeParams, `SELECT `+stepColumns+` FROM idem_steps s
WHERE s.scope = @scope AND s.key = @key AND s.created_at = @created
ORDER BY s.name`)

// stepErr is unstorable(err), and wraps idemdriver.ErrSchemaTooOld for a
// table or column the schema does not have yet (SQLSTATE 42P01, 42703).
func stepErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P01" || pgErr.Code == "42703") {
		return fmt.Errorf("idempgx: %w: %w", idemdriver.ErrSchemaTooOld, err)
	}
	return unstorable(err)
}

func lifeArgs(p idemdriver.StepParams, extra ...any) []any {
	return append([]any{p.Scope, p.Key, p.CreatedAt}, extra...)
}

func stepsUsable(p idemdriver.StepParams) error {
	return textable("scope", p.Scope, "key", p.Key, "step name", p.Name)
}

func scanStep(row pgx.CollectableRow) (idemdriver.Step, error) {
	var s idemdriver.Step
	var finished, resolved *time.Time
	err := row.Scan(&s.Name, &s.StartedToken, &s.StartedAt, &s.Relay, &s.Done, &s.Result, &finished, &s.SealKey,
		&s.AtMostOnce, &s.Reason, &s.ResolvedBy, &s.ResolvedWhy, &resolved)
	if finished != nil {
		s.FinishedAt = *finished
	}
	if resolved != nil {
		s.ResolvedAt = *resolved
	}
	return s, err
}

// oneStep runs q and returns its one step; found is false with no row.
func (d *Driver) oneStep(ctx context.Context, q string, args []any) (s idemdriver.Step, found bool, err error) {
	err = again(func() error {
		rows, err := d.pool.Query(ctx, d.q(q), args...)
		if err != nil {
			return err
		}
		s, err = pgx.CollectExactlyOneRow(rows, scanStep)
		found = err == nil
		if errors.Is(err, pgx.ErrNoRows) {
			return nil
		}
		return err
	})
	return s, found, stepErr(err)
}

// again runs f, and runs it again (twice at most) after a serialization
// failure or a deadlock: on the partitioned table, a statement that waited
// on a record's row fails so (40001, "tuple to be locked was already moved
// to another partition") when a claim or MarkUnknown moved the row to
// another partition meanwhile; run again, it reads the row where it is now
// (see execFenced).
func again(f func() error) error {
	for try := 0; ; try++ {
		err := f()
		if err == nil || try == 2 || !retryable(err) {
			return err
		}
	}
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	if err := stepsUsable(p.StepParams); err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.oneStep(ctx, startStepSQL, []any{p.Scope, p.Key, p.FencingToken, p.CreatedAt, p.Name, p.ClockOffset.Microseconds(), p.Relay, p.SealKey, p.AtMostOnce})
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, lifeArgs(p.StepParams, p.Name))
	if err == nil && (!ok || !(s.Done || idemdriver.StepHeld(s))) {
		err = idemdriver.ErrFencedOut
	}
	return s, err
}

// FinishStep implements idemdriver.Stepper.
func (d *Driver) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	if err := stepsUsable(p.StepParams); err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.oneStep(ctx, finishStepSQL, lifeArgs(p.StepParams, p.Name, p.ClockOffset.Microseconds(), p.Result, p.SealKey))
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, lifeArgs(p.StepParams, p.Name))
	if err == nil && !ok {
		err = idemdriver.ErrNotFound
	}
	return s, err
}

// ClearStep implements idemdriver.Stepper.
func (d *Driver) ClearStep(ctx context.Context, p idemdriver.StepParams) (bool, error) {
	if err := stepsUsable(p); err != nil {
		return false, err
	}
	var cleared bool
	err := again(func() error {
		tag, err := d.pool.Exec(ctx, d.q(clearStepSQL), p.Scope, p.Key, p.FencingToken, p.CreatedAt, p.Name)
		cleared = tag.RowsAffected() == 1
		return err
	})
	return cleared, stepErr(err)
}

// Steps implements idemdriver.Stepper.
func (d *Driver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	if err := stepsUsable(p); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, d.q(stepsSQL), lifeArgs(p)...)
	if err != nil {
		return nil, stepErr(err)
	}
	return pgx.CollectRows(rows, scanStep)
}

// MarkUnknown implements idemdriver.Stepper.
func (d *Driver) MarkUnknown(ctx context.Context, p idemdriver.UnknownParams) error {
	if err := stepsUsable(p.StepParams); err != nil {
		return err
	}
	err := again(func() error {
		rows, err := d.pool.Query(ctx, d.q(markUnknownSQL), p.Scope, p.Key, p.FencingToken, p.CreatedAt, p.Name,
			p.ClockOffset.Microseconds(), p.Reason, idemdriver.FarFuture)
		if err != nil {
			return err
		}
		_, err = pgx.CollectExactlyOneRow(rows, pgx.RowTo[int32])
		return err
	})
	if errors.Is(err, pgx.ErrNoRows) {
		return idemdriver.ErrFencedOut
	}
	return stepErr(err)
}

// ResolveStep implements idemdriver.Stepper.
func (d *Driver) ResolveStep(ctx context.Context, p idemdriver.ResolveStepParams) error {
	if err := stepsUsable(p.StepParams); err != nil {
		return err
	}
	if err := textable("resolver", p.By, "reason given", p.Why); err != nil {
		return err
	}
	err := pgx.BeginFunc(ctx, d.pool, func(tx pgx.Tx) error {
		for _, st := range []struct {
			q    string
			args []any
		}{
			{resolveStepSQL, lifeArgs(p.StepParams, p.Name, p.ClockOffset.Microseconds(), p.Applied, p.Result, p.SealKey, p.By, p.Why)},
			{resolveKeySQL, lifeArgs(p.StepParams, p.FencingToken, p.ClockOffset.Microseconds(), p.Retention.Microseconds())},
		} {
			tag, err := tx.Exec(ctx, d.q(st.q), st.args...)
			if err != nil {
				return err
			}
			if tag.RowsAffected() != 1 {
				return idemdriver.ErrNotFound
			}
		}
		return nil
	})
	if errors.Is(err, idemdriver.ErrNotFound) {
		return err
	}
	return stepErr(d.partitionErr(err)) // p.Retention past the partitions ahead
}

var _ idemdriver.AbandonedLister = (*Driver)(nil)

// abandonedSQL reads the abandoned records past a started step (one with
// a result or a start: a start an operator cleared, resolving it not
// applied, is none), through the partial indexes of PROCESSING (by lease)
// and FAILED records.
var abandonedSQL = `SELECT ` + columns + `, ` + now + `
	FROM idem_keys k
	WHERE ((k.state = 'PROCESSING' AND k.locked_until <= ` + now + `) OR k.state = 'FAILED')
		AND k.updated_at <= ` + now + ` - @grace::bigint * interval '1 microsecond'
		AND EXISTS (SELECT 1 FROM idem_steps s WHERE s.scope = k.scope AND s.key = k.key AND s.created_at = k.created_at
			AND s.name NOT LIKE 'idem:%' AND (s.done OR s.started_token <> 0))
	ORDER BY k.updated_at LIMIT @limit`

// Abandoned implements idemdriver.AbandonedLister.
func (d *Driver) Abandoned(ctx context.Context, p idemdriver.AbandonedParams) ([]idemdriver.Record, time.Time, error) {
	if p.Limit <= 0 || p.Grace < 0 {
		return nil, time.Time{}, fmt.Errorf("idempgx: abandoned: Limit %d must be positive, Grace %s not negative", p.Limit, p.Grace)
	}
	rows, err := d.pool.Query(ctx, d.q(abandonedSQL), pgx.NamedArgs{"limit": p.Limit, "grace": p.Grace.Microseconds(),
		"offset": p.ClockOffset.Microseconds()})
	if err != nil {
		return nil, time.Time{}, stepErr(err)
	}
	var dbNow time.Time
	recs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (idemdriver.Record, error) {
		return scanRecord(row, nil, &dbNow)
	})
	return recs, dbNow.UTC(), stepErr(err)
}

var _ idemdriver.UnknownCounter = (*Driver)(nil)

// countUnknownSQL reads the far end of the expires_at index.
var countUnknownSQL = `SELECT count(*), min(updated_at), ` + now + `
	FROM idem_keys WHERE expires_at >= @farfuture AND state = 'UNKNOWN'`

// CountUnknown implements idemdriver.UnknownCounter.
func (d *Driver) CountUnknown(ctx context.Context, offset time.Duration) (n int64, oldest, dbNow time.Time, err error) {
	var min *time.Time
	err = d.pool.QueryRow(ctx, d.q(countUnknownSQL), pgx.NamedArgs{"farfuture": idemdriver.FarFuture,
		"offset": offset.Microseconds()}).Scan(&n, &min, &dbNow)
	if min != nil {
		oldest = min.UTC()
	}
	return n, oldest, dbNow.UTC(), err
}
