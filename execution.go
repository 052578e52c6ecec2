package idem

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Execution describes the claim a protected handler (or Do's fn) runs
// under. Get it with ExecutionFromContext.
type Execution struct {
	Scope string
	Key   string
	// FencingToken is this claim's token: greater than every earlier claim's
	// of (Scope, Key) while its record exists (a purged key starts at 1
	// again; (Created, FencingToken) orders every claim of the key).
	FencingToken int64
	// Attempt counts the claims of this key, this one included.
	Attempt int
	// Created is the record's created_at (database clock, microseconds):
	// when this life of the key began, kept by takeovers and re-claims; part
	// of the relayed key (DeriveKey).
	Created time.Time
}

// ctxKey carries the *execution in the context of the work it runs.
type ctxKey struct{}

func executionFrom(ctx context.Context) (*execution, bool) {
	e, ok := ctx.Value(ctxKey{}).(*execution)
	return e, ok
}

// ExecutionFromContext returns the claim the context's work runs under, and
// false outside a protected execution.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := executionFrom(ctx)
	if !ok {
		return Execution{}, false
	}
	return e.info, true
}

// Tx returns the claim's business transaction as the store's own type T:
// pgx.Tx for idempgx, *sql.Tx for idemsqlite and idemmysql (CONTRACT
// section 6). It is begun on first use, on the execution's context (a lost
// lease aborts it), and the completion commits with it: leave Commit and
// Rollback to idem. In the one-commit mode it is the claim's own
// transaction. Errors: ErrNoExecution outside a protected execution,
// ErrExecutionEnded after it ended, a *StoreError when the store could not
// begin, and an error naming both types when T is not the store's.
func Tx[T any](ctx context.Context) (T, error) {
	var zero T
	e, ok := executionFrom(ctx)
	if !ok {
		return zero, ErrNoExecution
	}
	tx, err := e.businessTx()
	if err != nil {
		return zero, err
	}
	native, ok := tx.Native().(T)
	if !ok {
		return zero, fmt.Errorf("idem: the store's transaction is a %T, not a %v: ask Tx for the Store's own type", tx.Native(), reflect.TypeFor[T]())
	}
	return native, nil
}

// ReleaseKey asks that the execution running under ctx not be recorded:
// its record is removed (a fenced Driver.Release), its answer reaches the
// caller as written, and the next request with the key runs as new. Call
// it on a validation path, before any side effect (Stripe saves no result
// when parameters fail validation). The business writes are rolled back.
// Errors: ErrNoExecution outside a protected execution, ErrExecutionEnded
// after it ended.
func ReleaseKey(ctx context.Context) error {
	e, ok := executionFrom(ctx)
	if !ok {
		return ErrNoExecution
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return ErrExecutionEnded
	}
	e.releaseAsked = true
	return nil
}

// job is what a front runs under a claim: an HTTP handler or Do's fn.
type job interface {
	// run does the work on the execution's context and returns its status;
	// failed forces the Failed outcome (Do's fn returned an error).
	run(ctx context.Context) (status int, failed bool)
	// response is the stored form of the work's answer.
	response() idemdriver.Response
}

// claimed is a won claim: its record, and in the one-commit mode the
// transaction it is uncommitted in.
type claimed struct {
	res  idemdriver.ClaimResult
	tx   idemdriver.Tx
	sent time.Time // when the claim was sent: the first lease runs from no earlier
	// one-commit mode: the turn the claim leads, and the end of tx's context
	turn  *keyTurn
	endTx context.CancelFunc
}

// execution is one owned run of a job: its detached context, what holds
// its claim, and its business transaction.
type execution struct {
	cfg    *EngineConfig
	c      claimed
	p      idemdriver.ClaimParams
	info   Execution
	fence  idemdriver.FenceParams
	ctx    context.Context
	cancel context.CancelCauseFunc
	parent context.Context // the caller's, for logs
	// detachedParent is parent without its cancellation: the root of every
	// context the execution's statements run on.
	detachedParent context.Context
	hb             heartbeat
	committed      *idemdriver.Response // the outcome, once committed

	mu           sync.Mutex
	tx           idemdriver.Tx
	ended        bool
	releaseAsked bool
}

func newExecution(cfg *EngineConfig, parent context.Context, c claimed, p idemdriver.ClaimParams) *execution {
	rec := c.res.Record
	e := &execution{
		cfg: cfg, c: c, p: p, tx: c.tx, parent: parent,
		info: Execution{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, Attempt: rec.Attempts, Created: rec.CreatedAt},
		fence: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
			LeaseDuration: p.LeaseDuration},
	}
	e.detachedParent = context.WithoutCancel(parent)
	// Detached from the caller: a hang-up does not stop the work; a lost
	// lease does (CONTRACT section 4).
	ctx, cancel := context.WithCancelCause(e.detachedParent)
	e.ctx, e.cancel = context.WithValue(ctx, ctxKey{}, e), cancel
	return e
}

// runJob runs j, recovering a panic so that its outcome is recorded
// (Failed, CONTRACT section 5) before it is raised again.
func (e *execution) runJob(j job) (status int, failed, panicked bool, recovered any) {
	panicked = true
	defer func() {
		if panicked {
			recovered = recover()
		}
	}()
	status, failed = j.run(e.ctx)
	return status, failed, false, nil
}

// businessTx returns the business transaction, begun on first use.
func (e *execution) businessTx() (idemdriver.Tx, error) {
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

// endTx closes the transaction source and returns the transaction, if any.
func (e *execution) endTx() idemdriver.Tx {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.ended = true
	return e.tx
}

// detached returns a context for recording the outcome: not cancelled by
// the caller, bounded by CompleteTimeout.
func (e *execution) detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.detachedParent, e.cfg.CompleteTimeout)
}

// ErrCommitPending is the cause of the store error answered when the COMMIT
// of an outcome has not returned within CompleteTimeout; it goes on, never
// cancelled (docs/deployment.md).
var ErrCommitPending = errors.New("idem: the commit of the outcome did not return within CompleteTimeout; it was not cancelled and may still take effect")

// durable runs f, a statement that commits an outcome, on a context never
// cancelled, and waits for it at most CompleteTimeout (then
// ErrCommitPending). A cancelled COMMIT can be committed locally only: on
// PostgreSQL "canceling wait for synchronous replication", an outcome lost
// in a failover.
func (e *execution) durable(f func(context.Context) (bool, error)) (bool, error) {
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

// completeIn writes the completion p in the business transaction tx and
// commits both, never cancelling the COMMIT (see durable): in one round
// trip when tx is an idemdriver.CompleteCommitter. It reports false when
// fenced out. An error of the COMMIT, after which the outcome is unknown, is
// a StoreError with Op "commit" (isCommitError); ErrTxDone and ErrTxAborted
// come as the driver wraps them; nothing is committed after any other.
func (e *execution) completeIn(tx idemdriver.Tx, p idemdriver.CompleteParams) (bool, error) {
	cc, pipelined := tx.(idemdriver.CompleteCommitter)
	if pipelined {
		ok, err := e.durable(func(ctx context.Context) (bool, error) {
			ok, err := cc.CompleteCommit(ctx, p)
			if !ok && !errors.Is(err, idemdriver.ErrCommit) {
				// Nothing committed: roll back here, as the caller may have
				// stopped waiting (ErrCommitPending).
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
	if _, err := e.durable(func(ctx context.Context) (bool, error) { return true, tx.Commit(ctx) }); err != nil {
		return false, &StoreError{Op: "commit", Err: err}
	}
	return true, nil
}

// completionError is a completion's error as the caller branches on it.
func completionError(err error) error {
	if err == nil || errors.Is(err, idemdriver.ErrTxDone) || errors.Is(err, idemdriver.ErrTxAborted) {
		return err
	}
	return &StoreError{Op: "complete", Err: err}
}

// isCommitError reports whether err is a COMMIT's (completeIn): the
// outcome may have committed.
func isCommitError(err error) bool {
	var se *StoreError
	return errors.As(err, &se) && se.Op == "commit"
}

// completeAlone records SUCCEEDED in one statement, never cancelled.
func (e *execution) completeAlone(p idemdriver.CompleteParams) (bool, error) {
	ok, err := e.durable(func(ctx context.Context) (bool, error) { return e.cfg.Store.Complete(ctx, p) })
	if err != nil {
		return false, &StoreError{Op: "complete", Err: err}
	}
	return ok, nil
}

// rollbackTx rolls tx back on a detached context (a no-op once it ended).
func (e *execution) rollbackTx(tx idemdriver.Tx) error {
	ctx, cancel := e.detached()
	defer cancel()
	return tx.Rollback(ctx)
}

// rollback aborts the business transaction, if one was begun.
func (e *execution) rollback() {
	if tx := e.endTx(); tx != nil {
		if err := e.rollbackTx(tx); err != nil {
			e.cfg.Logger.WarnContext(e.parent, "idem: rollback", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		}
	}
}

// storeFail records FAILED (fenced), so the next request runs again. It
// reports whether this execution still owned the record; a store error
// leaves it PROCESSING until its lease runs out (taken over then).
func (e *execution) storeFail() (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := e.cfg.Store.Fail(ctx, e.fence)
	if err != nil {
		e.cfg.Logger.WarnContext(e.parent, "idem: recording FAILED", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
	}
	return owned, err
}

// takenOver reports whether the key's record now belongs to another claim
// (another fencing token, or a new life of the key).
func (e *execution) takenOver() bool {
	ctx, cancel := e.detached()
	defer cancel()
	rec, err := e.cfg.Store.Get(ctx, idemdriver.GetParams{Scope: e.fence.Scope, Key: e.fence.Key})
	return err == nil && (rec.FencingToken != e.fence.FencingToken || !rec.CreatedAt.Equal(e.fence.CreatedAt))
}

// released reports whether the work called ReleaseKey.
func (e *execution) released() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.releaseAsked
}

// txBegun reports whether the business transaction was begun.
func (e *execution) txBegun() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tx != nil
}

// txOpen reports whether the business transaction is open.
func (e *execution) txOpen() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tx != nil && !e.ended
}

type heartbeat struct {
	e       *execution
	lease   time.Duration
	started time.Time // for MaxExecution
	// first fires the first renewal (or MaxExecution, if sooner) and runs
	// the renewal loop in its own goroutine: a handler that returns before
	// LeaseDuration/3 costs a timer, no goroutine.
	first *time.Timer

	mu      sync.Mutex
	stopped bool
	stopc   chan struct{}      // made when the loop starts; closed by stop
	done    chan struct{}      // made when the loop starts; closed when it ends
	cancel  context.CancelFunc // ends an in-flight renewal at stop
	// lastOK is when the latest successful renewal (or the claim) was sent:
	// the lease runs at least LeaseDuration from then. Read after stop.
	lastOK time.Time
}

// startHeartbeat extends the lease every LeaseDuration/3 while the handler
// runs. When the store says the lease is lost, it cancels the handler's
// context with cause ErrLeaseLost; when no renewal has succeeded for a whole
// lease (the store unreachable), with a *StoreError (ErrStoreUnavailable);
// after MaxExecution, with ErrExecutionTimeout, and stops renewing.
//
// claimSent is when the claim statement was sent: the first lease runs from
// no earlier.
//
// It is called once per execution: the heartbeat is allocated with it.
func (e *execution) startHeartbeat(claimSent time.Time) *heartbeat {
	hb := &e.hb
	*hb = heartbeat{e: e, lease: e.cfg.LeaseDuration, started: time.Now(), lastOK: claimSent}
	hb.first = time.AfterFunc(min(hb.lease/3, e.cfg.MaxExecution), hb.run)
	return hb
}

// run is the renewal loop, from the first renewal on; it returns at once
// when stop came first.
func (hb *heartbeat) run() {
	e := hb.e
	hb.mu.Lock()
	if hb.stopped {
		hb.mu.Unlock()
		return
	}
	hbCtx, cancel := context.WithCancel(e.ctx)
	hb.stopc, hb.done, hb.cancel = make(chan struct{}), make(chan struct{}), cancel
	hb.mu.Unlock()
	defer close(hb.done)
	defer cancel()

	if time.Since(hb.started) >= e.cfg.MaxExecution {
		hb.ranPastMaxExecution() // MaxExecution shorter than LeaseDuration/3
		return
	}
	sw, ok := e.cfg.Store.(idemdriver.SingleWriter)
	singleWriter := ok && sw.SingleWriter()
	t := time.NewTicker(hb.lease / 3)
	defer t.Stop()
	limit := time.NewTimer(e.cfg.MaxExecution - time.Since(hb.started))
	defer limit.Stop()
	for hb.renew(hbCtx, singleWriter) {
		select {
		case <-hb.stopc:
			return
		case <-limit.C:
			hb.ranPastMaxExecution()
			return
		case <-t.C:
		}
	}
}

// renew extends the lease once (it is due) and reports whether the loop
// goes on: false once stopped, the lease lost or given up.
func (hb *heartbeat) renew(ctx context.Context, singleWriter bool) bool {
	e := hb.e
	select { // a tick and a stop both ready: stop wins
	case <-hb.stopc:
		return false
	default:
	}
	if singleWriter && e.txOpen() {
		// The business transaction holds the database's only write
		// lock: no one can claim the key until it ends, and a renewal
		// would only wait for that lock, behind our own transaction.
		hb.lastOK = time.Now()
		return true
	}
	// The lease runs from the database's now, which is no earlier than
	// the moment the renewal was sent.
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, hb.lease/3)
	ok, err := e.cfg.Store.Heartbeat(rctx, e.fence)
	cancel()
	select { // stopped during the renewal: the outcome is recorded next, whatever it said
	case <-hb.stopc:
		return false
	default:
	}
	switch {
	case err == nil && ok:
		hb.lastOK = sent
	case err == nil && !ok:
		e.cfg.Logger.WarnContext(e.parent, "idem: lease lost", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		e.cancel(ErrLeaseLost)
		return false
	case errors.Is(err, idemdriver.ErrBusy):
		// Queued behind another transaction's write lock (a single
		// writer): no claim can take the key over while it is held.
		hb.lastOK = time.Now()
	case time.Since(hb.lastOK) >= hb.lease:
		e.cfg.Logger.WarnContext(e.parent, "idem: lease not renewed for a whole lease; giving up", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		e.cancel(&StoreError{Op: "heartbeat", Err: err})
		return false
	}
	return true
}

// ranPastMaxExecution ends the execution with ErrExecutionTimeout, unless
// the handler has just returned (its outcome is recorded as usual).
func (hb *heartbeat) ranPastMaxExecution() {
	select {
	case <-hb.stopc:
		return
	default:
	}
	e := hb.e
	e.cfg.Logger.WarnContext(e.parent, "idem: execution ran past MaxExecution; no longer renewing its lease",
		"scope", e.fence.Scope, "key", e.fence.Key, "max_execution", e.cfg.MaxExecution)
	e.cancel(ErrExecutionTimeout)
}

// leaseRanOut reports whether the lease may have run out (no renewal for a
// whole lease) by the time the handler returned. Call it after stop.
func (hb *heartbeat) leaseRanOut() bool { return time.Since(hb.lastOK) >= hb.lease }

// stop ends the heartbeat: it cancels an in-flight renewal (one waiting for
// a pooled connection would otherwise hold the response for up to
// LeaseDuration/3) and waits for it to return. A renewal the database still
// runs cannot undo the completion: both are fenced, and a renewal that finds
// the record no longer PROCESSING changes nothing.
func (hb *heartbeat) stop() {
	hb.first.Stop()
	hb.mu.Lock()
	hb.stopped = true
	running := hb.done != nil
	hb.mu.Unlock()
	if running {
		close(hb.stopc)
		hb.cancel()
		<-hb.done
	}
}
