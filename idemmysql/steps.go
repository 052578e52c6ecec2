package idemmysql

import (
	"context"
	"database/sql"
	"errors"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

var _ idemdriver.Stepper = (*Driver)(nil)

var stepColumns = "name, started_token, " + micros("started_at") + ", relay, done, result, " + micros("finished_at") + ", seal_key"

// stepKey names one step. Args: scope, key, created_at (µs), name.
const stepKey = " scope = ? AND `key` = ? AND created_at = " + at + " AND name = ?"

// startStepSQL inserts the start marker, or marks a step without a result
// started again, when the life is owned under the token; the SELECT's
// shared row lock keeps a takeover's UPDATE of the record from committing
// in between (on Galera the foreign key's reference to the record is
// certified against it). Args: name, token, offset, relay, seal key, then
// scope, key, token, created_at (µs). Rows affected: 1 inserted, 2 started
// again, 0 neither (fenced out, or the step has a result).
var startStepSQL = "INSERT INTO idem_steps (scope, `key`, created_at, name, started_token, started_at, relay, seal_key)\n" +
	"SELECT scope, `key`, created_at, ?, ?, " + now + ", ?, ? FROM idem_keys" + fenced + "\n" +
	"LOCK IN SHARE MODE\n" +
	"ON DUPLICATE KEY UPDATE started_token = IF(done, started_token, VALUES(started_token)),\n" +
	"	started_at = IF(done, started_at, VALUES(started_at))"

var stepSQL = "SELECT " + stepColumns + " FROM idem_steps WHERE" + stepKey

// finishStepSQL records the result, first writer wins. Args: result, offset,
// seal key, then stepKey's.
var finishStepSQL = "UPDATE idem_steps SET done = TRUE, result = ?, finished_at = " + now + ", seal_key = ?\nWHERE" + stepKey + " AND NOT done"

// clearStepSQL: args stepKey's, then scope, key, token, created_at (µs).
var clearStepSQL = "DELETE FROM idem_steps WHERE" + stepKey + " AND NOT done AND EXISTS (SELECT 1 FROM idem_keys" + fenced + ")"

var stepsSQL = "SELECT " + stepColumns + " FROM idem_steps WHERE scope = ? AND `key` = ? AND created_at = " + at + " ORDER BY name"

func stepKeyArgs(p idemdriver.StepParams) []any {
	return []any{p.Scope, p.Key, p.CreatedAt.UnixMicro(), p.Name}
}

func ownerArgs(p idemdriver.StepParams) []any {
	return []any{p.Scope, p.Key, p.FencingToken, p.CreatedAt.UnixMicro()}
}

// step reads one step; found is false when it does not exist.
func (d *Driver) step(ctx context.Context, p idemdriver.StepParams) (s idemdriver.Step, found bool, err error) {
	s, err = idemsql.ScanStep(d.db.QueryRowContext(ctx, stepSQL, stepKeyArgs(p)...))
	if errors.Is(err, sql.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, err
}

// exec runs q and returns its rows affected.
func (d *Driver) exec(ctx context.Context, q string, args ...any) (int64, error) {
	res, err := d.db.ExecContext(ctx, q, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	args := append([]any{p.Name, p.FencingToken, p.ClockOffset.Microseconds(), p.Relay, p.SealKey}, ownerArgs(p.StepParams)...)
	n, err := d.exec(ctx, startStepSQL, args...)
	if err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.step(ctx, p.StepParams)
	if err == nil && !s.Done && (!ok || n == 0) {
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
		return nil, err
	}
	return idemsql.ScanSteps(rows)
}
