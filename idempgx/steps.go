package idempgx

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Stepper = (*Driver)(nil)

// errNoStepsPartitioned: the partitioned table's migrations have no
// idem_steps yet (its partitions are dropped whole, which a foreign key
// would refuse).
var errNoStepsPartitioned = fmt.Errorf("idempgx: %w: a partitioned table keeps no steps yet", idemdriver.ErrStepsUnsupported)

// lifeParams name a record life (fenceParams name it and its owner).
var lifeParams = []string{"scope", "key", "created"}

const stepColumns = `s.name, s.started_token, s.started_at, s.relay, s.done, s.result, s.finished_at, s.seal_key`

const stepKey = ` s.scope = @scope AND s.key = @key AND s.created_at = @created AND s.name = @name`

// startStepSQL inserts the start marker, or marks a step without a result
// started again, when the life is owned under @token; the SELECT's row lock
// (FOR SHARE) keeps a takeover's UPDATE of the record from committing in
// between. No row: fenced out, or the step has a result (stepSQL tells).
var startStepSQL = bind(append(fenceParams, "name", "offset", "relay", "sealkey"), `INSERT INTO idem_steps AS s
	(scope, key, created_at, name, started_token, started_at, relay, seal_key)
SELECT scope, key, created_at, @name, @token, `+now+`, @relay, @sealkey FROM idem_keys`+fenced+`
FOR SHARE
ON CONFLICT (scope, key, created_at, name) DO UPDATE
	SET started_token = excluded.started_token, started_at = excluded.started_at
	WHERE NOT s.done
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

// stepsSQL lists a life's steps.
var stepsSQL = bind(lifeParams, `SELECT `+stepColumns+` FROM idem_steps s
WHERE s.scope = @scope AND s.key = @key AND s.created_at = @created
ORDER BY s.name`)

func lifeArgs(p idemdriver.StepParams, extra ...any) []any {
	return append([]any{p.Scope, p.Key, p.CreatedAt}, extra...)
}

func (d *Driver) stepsUsable(p idemdriver.StepParams) error {
	if d.part != nil {
		return errNoStepsPartitioned
	}
	return textable("scope", p.Scope, "key", p.Key, "step name", p.Name)
}

func scanStep(row pgx.CollectableRow) (idemdriver.Step, error) {
	var s idemdriver.Step
	var finished *time.Time
	err := row.Scan(&s.Name, &s.StartedToken, &s.StartedAt, &s.Relay, &s.Done, &s.Result, &finished, &s.SealKey)
	if finished != nil {
		s.FinishedAt = *finished
	}
	return s, err
}

// oneStep runs q and returns its one step; found is false with no row.
func (d *Driver) oneStep(ctx context.Context, q string, args []any) (s idemdriver.Step, found bool, err error) {
	rows, err := d.pool.Query(ctx, d.q(q), args...)
	if err != nil {
		return s, false, unstorable(err)
	}
	s, err = pgx.CollectExactlyOneRow(rows, scanStep)
	if errors.Is(err, pgx.ErrNoRows) {
		return s, false, nil
	}
	return s, err == nil, unstorable(err)
}

// StartStep implements idemdriver.Stepper.
func (d *Driver) StartStep(ctx context.Context, p idemdriver.StartStepParams) (idemdriver.Step, error) {
	if err := d.stepsUsable(p.StepParams); err != nil {
		return idemdriver.Step{}, err
	}
	s, ok, err := d.oneStep(ctx, startStepSQL, []any{p.Scope, p.Key, p.FencingToken, p.CreatedAt, p.Name, p.ClockOffset.Microseconds(), p.Relay, p.SealKey})
	if err != nil || ok {
		return s, err
	}
	s, ok, err = d.oneStep(ctx, stepSQL, lifeArgs(p.StepParams, p.Name))
	if err == nil && (!ok || !s.Done) {
		err = idemdriver.ErrFencedOut
	}
	return s, err
}

// FinishStep implements idemdriver.Stepper.
func (d *Driver) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	if err := d.stepsUsable(p.StepParams); err != nil {
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
	if err := d.stepsUsable(p); err != nil {
		return false, err
	}
	tag, err := d.pool.Exec(ctx, d.q(clearStepSQL), p.Scope, p.Key, p.FencingToken, p.CreatedAt, p.Name)
	if err != nil {
		return false, unstorable(err)
	}
	return tag.RowsAffected() == 1, nil
}

// Steps implements idemdriver.Stepper.
func (d *Driver) Steps(ctx context.Context, p idemdriver.StepParams) ([]idemdriver.Step, error) {
	if err := d.stepsUsable(p); err != nil {
		return nil, err
	}
	rows, err := d.pool.Query(ctx, d.q(stepsSQL), lifeArgs(p)...)
	if err != nil {
		return nil, unstorable(err)
	}
	return pgx.CollectRows(rows, scanStep)
}
