package protocol

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// Engine runs the claim protocol of CONTRACT sections 3 to 6: claim, run
// under the claim, record; both modes; the wait; the answer from a record.
// Its fronts (the root package's Middleware and Do) read requests and
// write answers.
type Engine struct {
	cfg   Config
	mode  mode
	waits *waitHub
	// renewer renews the leases of the executions in flight together; nil
	// when the store has no idemdriver.Renewer.
	renewer *renewer
	// inFlight counts the executions between admit and leave (MaxInFlight).
	inFlight atomic.Int64
	replays  *replayCache // nil without Config.ReplayCacheBytes
}

// New returns the engine of cfg, which its front validated and defaulted.
func New(cfg Config) *Engine {
	eng := &Engine{cfg: cfg}
	eng.waits = newWaitHub(&eng.cfg)
	eng.renewer = newRenewer(&eng.cfg)
	if cfg.ReplayCacheBytes > 0 {
		eng.replays = newReplayCache(cfg.ReplayCacheBytes, cfg.ReplayCacheTTL)
	}
	if cfg.OneCommit {
		eng.mode = newOneCommit(&eng.cfg, eng.waits)
	} else {
		eng.mode = durableClaim{eng}
	}
	return eng
}

// Run claims p's key (the stored one; clientKey is the client's), waiting
// up to wait for an execution in flight, runs j under a won claim and
// records the outcome. A replay or 422 the replay cache holds is answered
// from there (Cached), before MaxInFlight counts the request. A panic in j
// is recovered, its outcome recorded Failed, and reported in the Answer
// (Panic) for the front to answer or raise again once it has observed it.
func (eng *Engine) Run(ctx context.Context, p idemdriver.ClaimParams, clientKey string, wait time.Duration, j Job) Answer {
	if rec, opened, ok := eng.replays.get(p.Scope, p.Key); ok {
		v := eng.cfg.decide(ctx, rec, p, opened)
		v.Cached = true
		return v
	}
	v := eng.run(ctx, p, clientKey, wait, j)
	switch v.Kind { // a replay's response is opened; a 422's needs none
	case KindReplay:
		eng.replays.put(p.Scope, p.Key, v.Record, true)
	case KindKeyReused:
		eng.replays.put(p.Scope, p.Key, v.Record, false)
	}
	return v
}

func (eng *Engine) run(ctx context.Context, p idemdriver.ClaimParams, clientKey string, wait time.Duration, j Job) Answer {
	if !eng.admit() {
		return Answer{Kind: KindOverloaded, Err: ErrOverloaded}
	}
	defer eng.leave()
	start := time.Now()
	c, v := eng.mode.claim(ctx, p, wait)
	claim := time.Since(start)
	attempt := max(c.res.Record.Attempts, v.Record.Attempts)
	if v.Kind != 0 {
		v.Waited, v.Attempt, v.Claim = c.waited, attempt, claim
		return v
	}
	e := newExecution(&eng.cfg, ctx, c, p, clientKey)
	e.redrive = j.Redrive
	if e.fence.Notify != "" {
		defer eng.waits.wake(e.fence.Notify) // this process's waiters, at once
	}
	defer e.cancel(nil)
	defer eng.mode.endRun(e)
	stop := eng.mode.start(e, c.sent)
	ran := time.Now()
	status, over, pan := e.runJob(j)
	handler := time.Since(ran)
	leaseRanOut := stop()

	recording := time.Now()
	v = eng.record(e, j, status, over, pan != nil, leaseRanOut)
	v.Ran, v.TookOver, v.Waited, v.Attempt, v.Status = true, c.res.TookOver, c.waited, attempt, status
	v.Claim, v.Handler, v.Completion = claim, handler, time.Since(recording)
	if v.Record.Key == "" { // else the record a lost COMMIT was answered from
		v.Record = c.res.Record
	}
	v.Panic = pan
	return v
}

// record ends e, whose job answered status (over: what overrides the
// policy), by its outcome: recorded, failed, released, or lost.
func (eng *Engine) record(e *Execution, j Job, status int, over Override, panicked, leaseRanOut bool) Answer {
	failed := over == OverrideFailed
	outcome := eng.cfg.Outcome(OrOK(status))
	switch {
	case e.released():
		outcome = Released
	case failed || panicked || e.stepHeld():
		outcome = Failed
	case over == OverrideSucceeded:
		outcome = Succeeded
	}
	if err := e.outcomeUnknown(); err != nil {
		// The record is UNKNOWN: nothing of this run is recorded, whatever
		// its job answered (docs/contract.md section 11.3).
		e.rollback()
		rec := e.c.res.Record
		rec.State, rec.LockedUntil, rec.LeaseLeft, rec.ExpiresAt = idemdriver.StateUnknown, nil, 0, idemdriver.FarFuture
		return Answer{Kind: KindOutcomeUnknown, Record: rec, Err: err}
	}
	cause := context.Cause(e.ctx)
	lost, unreachable := errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrStoreUnavailable)
	// Past MaxExecution a used transaction may be gone (database/sql ends it
	// with its context) and a late outcome may expire unreplayed.
	timedOut := errors.Is(cause, ErrExecutionTimeout) && (e.txBegun() || leaseRanOut)
	switch {
	case lost:
		e.rollback()
		return Answer{Kind: KindLeaseLost, Err: cause}
	case unreachable:
		e.rollback()
		return Answer{Kind: KindUnreachable, Err: cause}
	case timedOut || outcome == Failed:
		e.rollback()
		if owned, err := eng.mode.fail(e); !owned && err == nil {
			return Answer{Kind: KindLeaseLost, Err: ErrLeaseLost}
		}
		switch {
		case timedOut:
			return Answer{Kind: KindTimedOut, Err: cause, Outcome: Failed}
		case failed:
			return Answer{Kind: KindRan, Err: ErrFnFailed, Outcome: Failed}
		case e.stepHeld() && !panicked:
			return Answer{Kind: KindStepHeld, Err: ErrStepUnreconciled, Outcome: Failed}
		}
		return Answer{Kind: KindRan, Outcome: Failed}
	case outcome == Released:
		e.rollback()
		owned, err := eng.mode.release(e)
		switch {
		case err != nil:
			// Mark FAILED so the same request runs again at once.
			_, _ = eng.mode.fail(e)
			return Answer{Kind: KindReleaseFailed, Err: err, Outcome: Released}
		case !owned:
			return Answer{Kind: KindLeaseLost, Err: ErrLeaseLost, Outcome: Released}
		}
		return Answer{Kind: KindReleased, Outcome: Released}
	}
	resp := j.Response()
	if n := eng.cfg.KeepRequestBytes; n > 0 {
		resp.Request = seal.EncodeRequest(j.Kept(n))
	}
	return eng.complete(e, resp)
}

// admit counts one more execution in flight, or reports false, counting
// nothing, when MaxInFlight are in flight already: the request is then
// refused before it claims (KindOverloaded).
func (eng *Engine) admit() bool {
	if eng.cfg.MaxInFlight <= 0 {
		return true
	}
	if eng.inFlight.Add(1) > int64(eng.cfg.MaxInFlight) {
		eng.inFlight.Add(-1)
		return false
	}
	return true
}

// leave ends an execution admit counted.
func (eng *Engine) leave() {
	if eng.cfg.MaxInFlight > 0 {
		eng.inFlight.Add(-1)
	}
}

// complete records resp, plain, sealed when the keyring seals.
func (eng *Engine) complete(e *Execution, resp idemdriver.Response) Answer {
	cp, err := eng.cfg.completion(e.fence, resp)
	if err != nil {
		e.rollback()
		_, _ = eng.mode.fail(e)
		return Answer{Kind: KindCompletionNotRecorded, Err: err}
	}
	tx := e.endTx()
	var ok bool
	if tx == nil {
		ok, err = e.completeWithoutTx(cp)
	} else {
		ok, err = e.completeIn(tx, cp)
	}
	switch {
	case errors.Is(err, idemdriver.ErrTxDone):
		eng.cfg.Logger.ErrorContext(e.parent, "idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", e.fence.Scope, "key", e.fence.Key)
		ok, err = e.completeWithoutTx(cp)
	case errors.Is(err, idemdriver.ErrTxAborted):
		_ = e.rollbackTx(tx)
		if resp.Status >= 200 && resp.Status < 300 {
			eng.cfg.Logger.ErrorContext(e.parent, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
				"its writes are gone: answer an error when a statement fails", "scope", e.fence.Scope, "key", e.fence.Key, "status", resp.Status)
			if owned, ferr := eng.mode.fail(e); !owned && ferr == nil {
				return Answer{Kind: KindLeaseLost, Err: ErrLeaseLost}
			}
			return Answer{Kind: KindTxAborted, Err: ErrTxAborted, Outcome: Failed}
		}
		ok, err = eng.mode.recordWithoutTx(e, resp)
	}
	switch {
	case err != nil:
		if tx != nil && !isCommitError(err) {
			_ = e.rollbackTx(tx)
		}
		return eng.mode.completionFailed(e, err)
	case !ok:
		if tx != nil {
			_ = e.rollbackTx(tx)
		}
		eng.cfg.Logger.WarnContext(e.parent, "idem: completion fenced out", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		return Answer{Kind: KindLeaseLost, Err: ErrLeaseLost}
	}
	resp.Request = nil // the committed outcome's waiters replay it: no request
	e.committed = &resp
	return Answer{Kind: KindRan}
}

// OrOK is status, or 200 for 0 (a handler that wrote nothing).
func OrOK(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

// mode is where the durable-claim mode (durableClaim) and the one-commit
// mode (oneCommit) differ (CONTRACT section 6).
type mode interface {
	// claim waits up to wait for an execution of p's key in flight.
	claim(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (claimed, Answer)
	// start keeps e's claim while it runs (the lease's renewal, or the
	// time limit); stop ends that and reports whether the lease may have
	// run out.
	start(e *Execution, sent time.Time) (stop func() bool)
	fail(e *Execution) (owned bool, err error)
	release(e *Execution) (owned bool, err error)
	// recordWithoutTx records resp, plain, outside the claim's transaction,
	// which aborted: sealed for the record it writes.
	recordWithoutTx(e *Execution, resp idemdriver.Response) (bool, error)
	completionFailed(e *Execution, err error) Answer
	// endRun ends what the mode holds for e's run, after its outcome:
	// in one-commit mode the key's turn in this process and the
	// transaction's context.
	endRun(e *Execution)
}

type durableClaim struct{ eng *Engine }

func (d durableClaim) claim(ctx context.Context, p idemdriver.ClaimParams, wait time.Duration) (claimed, Answer) {
	c, v := d.claimOnce(ctx, p)
	if v.Kind != KindInFlight || wait <= 0 {
		return c, v
	}
	return d.eng.waits.await(ctx, p, wait, v, func() (claimed, Answer) { return d.claimOnce(ctx, p) })
}

func (d durableClaim) claimOnce(ctx context.Context, p idemdriver.ClaimParams) (claimed, Answer) {
	// Detached: a hang-up must not cancel a claim the database may commit.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.eng.cfg.ClaimTimeout)
	defer cancel()
	sent := time.Now()
	res, err := d.eng.cfg.Store.Claim(cctx, p)
	switch {
	case err != nil:
		return claimed{}, d.eng.cfg.claimFailed(ctx, err)
	case !res.Claimed:
		return claimed{res: res}, d.eng.cfg.decideStored(ctx, res.Record, p)
	}
	return claimed{res: res, sent: sent}, Answer{}
}

func (d durableClaim) start(e *Execution, sent time.Time) func() bool {
	hb := e.startHeartbeat(sent, d.eng.renewer)
	return func() bool {
		hb.stop()
		return hb.leaseRanOut()
	}
}

func (durableClaim) fail(e *Execution) (bool, error) { return e.storeFail() }

func (d durableClaim) release(e *Execution) (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := d.eng.cfg.Store.Release(ctx, e.fence)
	if err != nil {
		return false, &StoreError{Op: "release", Err: err}
	}
	return owned, nil
}

func (d durableClaim) recordWithoutTx(e *Execution, resp idemdriver.Response) (bool, error) {
	cp, err := d.eng.cfg.completion(e.fence, resp)
	if err != nil {
		return false, err
	}
	return e.completeWithoutTx(cp)
}

func (durableClaim) completionFailed(e *Execution, err error) Answer {
	// Fail waits for an in-flight COMMIT's row lock: it marks FAILED only if
	// the outcome did not commit.
	owned, ferr := e.storeFail()
	switch {
	case !owned && e.takenOver():
		// On Galera, a certification failure against another node's takeover.
		return Answer{Kind: KindLeaseLost, Err: ErrLeaseLost}
	case ferr != nil:
		return Answer{Kind: KindCompletionUnknown, Err: err}
	case owned:
		return Answer{Kind: KindCompletionNotRecorded, Err: err}
	}
	return Answer{Kind: KindCompletionMovedOn, Err: err}
}

func (durableClaim) endRun(*Execution) {}
