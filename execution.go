package idem

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/execctx"
)

// Execution describes the claim a protected handler runs under. Get it with
// ExecutionFromContext.
type Execution struct {
	Scope string
	Key   string
	// FencingToken is this claim's token: greater than every earlier claim's
	// for (Scope, Key) while its record exists (a purged key starts again at
	// 1). Downstream writes may be fenced with (Created, FencingToken), which
	// orders every claim of the key.
	FencingToken int64
	// Attempt counts the claims of this key so far, this one included (1 on
	// the first execution; more after a FAILED outcome or a takeover).
	Attempt int
	// Created is the record's created_at on the database clock (microsecond
	// precision): when this life of the key began. Takeovers and re-claims
	// keep it; a key reused after its record expired starts a new life. It
	// is part of the relayed key (DeriveKey).
	Created time.Time
}

// executionFrom is the execution a protected handler's context runs under
// (execctx carries it, for the seam's TxFromContext too).
func executionFrom(ctx context.Context) (*execution, bool) {
	e, ok := execctx.From(ctx).(*execution)
	return e, ok
}

// ExecutionFromContext returns the claim that the handler's context runs
// under, and false outside a protected execution.
func ExecutionFromContext(ctx context.Context) (Execution, bool) {
	e, ok := executionFrom(ctx)
	if !ok {
		return Execution{}, false
	}
	return e.info, true
}

// ReleaseKey asks that the protected execution running under ctx not be
// recorded: when the handler returns, its record is removed (a fenced
// Driver.Release) instead of completed, its answer reaches the caller as
// written, and the next request with the key runs as a new one, whatever
// its payload. Call it on a validation path, before any side effect: a
// request the client will correct must not burn the key (Stripe saves no
// result when parameters fail validation), and a key released after a side
// effect lets the corrected request run it again under a new relayed key.
// In transactional mode the business writes are rolled back. It returns
// idemdriver.ErrNoExecution outside a protected handler and
// ErrExecutionEnded after the handler returned.
func ReleaseKey(ctx context.Context) error {
	e, ok := executionFrom(ctx)
	if !ok {
		return idemdriver.ErrNoExecution
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return ErrExecutionEnded
	}
	e.releaseAsked = true
	return nil
}

// ErrExecutionEnded is returned by the drivers' Tx functions when a handler
// asks for the business transaction after its execution ended (from a
// goroutine that outlived the handler, for example).
var ErrExecutionEnded = errors.New("idem: the execution has ended; its transaction is closed")

// execution is one owned run of a handler: its detached context, its lease
// heartbeat and its lazily begun business transaction.
type execution struct {
	m      *Middleware
	info   Execution
	fence  idemdriver.FenceParams
	ctx    context.Context
	cancel context.CancelCauseFunc
	parent context.Context // the request's context, for detached completion
	// detachedParent is parent without its cancellation (and deadline): the
	// root of every context the execution's statements run on.
	detachedParent context.Context
	hb             heartbeat // see startHeartbeat

	mu           sync.Mutex
	tx           idemdriver.Tx
	ended        bool
	releaseAsked bool // ReleaseKey was called
}

func newExecution(m *Middleware, parent context.Context, rec idemdriver.Record, p idemdriver.ClaimParams) *execution {
	e := &execution{
		m:    m,
		info: Execution{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, Attempt: rec.Attempts, Created: rec.CreatedAt},
		fence: idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
			LeaseDuration: p.LeaseDuration},
		parent: parent,
	}
	e.detachedParent = context.WithoutCancel(parent)
	// Detached from the client: a hang-up does not stop the work; a lost
	// lease does (CONTRACT section 4).
	ctx, cancel := context.WithCancelCause(e.detachedParent)
	e.ctx, e.cancel = execctx.With(ctx, e), cancel
	return e
}

// Tx hands idemdriver.TxFromContext (and so the drivers' Tx functions) the
// claim's business transaction, begun on first use on the execution's
// context (so a lost lease aborts it).
func (e *execution) Tx(context.Context) (idemdriver.Tx, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.ended {
		return nil, ErrExecutionEnded
	}
	if e.tx == nil {
		tx, err := e.m.cfg.Store.Begin(e.ctx)
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
// the client, bounded by CompleteTimeout.
func (e *execution) detached() (context.Context, context.CancelFunc) {
	return context.WithTimeout(e.detachedParent, e.m.cfg.CompleteTimeout)
}

// ErrCommitPending is the cause of the store error answered when the
// statement that commits an outcome has not returned within CompleteTimeout.
// It keeps running: idem never cancels it (see durable).
var ErrCommitPending = errors.New("idem: the commit of the outcome did not return within CompleteTimeout; it was not cancelled and may still take effect")

// durable runs f, a statement that commits an outcome, on a context that is
// never cancelled, and waits for it at most CompleteTimeout. Cancelling a
// COMMIT can leave it committed locally but not as durable as the server is
// configured to make it: PostgreSQL answers a cancelled wait for synchronous
// replication with "canceling wait for synchronous replication ... already
// committed locally", and the outcome, visible to replays, is lost in a
// failover (docs/deployment.md). Past CompleteTimeout the request gets
// ErrCommitPending while the statement goes on: the record stays locked, and
// invisible to replays, until the server has made it durable (or not).
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
	t := time.NewTimer(e.m.cfg.CompleteTimeout)
	defer t.Stop()
	select {
	case r := <-done:
		return r.ok, r.err
	case <-t.C:
		e.m.cfg.Logger.WarnContext(e.parent, "idem: the commit of an outcome is still running past CompleteTimeout; not cancelling it",
			"scope", e.fence.Scope, "key", e.fence.Key, "complete_timeout", e.m.cfg.CompleteTimeout)
		return false, ErrCommitPending
	}
}

// complete records SUCCEEDED, in the business transaction when the handler
// used one (committing both together), else in one statement. It reports
// false when the execution was fenced out. The statement that commits the
// outcome is never cancelled (see durable).
//
// A business transaction that had aborted (idemdriver.ErrTxAborted: a
// statement of the handler failed) is rolled back and the response is
// recorded on its own, since the business writes are gone either way; but
// a 2xx is a success whose writes never happened: complete then records
// nothing and returns ErrTxAborted.
func (e *execution) complete(resp idemdriver.Response) (bool, error) {
	p := idemdriver.CompleteParams{FenceParams: e.fence, Response: resp}
	tx := e.endTx()
	if tx == nil {
		return e.completeAlone(p)
	}
	ok, committed, err := e.completeIn(tx, p)
	if committed {
		return ok, err
	}
	switch {
	case errors.Is(err, idemdriver.ErrTxDone):
		// The handler ended the transaction itself, against the contract:
		// its writes are committed (or gone) already. Record the outcome on
		// its own, so the next request replays instead of running again.
		e.m.cfg.Logger.ErrorContext(e.parent, "idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", e.fence.Scope, "key", e.fence.Key)
		return e.completeAlone(p)
	case errors.Is(err, idemdriver.ErrTxAborted):
		if rerr := e.rollbackTx(tx); rerr != nil {
			e.m.cfg.Logger.WarnContext(e.parent, "idem: rollback", "scope", e.fence.Scope, "key", e.fence.Key, "err", rerr)
		}
		if resp.Status >= 200 && resp.Status < 300 {
			return false, ErrTxAborted
		}
		return e.completeAlone(p)
	case err != nil || !ok:
		_ = e.rollbackTx(tx)
		if err != nil {
			return false, &StoreError{Op: "complete", Err: err}
		}
		return false, nil
	}
	if _, err := e.durable(func(ctx context.Context) (bool, error) { return true, tx.Commit(ctx) }); err != nil {
		return false, &StoreError{Op: "commit", Err: err}
	}
	return true, nil
}

// completeIn writes the completion p in the business transaction tx. When
// tx sends the completion and its COMMIT together
// (idemdriver.CompleteCommitter), it does both, never cancelled (see
// durable), and committed reports that the transaction is over: ok, or the
// commit's error (a StoreError; ErrCommitPending when the commit outlives
// CompleteTimeout). Otherwise it is tx.Complete, and the caller commits or
// rolls back. A completion that fails or is fenced out commits nothing
// either way (committed is false, and the caller rolls back).
func (e *execution) completeIn(tx idemdriver.Tx, p idemdriver.CompleteParams) (ok, committed bool, err error) {
	cc, pipelined := tx.(idemdriver.CompleteCommitter)
	if !pipelined {
		ctx, cancel := e.detached()
		defer cancel()
		ok, err = tx.Complete(ctx, p)
		return ok, false, err
	}
	ok, err = e.durable(func(ctx context.Context) (bool, error) {
		ok, err := cc.CompleteCommit(ctx, p)
		if !ok && !errors.Is(err, idemdriver.ErrCommit) {
			// Nothing was committed: roll back here, for the caller stops
			// waiting after CompleteTimeout (ErrCommitPending) and would
			// leave the transaction open; its own Rollback is then a no-op.
			_ = tx.Rollback(ctx)
		}
		return ok, err
	})
	if errors.Is(err, idemdriver.ErrCommit) || errors.Is(err, ErrCommitPending) {
		return false, true, &StoreError{Op: "commit", Err: err}
	}
	return ok, ok && err == nil, err
}

// completeAlone records SUCCEEDED in one statement of its own, never
// cancelled (see durable).
func (e *execution) completeAlone(p idemdriver.CompleteParams) (bool, error) {
	ok, err := e.durable(func(ctx context.Context) (bool, error) { return e.m.cfg.Store.Complete(ctx, p) })
	if err != nil {
		return false, &StoreError{Op: "complete", Err: err}
	}
	return ok, nil
}

// rollbackTx rolls tx back, on a detached context (see detached).
func (e *execution) rollbackTx(tx idemdriver.Tx) error {
	ctx, cancel := e.detached()
	defer cancel()
	return tx.Rollback(ctx)
}

// rollback aborts the business transaction, if one was begun.
func (e *execution) rollback() {
	if tx := e.endTx(); tx != nil {
		if err := e.rollbackTx(tx); err != nil {
			e.m.cfg.Logger.WarnContext(e.parent, "idem: rollback", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		}
	}
}

// fail records FAILED so the next request runs again. When the store cannot
// be reached the record stays PROCESSING until its lease runs out, after
// which it is taken over: the same end, later.
//
// It reports false only when the store says another worker owns the key
// (fenced out); a store error counts as still owned.
func (e *execution) fail() bool {
	owned, err := e.failed()
	return owned || err != nil
}

// failed records FAILED after a completion error and reports whether this
// execution still owned the record (it is FAILED now: nothing committed),
// or the store's error (the record is unknown).
func (e *execution) failed() (owned bool, err error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err = e.m.cfg.Store.Fail(ctx, e.fence)
	if err != nil {
		e.m.cfg.Logger.WarnContext(e.parent, "idem: recording FAILED", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
	}
	return owned, err
}

// takenOver reports whether the key's record now belongs to another claim
// (another fencing token, or a new life of the key): this execution's
// outcome did not commit, and the new owner's counts.
func (e *execution) takenOver() bool {
	ctx, cancel := e.detached()
	defer cancel()
	rec, err := e.m.cfg.Store.Get(ctx, idemdriver.GetParams{Scope: e.fence.Scope, Key: e.fence.Key})
	return err == nil && (rec.FencingToken != e.fence.FencingToken || !rec.CreatedAt.Equal(e.fence.CreatedAt))
}

// outcome is how an execution that answered status is recorded:
// Released when the handler called ReleaseKey, else Config.Outcome's
// choice.
func (e *execution) outcome(status int) Outcome {
	if e.released() {
		return Released
	}
	return e.m.cfg.Outcome(status)
}

// released reports whether the handler called ReleaseKey.
func (e *execution) released() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.releaseAsked
}

// release removes the execution's record (fenced), and reports whether this
// execution still owned it.
func (e *execution) release() (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := e.m.cfg.Store.Release(ctx, e.fence)
	if err != nil {
		return false, &StoreError{Op: "release", Err: err}
	}
	return owned, nil
}

// txBegun reports whether the handler began the business transaction.
func (e *execution) txBegun() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.tx != nil
}

// txOpen reports whether the handler's business transaction is open.
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
	*hb = heartbeat{e: e, lease: e.m.cfg.LeaseDuration, started: time.Now(), lastOK: claimSent}
	hb.first = time.AfterFunc(min(hb.lease/3, e.m.cfg.MaxExecution), hb.run)
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

	if time.Since(hb.started) >= e.m.cfg.MaxExecution {
		hb.ranPastMaxExecution() // MaxExecution shorter than LeaseDuration/3
		return
	}
	sw, ok := e.m.cfg.Store.(idemdriver.SingleWriter)
	singleWriter := ok && sw.SingleWriter()
	t := time.NewTicker(hb.lease / 3)
	defer t.Stop()
	limit := time.NewTimer(e.m.cfg.MaxExecution - time.Since(hb.started))
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
	ok, err := e.m.cfg.Store.Heartbeat(rctx, e.fence)
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
		e.m.cfg.Logger.WarnContext(e.parent, "idem: lease lost", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		e.cancel(ErrLeaseLost)
		return false
	case errors.Is(err, idemdriver.ErrBusy):
		// Queued behind another transaction's write lock (a single
		// writer): no claim can take the key over while it is held.
		hb.lastOK = time.Now()
	case time.Since(hb.lastOK) >= hb.lease:
		e.m.cfg.Logger.WarnContext(e.parent, "idem: lease not renewed for a whole lease; giving up", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
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
	e.m.cfg.Logger.WarnContext(e.parent, "idem: execution ran past MaxExecution; no longer renewing its lease",
		"scope", e.fence.Scope, "key", e.fence.Key, "max_execution", e.m.cfg.MaxExecution)
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
