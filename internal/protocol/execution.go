package protocol

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
// rolled back. Errors: ErrExecutionEnded.
func (e *Execution) Release() error {
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
		e.fence.Notify = notifyPayload(p.Scope, p.Key) // waiters may wait in other processes
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

func (e *Execution) runJob(j Job) (status int, o Override, panicked bool, recovered any) {
	panicked = true
	defer func() {
		if panicked {
			recovered = recover()
		}
	}()
	status, o = j.Run(e.ctx)
	return status, o, false, nil
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

type heartbeat struct {
	e       *Execution
	lease   time.Duration
	started time.Time // for MaxExecution
	// renewer, when not nil, renews this lease with the engine's other
	// executions' in one statement per tick (idemdriver.Renewer); else the
	// heartbeat's own loop sends a Heartbeat per tick.
	renewer *renewer
	// first starts the own loop: a handler that returns sooner costs no
	// goroutine. With a renewer it ends the renewals at MaxExecution.
	first *time.Timer

	mu      sync.Mutex
	stopped bool
	stopc   chan struct{}      // own loop: made when it starts; closed by stop
	done    chan struct{}      // own loop: made when it starts; closed when it ends
	cancel  context.CancelFunc // own loop: ends an in-flight renewal at stop
	// lastOK is when the latest successful renewal (or the claim) was sent.
	lastOK time.Time
}

// startHeartbeat renews the lease every LeaseDuration/3, through r when it
// is not nil (one statement for all of r's leases), else on its own. It
// cancels the context with ErrLeaseLost when the lease is lost, a
// *StoreError after a whole lease without renewal, or ErrExecutionTimeout
// after MaxExecution.
func (e *Execution) startHeartbeat(claimSent time.Time, r *renewer) *heartbeat {
	hb := &e.hb
	*hb = heartbeat{e: e, lease: e.cfg.LeaseDuration, started: time.Now(), lastOK: claimSent, renewer: r}
	if r != nil {
		hb.first = time.AfterFunc(e.cfg.MaxExecution, hb.ranPastMaxExecution)
		r.add(hb)
		return hb
	}
	hb.first = time.AfterFunc(min(hb.lease/3, e.cfg.MaxExecution), hb.run)
	return hb
}

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
	singleWriter := isSingleWriter(e.cfg.Store)
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

// isSingleWriter reports whether store has one writer at a time
// (idemdriver.SingleWriter).
func isSingleWriter(store idemdriver.Driver) bool {
	sw, ok := store.(idemdriver.SingleWriter)
	return ok && sw.SingleWriter()
}

// renew sends the own loop's renewal; false once the loop must end.
func (hb *heartbeat) renew(ctx context.Context, singleWriter bool) bool {
	e := hb.e
	select { // a tick and a stop both ready: stop wins
	case <-hb.stopc:
		return false
	default:
	}
	if singleWriter && e.txOpen() {
		return hb.settle(time.Now(), true, nil)
	}
	// The database's now is no earlier than this.
	sent := time.Now()
	rctx, cancel := context.WithTimeout(ctx, hb.lease/3)
	ok, err := e.cfg.Store.Heartbeat(rctx, e.fence)
	cancel()
	return hb.settle(sent, ok, err)
}

// settle applies the answer to a renewal sent at sent (ok: the lease was
// extended; err: the store's error), unless the heartbeat has stopped: the
// outcome is recorded next, whatever the renewal said. It reports whether
// the lease is still to be renewed.
func (hb *heartbeat) settle(sent time.Time, ok bool, err error) bool {
	e := hb.e
	hb.mu.Lock()
	defer hb.mu.Unlock()
	switch {
	case hb.stopped:
		return false
	case err == nil && ok:
		hb.lastOK = sent
	case err == nil && !ok:
		e.cfg.Logger.WarnContext(e.parent, "idem: lease lost", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		e.cancel(ErrLeaseLost)
		return false
	case errors.Is(err, idemdriver.ErrBusy):
		// Queued behind a single writer's lock: no takeover meanwhile.
		hb.lastOK = time.Now()
	case time.Since(hb.lastOK) >= hb.lease:
		e.cfg.Logger.WarnContext(e.parent, "idem: lease not renewed for a whole lease; giving up", "scope", e.fence.Scope, "key", e.fence.Key, "err", err)
		e.cancel(&StoreError{Op: "heartbeat", Err: err})
		return false
	}
	return true
}

func (hb *heartbeat) ranPastMaxExecution() {
	hb.mu.Lock()
	stopped := hb.stopped
	hb.mu.Unlock()
	if stopped {
		return
	}
	if hb.renewer != nil {
		hb.renewer.remove(hb)
	}
	e := hb.e
	e.cfg.Logger.WarnContext(e.parent, "idem: execution ran past Lease.MaxExecution; no longer renewing its lease",
		"scope", e.fence.Scope, "key", e.fence.Key, "max_execution", e.cfg.MaxExecution)
	e.cancel(ErrExecutionTimeout)
}

// leaseRanOut reports, after stop, whether the lease may have run out.
func (hb *heartbeat) leaseRanOut() bool {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return time.Since(hb.lastOK) >= hb.lease
}

// stop ends the renewals: it cancels the own loop's in-flight renewal and
// waits for it, or leaves the renewer (whose statement in flight goes on
// for the other leases). A renewal the database still runs is fenced and
// cannot undo the completion.
func (hb *heartbeat) stop() {
	hb.first.Stop()
	hb.mu.Lock()
	hb.stopped = true
	running := hb.done != nil
	hb.mu.Unlock()
	if hb.renewer != nil {
		hb.renewer.remove(hb)
	}
	if running {
		close(hb.stopc)
		hb.cancel()
		<-hb.done
	}
}

// notifyPayload names (scope, key) in notifications: 128 bits of a SHA-256,
// so that any scope and key fit a notification and none is sent in clear.
// A collision only wakes another key's waiters, who read their record again.
func notifyPayload(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:16])
}
