package protocol

import (
	"context"
	"errors"
	"runtime/debug"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// Info describes the claim a job runs under (idem.Execution).
type Info struct {
	Scope        string
	Key          string // the client's key
	FencingToken int64
	Attempt      int
	Created      time.Time
}

type ctxKey struct{}

// FromContext returns ctx's execution, or false outside one.
func FromContext(ctx context.Context) (*Execution, bool) {
	e, ok := ctx.Value(ctxKey{}).(*Execution)
	return e, ok
}

// Info describes e's claim.
func (e *Execution) Info() Info { return e.info }

// RelaySecret is the secret e's relayed keys are derived with.
func (e *Execution) RelaySecret() []byte { return e.cfg.RelaySecret }

// Tx returns the claim's transaction, begun on first use on e's context.
// Errors: ErrExecutionEnded, a *StoreError.
func (e *Execution) Tx() (idemdriver.Tx, error) { return e.businessTx() }

// Release asks that e not be recorded: its record is removed, its writes
// rolled back. Errors: ErrExecutionEnded, ErrStepStarted (a step of the
// record life started: a new life would relay a new key, and the callee
// would apply the effect twice), a *StoreError (the steps could not be
// read; nothing is released).
func (e *Execution) Release() error {
	started, err := e.stepsStarted()
	if err != nil {
		return &StoreError{Op: "steps", Err: err}
	}
	if started {
		return ErrStepStarted
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return ErrExecutionEnded
	}
	e.releaseAsked = true
	return nil
}

// Job is the work an execution runs: a handler behind the middleware, or
// Do's fn.
type Job interface {
	// Run runs the work on ctx; status is its answer's, o what overrides
	// the outcome policy.
	Run(ctx context.Context) (status int, o Override)
	// Response is the answer to record.
	Response() idemdriver.Response
	// Kept is the request kept for an audit, its body cut at limit bytes.
	Kept(limit int64) seal.Request
	// Redrive is the request kept for a re-drive, and whether one is kept
	// (docs/contract.md section 11.4).
	Redrive() (seal.Request, bool)
}

type claimed struct {
	res  idemdriver.ClaimResult
	tx   idemdriver.Tx
	sent time.Time // when the claim was sent: the first lease runs from no earlier
	// one-commit mode: the turn the claim leads, the end of tx's context,
	// and the end of the request's wait (a lost COMMIT waits until then)
	turn    *leaderTurn
	endTx   context.CancelFunc
	waitEnd time.Time
	// waited reports that the request waited for another execution of its
	// key to be answered (its wait, Config.Wait or Prefer: wait).
	waited bool
}

// Execution is the claim a job runs under, reached from its context
// (FromContext): its fence, its transaction, its lease and its end.
type Execution struct {
	cfg    *Config
	c      claimed
	p      idemdriver.ClaimParams
	info   Info
	fence  idemdriver.FenceParams
	ctx    context.Context
	cancel context.CancelCauseFunc
	parent context.Context // the caller's, for logs
	// detachedParent is parent without its cancellation: the root of every statement's context.
	detachedParent context.Context
	hb             heartbeat
	committed      *idemdriver.Response // the outcome, once committed

	mu           sync.Mutex
	tx           idemdriver.Tx
	ended        bool
	releaseAsked bool
	steps        map[string]bool // the names of the steps run (Step)
	unknown      error           // an *UnknownError once this execution made its record UNKNOWN
	held         bool            // an at-most-once step is held unreconciled: the outcome is FAILED
	// redrive is the job's request kept for a re-drive (Job.Redrive),
	// written before the first step; kept once it is.
	redrive func() (seal.Request, bool)
	kept    bool
}

// newExecution: p names the stored key, clientKey the client's (Execution.Key).
func newExecution(cfg *Config, parent context.Context, c claimed, p idemdriver.ClaimParams, clientKey string) *Execution {
	rec := c.res.Record
	e := &Execution{
		cfg: cfg, c: c, p: p, tx: c.tx, parent: parent,
		info: Info{Scope: p.Scope, Key: clientKey, FencingToken: rec.FencingToken, Attempt: rec.Attempts, Created: rec.CreatedAt},
		fence: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
			LeaseDuration: p.LeaseDuration},
	}
	if cfg.Notify {
		e.fence.Notify = NotifyPayload(p.Scope, p.Key) // waiters may wait in other processes
		// Only when one marked the record (waitHub.mark): in durable-claim
		// mode, whose record no lock holds while the job runs.
		_, marks := cfg.Store.(idemdriver.WaitMarker)
		e.fence.NotifyMarked = marks && !cfg.OneCommit
	}
	e.detachedParent = context.WithoutCancel(parent)
	// Detached: a hang-up does not stop the work; a lost lease does.
	ctx, cancel := context.WithCancelCause(e.detachedParent)
	e.ctx, e.cancel = context.WithValue(ctx, ctxKey{}, e), cancel
	return e
}

// Override is a job's outcome whatever Config.Outcome says of its status.
type Override int

const (
	ByPolicy Override = iota // Config.Outcome decides
	// OverrideFailed: Do's fn returned an error.
	OverrideFailed
	// OverrideSucceeded: idem answered 500 in place of a handler's invalid
	// status, and the handler's effects may have happened: its answer is
	// recorded, so that it never runs again.
	OverrideSucceeded
)

func (e *Execution) runJob(j Job) (status int, o Override, p *Panic) {
	panicked := true
	defer func() {
		if panicked {
			p = &Panic{Value: recover(), Stack: debug.Stack()}
		}
	}()
	status, o = j.Run(e.ctx)
	panicked = false
	return status, o, nil
}

func (e *Execution) businessTx() (idemdriver.Tx, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return nil, ErrExecutionEnded
	}
	if e.tx == nil {
		tx, err := e.cfg.Store.Begin(e.ctx)
		if err != nil {
			return nil, &StoreError{Op: "begin", Err: err}
		}
		e.tx = tx
	}
	return e.tx, nil
}

func (e *Execution) endTx() idemdriver.Tx {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ended = true
	return e.tx
}

func (e *Execution) detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.detachedParent, e.cfg.CompleteTimeout)
}

// uncancelled waits at most CompleteTimeout for f on a never-cancelled context:
// a cancelled COMMIT can commit locally only, lost in a failover.
func (e *Execution) uncancelled(f func(context.Context) (bool, error)) (bool, error) {
	type result struct {
		ok  bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ok, err := f(e.detachedParent)
		done <- result{ok, err}
	}()
	t := time.NewTimer(e.cfg.CompleteTimeout)
	defer t.Stop()
	select {
	case r := <-done:
		return r.ok, r.err
	case <-t.C:
		e.cfg.Logger.WarnContext(e.parent, "idem: the commit of an outcome is still running past CompleteTimeout; not cancelling it",
			"scope", e.fence.Scope, "key", e.fence.Key, "complete_timeout", e.cfg.CompleteTimeout)
		return false, ErrCommitPending
	}
}

// completeIn commits p with tx, never cancelling the COMMIT. A COMMIT error
// (outcome unknown) is a StoreError with Op "commit".
func (e *Execution) completeIn(tx idemdriver.Tx, p idemdriver.CompleteParams) (bool, error) {
	cc, pipelined := tx.(idemdriver.CompleteCommitter)
	if pipelined {
		ok, err := e.uncancelled(func(ctx context.Context) (bool, error) {
			ok, err := cc.CompleteCommit(ctx, p)
			if !ok && !errors.Is(err, idemdriver.ErrCommit) {
				// The caller may have stopped waiting: roll back here.
				_ = tx.Rollback(ctx)
			}
			return ok, err
		})
		if errors.Is(err, idemdriver.ErrCommit) || errors.Is(err, ErrCommitPending) {
			return false, &StoreError{Op: "commit", Err: err}
		}
		return ok, completionError(err)
	}
	ctx, cancel := e.detached()
	ok, err := tx.Complete(ctx, p)
	cancel()
	if err != nil || !ok {
		return ok, completionError(err)
	}
	if _, err := e.uncancelled(func(ctx context.Context) (bool, error) { return true, tx.Commit(ctx) }); err != nil {
		return false, &StoreError{Op: "commit", Err: err}
	}
	return true, nil
}

func completionError(err error) error {
	if err == nil || errors.Is(err, idemdriver.ErrTxDone) || errors.Is(err, idemdriver.ErrTxAborted) {
		return err
	}
	return &StoreError{Op: "complete", Err: err}
}

func isCommitError(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Op == "commit"
}

func (e *Execution) completeWithoutTx(p idemdriver.CompleteParams) (bool, error) {
	ok, err := e.uncancelled(func(ctx context.Context) (bool, error) { return e.cfg.Store.Complete(ctx, p) })
	if err != nil {
		return false, &StoreError{Op: "complete", Err: err}
	}
	return ok, nil
}

func (e *Execution) rollbackTx(tx idemdriver.Tx) error {
	ctx, cancel := e.detached()
	defer cancel()
	return tx.Rollback(ctx)
}

func (e *Execution) rollback() {
	if tx := e.endTx(); tx != nil {
		if err := e.rollbackTx(tx); err != nil {
			e.cfg.Logger.WarnContext(e.parent, "idem: rollback", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		}
	}
}

// storeFail: a store error leaves the record PROCESSING until its lease runs out.
func (e *Execution) storeFail() (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := e.cfg.Store.Fail(ctx, e.fence)
	if err != nil {
		e.cfg.Logger.WarnContext(e.parent, "idem: recording FAILED", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
	}
	return owned, err
}

func (e *Execution) takenOver() bool {
	ctx, cancel := e.detached()
	defer cancel()
	rec, err := e.cfg.Store.Get(ctx, idemdriver.GetParams{Scope: e.fence.Scope, Key: e.fence.Key})
	return err == nil && (rec.FencingToken != e.fence.FencingToken || !rec.CreatedAt.Equal(e.fence.CreatedAt))
}

func (e *Execution) released() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.releaseAsked
}

func (e *Execution) txBegun() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tx != nil
}

func (e *Execution) txOpen() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tx != nil && !e.ended
}

// outcomeUnknown is the *UnknownError of an execution that made its record
// UNKNOWN, nil otherwise.
func (e *Execution) outcomeUnknown() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.unknown
}
