package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// oneCommit is the one-commit mode (CONTRACT section 6). A waiter on a row
// lock holds a connection, so in this process one request per key leads
// (leaderTurn); the others wait holding none and take its Answer.
type oneCommit struct {
	cfg   *Config
	tc    idemdriver.TxClaimer
	waits *waitHub
	// On a single-writer store, every transaction queues anyway.
	waitRunning time.Duration

	mu    sync.Mutex
	turns map[localKey]*leaderTurn
}

type localKey struct{ scope, key string }

// final, opened and shared are written before done is closed.
type leaderTurn struct {
	running chan struct{} // closed (by run) when the key runs: the leader's claim, or another process's
	once    sync.Once
	done    chan struct{} // closed when its claim or its transaction ended
	final   *idemdriver.Record
	opened  bool // final's response is opened (the leader's own, or its replay), not the store's
	shared  *Answer
}

func (t *leaderTurn) run() { t.once.Do(func() { close(t.running) }) }

func newOneCommit(cfg *Config, waits *waitHub) *oneCommit {
	o := &oneCommit{cfg: cfg, tc: cfg.Store.(idemdriver.TxClaimer), waits: waits, waitRunning: cfg.OneCommitWait, turns: map[localKey]*leaderTurn{}}
	if isSingleWriter(cfg.Store) {
		o.waitRunning = cfg.ClaimTimeout + cfg.MaxExecution + cfg.CompleteTimeout
	}
	return o
}

func (o *oneCommit) claim(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (claimed, Answer) {
	lk := localKey{p.Scope, p.Key}
	turn, v, followed := o.await(ctx, lk, p, wait)
	// Behind this process's own execution of the key a request waits
	// whatever its wait; it waited for its wait when it asked for one.
	waited := followed && wait > 0
	if turn == nil {
		return claimed{waited: waited}, v
	}
	deadline := time.Now().Add(wait)
	c, v := o.claimOnce(ctx, p, o.cfg.OneCommitWait)
	c.waited = waited
	if v.Kind == KindInFlight && wait > 0 {
		// The key runs in another process: wait for it holding no
		// connection, except while a claim waits on its row lock (one per
		// key and process); this process's waiters wait as for a leader
		// that runs.
		turn.run()
		c, v = o.waits.await(ctx, p, time.Until(deadline), v, func() (claimed, Answer) {
			return o.claimOnce(ctx, p, max(time.Millisecond, min(o.cfg.OneCommitWait, time.Until(deadline))))
		})
		c.waited = c.waited || waited
	}
	switch {
	case c.tx != nil:
		turn.run()
		c.turn, c.waitEnd = turn, deadline
		return c, Answer{}
	case v.Record.Key != "":
		rec := v.Record
		o.end(lk, turn, &rec, v.Kind == KindReplay, nil)
	default:
		o.end(lk, turn, nil, false, &v)
	}
	return claimed{waited: c.waited}, v
}

// claimOnce runs one ClaimTx, waiting at most lockWait for the key's row lock.
func (o *oneCommit) claimOnce(ctx context.Context, p idemdriver.ClaimParams, lockWait time.Duration) (claimed, Answer) {
	cfg := o.cfg
	// Bounded as a whole: database/sql ends a tx with the context it began on.
	txCtx, cancelTx := context.WithTimeout(context.WithoutCancel(ctx), cfg.ClaimTimeout+cfg.MaxExecution+cfg.CompleteTimeout)
	sent := time.Now()
	res, tx, err := o.claimTx(txCtx, cancelTx, p, lockWait)
	var v Answer
	switch {
	case errors.Is(err, idemdriver.ErrLockWait):
		v = o.inFlight()
	case err != nil:
		v = o.cfg.claimFailed(ctx, err)
	case !res.Claimed:
		v = o.cfg.decideStored(ctx, res.Record, p)
	default:
		return claimed{res: res, tx: tx, sent: sent, endTx: cancelTx}, Answer{}
	}
	cancelTx()
	return claimed{res: res}, v
}

// await makes this request the leader of a turn of its key (returned), or
// follows the leaders of the turns before it until one answers it; followed
// reports that it followed one.
func (o *oneCommit) await(ctx context.Context, lk localKey, p idemdriver.ClaimParams, wait time.Duration) (_ *leaderTurn, _ Answer, followed bool) {
	deadline := time.Now().Add(max(o.waitRunning, wait))
	for ; ; followed = true {
		o.mu.Lock()
		t := o.turns[lk]
		if t == nil {
			t = &leaderTurn{running: make(chan struct{}), done: make(chan struct{})}
			o.turns[lk] = t
			o.mu.Unlock()
			return t, Answer{}, followed
		}
		o.mu.Unlock()
		if !o.follow(ctx, t, deadline) {
			return nil, o.inFlight(), true
		}
		switch {
		case t.final != nil:
			rec := *t.final
			if rec.Response != nil {
				resp := *rec.Response
				resp.Header = http.Header(resp.Header).Clone() // each replay's own
				rec.Response = &resp
			}
			return nil, o.cfg.decide(ctx, rec, p, t.opened), true
		case t.shared != nil:
			return nil, *t.shared, true
		}
		// Rolled back, or its commit's outcome unknown: one of us leads.
	}
}

// follow waits for the end of t, led by another request of this process:
// unbounded while the leader claims (its claim is bounded by ClaimTimeout +
// OneCommitWait, or its wait), bounded by deadline once the key runs. It
// reports whether t ended before deadline or ctx's end.
func (o *oneCommit) follow(ctx context.Context, t *leaderTurn, deadline time.Time) bool {
	o.waits.follow(1)
	defer o.waits.follow(-1)
	select {
	case <-t.running:
		return o.waitTurnEnd(ctx, t, deadline)
	case <-t.done:
		return true
	case <-ctx.Done():
		return false
	}
}

// waitTurnEnd waits for the end of t, whose leader runs the key, until deadline
// or ctx's end, and reports whether t ended. A turn that has ended wins
// over a deadline that has passed too (select would pick either).
func (o *oneCommit) waitTurnEnd(ctx context.Context, t *leaderTurn, deadline time.Time) bool {
	select {
	case <-t.done:
		return true
	default:
	}
	left := time.NewTimer(time.Until(deadline))
	defer left.Stop()
	select {
	case <-t.done:
		return true
	case <-left.C:
	case <-ctx.Done():
	}
	select {
	case <-t.done:
		return true
	default:
		return false
	}
}

func (o *oneCommit) end(lk localKey, t *leaderTurn, final *idemdriver.Record, opened bool, shared *Answer) {
	o.mu.Lock()
	delete(o.turns, lk)
	o.mu.Unlock()
	t.final, t.opened, t.shared = final, opened, shared
	close(t.done)
}

func (o *oneCommit) inFlight() Answer {
	ra := o.cfg.inFlightRetryAfter(o.cfg.LeaseDuration)
	return Answer{Kind: KindInFlight, RetryAfter: ra, Err: &InFlightError{RetryAfter: ra}}
}

// The bound cancels txCtx only while ClaimTx runs: the returned tx lives on it.
func (o *oneCommit) claimTx(txCtx context.Context, cancelTx context.CancelFunc, p idemdriver.ClaimParams, lockWait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	cfg := o.cfg
	bound := cfg.ClaimTimeout + lockWait
	timer := time.AfterFunc(bound, cancelTx)
	res, tx, err := o.tc.ClaimTx(txCtx, p, lockWait)
	if timer.Stop() {
		return res, tx, err
	}
	if tx != nil { // returned as the bound ran out: on a cancelled context
		rctx, cancel := context.WithTimeout(context.WithoutCancel(txCtx), cfg.CompleteTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}
	return idemdriver.ClaimResult{}, nil, fmt.Errorf("idem: the one-commit claim had no answer within ClaimTimeout + its lock wait (%s): %w", bound, context.DeadlineExceeded)
}

func (o *oneCommit) start(e *Execution, _ time.Time) func() bool {
	limit := time.AfterFunc(o.cfg.MaxExecution, func() { e.cancel(ErrExecutionTimeout) })
	return func() bool {
		limit.Stop()
		return false
	}
}

// fail: the rollback left nothing of e. On a multi-master cluster (Galera)
// another node's claim of the key may have committed while e ran and
// aborted e's transaction, so that the handler's statement failed (1213)
// and it answered its error. A committed record that a claim would not
// take (the key's outcome, or a live owner), read again causally where the
// driver makes it so (idemmysql: wsrep_sync_wait), means e lost the key:
// false, answered 409 (its retry gets that outcome) instead of the
// handler's failure. With none, or no answer from the store, the handler's
// answer stands.
func (o *oneCommit) fail(e *Execution) (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	rec, err := o.cfg.Store.Get(ctx, idemdriver.GetParams{Scope: e.p.Scope, Key: e.p.Key, ClockOffset: e.p.ClockOffset})
	return err != nil || idemdriver.Decide(&rec, false, e.p).Claims(), nil
}

// release removes the record the rollback restored (a re-claimed FAILED).
func (o *oneCommit) release(e *Execution) (bool, error) {
	if e.fence.FencingToken <= 1 {
		return true, nil
	}
	ctx, cancel := e.detached()
	defer cancel()
	res, err := o.cfg.Store.Claim(ctx, e.p)
	if err != nil {
		return false, &StoreError{Op: "release", Err: err}
	}
	if !res.Claimed {
		return true, nil // another request owns the key now: nothing of ours is left
	}
	f := idemdriver.FenceParams{Scope: e.p.Scope, Key: e.p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt, Notify: e.fence.Notify}
	if ok, err := o.cfg.Store.Release(ctx, f); err != nil || !ok {
		return false, &StoreError{Op: "release", Err: fmt.Errorf("release after rollback: %v", err)}
	}
	return true, nil
}

func (o *oneCommit) recordWithoutTx(e *Execution, resp idemdriver.Response) (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	res, err := o.cfg.Store.Claim(ctx, e.p)
	if err == nil && !res.Claimed {
		err = errors.New("idem: the key was claimed by another request meanwhile")
	}
	if err != nil {
		return false, &StoreError{Op: "complete", Err: err}
	}
	// The claim's transaction rolled back its record: this claim may start
	// another life of the key, which the seal binds.
	cp, err := o.cfg.completion(idemdriver.FenceParams{Scope: e.p.Scope, Key: e.p.Key, FencingToken: res.Record.FencingToken,
		CreatedAt: res.Record.CreatedAt, Notify: e.fence.Notify}, resp)
	if err != nil {
		return false, err
	}
	return e.completeWithoutTx(cp)
}

func (o *oneCommit) completionFailed(e *Execution, err error) Answer {
	switch {
	case errors.Is(err, idemdriver.ErrConflict):
		return o.lost(e, err)
	case isCommitError(err):
		return Answer{Kind: KindCommitFailed, Err: err}
	}
	return Answer{Kind: KindCompletionNotRecorded, Err: err}
}

// lost answers e, whose transaction the database aborted in a conflict at
// its completion or COMMIT: nothing of it committed. On a multi-master
// cluster (Galera) that is most often another node's claim of the key,
// committed first: each node's claim is an uncommitted row the others do
// not see. The key is read again (a causal read: idemmysql sets
// wsrep_sync_wait) and answered as a claim that found that record would be
// (a replay, 422, 409 or the request's wait for its owner); with none, 409
// and the retry runs again.
func (o *oneCommit) lost(e *Execution, err error) Answer {
	lost := Answer{Kind: KindLeaseLost, Err: fmt.Errorf("%w: %w", ErrLeaseLost, err)}
	_, v := o.waits.await(e.parent, e.p, time.Until(e.c.waitEnd), lost, func() (claimed, Answer) { return claimed{}, lost })
	if v.Kind != KindClaimFailed && v.Kind != KindLeaseLost {
		v.Err = errors.Join(v.Err, lost.Err) // the event's cause
	}
	return v
}

func (o *oneCommit) endRun(e *Execution) {
	var final *idemdriver.Record
	if e.committed != nil {
		rec := e.c.res.Record
		rec.State, rec.Response, rec.LeaseLeft, rec.LockedUntil = idemdriver.StateSucceeded, e.committed, 0, nil
		final = &rec
	}
	o.end(localKey{e.p.Scope, e.p.Key}, e.c.turn, final, true, nil)
	e.c.endTx()
}
