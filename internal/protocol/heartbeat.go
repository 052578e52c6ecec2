package protocol

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

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
	case err == nil && !ok && e.outcomeUnknown() != nil:
		return false // the execution made its record UNKNOWN: no lease to keep
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

// confirm renews the lease at once, as a tick would (settle): an
// at-most-once call then starts with a whole lease on this process's clock
// (guard), or not at all when the lease was lost (the execution's context
// is cancelled, ErrLeaseLost).
func (hb *heartbeat) confirm() {
	e := hb.e
	sent := time.Now()
	ctx, cancel := context.WithTimeout(e.ctx, hb.lease/3)
	ok, err := e.cfg.Store.Heartbeat(ctx, e.fence)
	cancel()
	hb.settle(sent, ok, err)
}

// errLeaseRanOut is the cause that ends a guard's context.
var errLeaseRanOut = fmt.Errorf("%w: a whole lease passed on this process's clock since the store last confirmed a renewal", ErrLeaseLost)

// guard returns a context of parent that ends, with cause errLeaseRanOut,
// once the lease may have run out on this process's clock: a whole lease
// since the latest renewal the store confirmed (or the claim) was sent; a
// renewal in flight does not count until confirmed. The renewals learn a
// lost lease from the store, a round trip after their next tick: a process
// paused past its lease (a GC pause, a frozen VM, SIGSTOP) and resumed
// meanwhile acts as the owner, while another may have taken the key over.
// The guard's Err and Done read the clock themselves, so the first look at
// the context after the pause finds it ended, whichever goroutine runs
// first; a goroutine of its own ends it too, for a select that looked
// before. stop releases it.
func (hb *heartbeat) guard(parent context.Context) (ctx context.Context, stop func()) {
	inner, cancel := context.WithCancelCause(parent)
	g := &guarded{Context: inner, hb: hb, cancel: cancel}
	if g.expired() {
		return g, func() { cancel(context.Canceled) }
	}
	go func() {
		for d := hb.leaseLeft(); d > 0; d = hb.leaseLeft() {
			t := time.NewTimer(d)
			select {
			case <-inner.Done():
				t.Stop()
				return
			case <-t.C:
			}
		}
		cancel(errLeaseRanOut)
	}()
	return g, func() { cancel(context.Canceled) }
}

// leaseLeft is what is left of the lease on this process's clock.
func (hb *heartbeat) leaseLeft() time.Duration {
	hb.mu.Lock()
	defer hb.mu.Unlock()
	return hb.lease - time.Since(hb.lastOK)
}

// guarded is guard's context: its Err and Done end it first when the
// lease ran out on this process's clock.
type guarded struct {
	context.Context
	hb     *heartbeat
	cancel context.CancelCauseFunc
}

// expired ends g, cause errLeaseRanOut, when the lease ran out; it reports
// whether it did.
func (g *guarded) expired() bool {
	if g.hb.leaseLeft() > 0 {
		return false
	}
	g.cancel(errLeaseRanOut)
	return true
}

func (g *guarded) Done() <-chan struct{} {
	g.expired()
	return g.Context.Done()
}

func (g *guarded) Err() error {
	g.expired()
	return g.Context.Err()
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
