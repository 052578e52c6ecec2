package idemsqlite

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Stepper = (*Driver)(nil)

const stepColumns = `name, started_token, started_at, relay, done, result, finished_at, seal_key`

const stepKey = ` scope = @scope AND key = @key AND created_at = @created AND name = @name`

// startStepSQL inserts the start marker, or marks a step without a result
// started again, when the life is owned under @token (one statement: SQLite
// writes one at a time, so no takeover commits in between). No row: fenced
// out, or the step has a result (stepSQL tells).
var startStepSQL = `INSERT INTO idem_steps AS s (scope, key, created_at, name, started_token, started_at, relay, seal_key)
SELECT scope, key, created_at, @name, @token, ` + now + `, @relay, @sealkey FROM idem_keys` + fenced + `
ON CONFLICT (scope, key, created_at, name) DO UPDATE
	SET started_token = excluded.started_token, started_at = excluded.started_at
	WHERE NOT s.done
RETURNING ` + stepColumns

var stepSQL = `SELECT ` + stepColumns + ` FROM idem_steps WHERE` + stepKey

// finishStepSQL records the result, first writer wins.
var finishStepSQL = `UPDATE idem_steps SET done = 1, result = @result, finished_at = ` + now + `, seal_key = @sealkey
WHERE` + stepKey + ` AND NOT done
RETURNING ` + stepColumns

var clearStepSQL = `DELETE FROM idem_steps WHERE` + stepKey + ` AND NOT done AND EXISTS (SELECT 1 FROM idem_keys` + fenced + `)`

var stepsSQL = `SELECT ` + stepColumns + ` FROM idem_steps
WHERE scope = @scope AND key = @key AND created_at = @created ORDER BY name`

func stepArgs(p idemdriver.StepParams, extra ...any) []any {
	return append([]any{sql.Named("scope", p.Scope), sql.Named("key", p.Key), sql.Named("created", p.CreatedAt.UnixMicro()),
		sql.Named("name", p.Name), sql.Named("token", p.FencingToken), sql.Named("offset", p.ClockOffset.Microseconds())}, extra...)
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
	return s, err == nil, err
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	s, ok, err := d.oneStep(ctx, startStepSQL, stepArgs(p.StepParams, sql.Named("relay", p.Relay), sql.Named("sealkey", p.SealKey)))
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, stepArgs(p.StepParams))
	if err == nil && (!ok || !s.Done) {
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
	return n == 1, err
}

// Steps implements idemdriver.Stepper.
func (d *Driver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	rows, err := d.db.QueryContext(ctx, stepsSQL, stepArgs(p)...)
	if err != nil {
		return nil, err
	}
	return idemsql.ScanSteps(rows)
}
