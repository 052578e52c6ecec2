package idem

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// Engine runs the claim protocol of docs/contract.md (CONTRACT sections 3
// to 6): claim, run under the claim, record the outcome. Middleware is its
// HTTP front; Do runs it for message consumers, webhooks and jobs.
type Engine struct {
	cfg  EngineConfig
	mode mode
}

// NewEngine validates cfg (after WithDefaults) and returns the engine. The
// error names every invalid field.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	cfg = cfg.WithDefaults()
	if err := invalid(cfg.validate()); err != nil {
		return nil, err
	}
	return newEngine(cfg), nil
}

func newEngine(cfg EngineConfig) *Engine {
	g := &Engine{cfg: cfg}
	if cfg.OneCommit {
		g.mode = newOneCommit(&g.cfg)
	} else {
		g.mode = durable{g}
	}
	return g
}

// execute is the protocol, for both fronts and both modes: it claims p's
// key, runs j when the claim is won and records its outcome, and returns
// the one verdict the front answers. It fills ev except Status and Route.
// When j panics, the outcome is recorded, ev reported, and the panic
// raised again.
func (g *Engine) execute(ctx context.Context, p idemdriver.ClaimParams, j job, ev *Event) verdict {
	ev.Method, ev.Scope, ev.Key = p.Method, p.Scope, p.Key
	start := time.Now()
	c, v := g.mode.claim(ctx, p)
	ev.Claim = time.Since(start)
	ev.Attempt = max(c.res.Record.Attempts, v.rec.Attempts)
	if v.kind != 0 {
		ev.Kind = v.event()
		if v.kind == answerClaimFailed {
			ev.Err = v.err
		}
		return v
	}
	e := newExecution(&g.cfg, ctx, c, p)
	defer e.cancel(nil)
	defer g.mode.finish(e)
	stop := g.mode.start(e, c.sent)
	ran := time.Now()
	status, failed, panicked, recovered := e.runJob(j)
	ev.Handler = time.Since(ran)
	leaseRanOut := stop()

	recording := time.Now()
	executed := EventExecuted
	if c.res.TookOver {
		executed = EventTakenOver
	}
	end := func(kind EventKind, v verdict) verdict {
		ev.Completion = time.Since(recording)
		ev.Kind, ev.Err = kind, v.err
		v.status, v.rec = status, c.res.Record
		return v
	}
	outcome := g.cfg.Outcome(cmp0(status))
	switch {
	case e.released():
		outcome = Released
	case failed || panicked:
		outcome = Failed
	}
	cause := context.Cause(e.ctx)
	lost, unreachable := errors.Is(cause, ErrLeaseLost), errors.Is(cause, ErrStoreUnavailable)
	// Past MaxExecution, a handler that used the claim's transaction may
	// have lost its writes (database/sql ends a transaction with its
	// context), and one that returned after its lease ran out may see its
	// record expire unreplayed: both are recorded FAILED.
	timedOut := errors.Is(cause, ErrExecutionTimeout) && (e.txBegun() || leaseRanOut)
	switch {
	case lost:
		e.rollback()
		v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: cause})
	case unreachable:
		// The record stays PROCESSING until its lease runs out.
		e.rollback()
		v = end(EventStoreUnavailable, verdict{kind: answerUnreachable, err: cause})
	case timedOut || outcome == Failed:
		e.rollback()
		if owned, err := g.mode.fail(e); !owned && err == nil {
			v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
			break
		}
		ev.Outcome = Failed
		switch {
		case timedOut:
			v = end(executed, verdict{kind: answerTimedOut, err: cause})
		case failed:
			v = end(executed, verdict{kind: answerRan, err: errFnFailed})
		default:
			v = end(executed, verdict{kind: answerRan})
		}
	case outcome == Released:
		ev.Outcome = Released
		e.rollback()
		owned, err := g.mode.release(e)
		switch {
		case err != nil:
			// The key stays burned for a corrected request: marked FAILED,
			// if the store answers, so the same request runs again at once.
			_, _ = g.mode.fail(e)
			v = end(EventCompletionFailed, verdict{kind: answerReleaseFailed, err: err})
		case !owned:
			v = end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
		default:
			v = end(EventReleased, verdict{kind: answerReleased})
		}
	default:
		v = g.complete(e, j.response(), executed, end)
		if v.kind == answerTxAborted {
			ev.Outcome = Failed
		}
	}
	if panicked {
		ev.Status = 0
		g.observe(ctx, ev)
		panic(recovered)
	}
	return v
}

// complete records the Succeeded outcome resp, in the business transaction
// when there is one (committing both together).
func (g *Engine) complete(e *execution, resp idemdriver.Response, executed EventKind, end func(EventKind, verdict) verdict) verdict {
	cp := idemdriver.CompleteParams{FenceParams: e.fence, Response: resp}
	tx := e.endTx()
	var ok bool
	var err error
	if tx == nil {
		ok, err = e.completeAlone(cp)
	} else {
		ok, err = e.completeIn(tx, cp)
	}
	switch {
	case errors.Is(err, idemdriver.ErrTxDone):
		// The handler ended the claim's transaction itself, against the
		// contract: its writes are committed or gone; record on its own.
		g.cfg.Logger.ErrorContext(e.parent, "idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", e.fence.Scope, "key", e.fence.Key)
		ok, err = e.completeAlone(cp)
	case errors.Is(err, idemdriver.ErrTxAborted):
		_ = e.rollbackTx(tx)
		if resp.Status >= 200 && resp.Status < 300 {
			g.cfg.Logger.ErrorContext(e.parent, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
				"its writes are gone: answer an error when a statement fails", "scope", e.fence.Scope, "key", e.fence.Key, "status", resp.Status)
			if owned, ferr := g.mode.fail(e); !owned && ferr == nil {
				return end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
			}
			return end(executed, verdict{kind: answerTxAborted, err: ErrTxAborted})
		}
		ok, err = g.mode.recordAlone(e, cp)
	}
	switch {
	case err != nil:
		if tx != nil && !isCommitError(err) {
			_ = e.rollbackTx(tx)
		}
		v := g.mode.notCompleted(e, err)
		if v.kind == answerLeaseLost {
			return end(EventLeaseLost, v)
		}
		return end(EventCompletionFailed, v)
	case !ok:
		if tx != nil {
			_ = e.rollbackTx(tx)
		}
		g.cfg.Logger.WarnContext(e.parent, "idem: completion fenced out", "scope", e.fence.Scope, "key", e.fence.Key, "fencing_token", e.fence.FencingToken)
		return end(EventLeaseLost, verdict{kind: answerLeaseLost, err: ErrLeaseLost})
	}
	e.committed = &resp
	return end(executed, verdict{kind: answerRan})
}

// observe sends e to the configured Observer, if any.
func (g *Engine) observe(ctx context.Context, e *Event) {
	if g.cfg.Observer != nil {
		g.cfg.Observer.Observe(ctx, *e)
	}
}

// DoParams name one execution of Do.
type DoParams struct {
	// Scope names who owns the key (a tenant, a stream, a queue): valid
	// UTF-8, at most MaxScopeLength bytes, no NUL. Required.
	Scope string
	// Key names the operation (a message id, an event id): 1 to
	// MaxKeyLength visible ASCII characters. Required.
	Key string
	// Method and Route name the operation (the record's method and path;
	// Event.Method and Event.Route): a retry naming others gets
	// ErrKeyReused. Default Method: "DO"; Route: "", at most MaxPathLength
	// bytes.
	Method, Route string
	// Fingerprint is the payload's 32-byte SHA-256; nil: the SHA-256 of
	// Payload. A retry whose fingerprint differs gets ErrKeyReused.
	Fingerprint []byte
	Payload     []byte
}

// Result is what an execution of Do answers, recorded and replayed
// byte-exact. Status 0 counts as 200 for Config.Outcome and is replayed as
// 0; Header is stored whole.
type Result struct {
	Status int
	Header map[string][]string
	Body   []byte
}

// InFlightError is Do's error for an operation another execution owns:
// errors.Is(err, ErrInFlight). RetryAfter is the delay before trying again
// (EngineConfig.InFlightRetryAfter, bounded as for HTTP).
type InFlightError struct {
	RetryAfter time.Duration
}

func (e *InFlightError) Error() string {
	return fmt.Sprintf("idem: another execution with this key is in flight; retry after %s", e.RetryAfter)
}

// Is reports true for ErrInFlight.
func (e *InFlightError) Is(target error) bool { return target == ErrInFlight }

// ErrReleased is returned by Do, with fn's Result, when the execution was
// released (ReleaseKey, or the Released outcome): nothing was recorded.
var ErrReleased = errors.New("idem: the execution was released; nothing was recorded")

// errFnFailed marks the verdict of a Do whose fn returned an error.
var errFnFailed = errors.New("idem: fn failed")

// Do runs fn at most once to a recorded outcome for (p.Scope, p.Key): the
// protocol of the HTTP front without net/http, in either mode (CONTRACT
// sections 3 to 6).
//
// The first call claims the key and runs fn on a context detached from
// ctx, cancelled when the lease is lost (context.Cause: ErrLeaseLost); Tx,
// ReleaseKey, RelayKey and ExecutionFromContext work in fn as in a handler.
// The Result is recorded as Config.Outcome says for its status; an error
// from fn is recorded Failed, whatever Outcome says, and returned as is
// (the next call runs fn again). A later call returns the stored Result
// without running fn.
//
// Errors, for errors.Is: ErrInvalidKey, ErrMissingScope, ErrPathTooLong
// and ErrScopeUnstorable (bad DoParams); ErrInFlight (*InFlightError);
// ErrKeyReused; ErrStoreUnavailable (*StoreError: fn did not run, or its
// outcome may not be recorded); ErrLeaseLost; ErrExecutionTimeout;
// ErrTxAborted; ErrReleased (with fn's Result); ErrResponseNotStored;
// ErrResponseMissing; or fn's own error. When fn panics, the outcome is
// recorded Failed and the panic raised again.
func (g *Engine) Do(ctx context.Context, p DoParams, fn func(ctx context.Context) (Result, error)) (Result, error) {
	cp, err := g.doParams(p)
	if err != nil {
		return Result{}, err
	}
	ev := Event{Route: cp.Path}
	j := &doJob{g: g, fn: fn}
	v := g.execute(ctx, cp, j, &ev)
	out, err := v.result(j)
	ev.Status = out.Status
	g.observe(ctx, &ev)
	switch {
	case errors.Is(err, errFnFailed):
		return out, j.err
	case j.err != nil:
		return out, errors.Join(err, j.err)
	}
	return out, err
}

// result is Do's answer for v: the answer table's error (v.err), or a
// Result.
func (v verdict) result(j *doJob) (Result, error) {
	switch v.kind {
	case answerRan:
		return j.out, v.err
	case answerReleased:
		return j.out, ErrReleased
	case answerReplay:
		resp := v.rec.Response
		out := Result{Status: resp.Status, Header: resp.Header}
		if !resp.BodyStored {
			return out, fmt.Errorf("%w: its %d-byte result exceeded MaxResponseBytes", ErrResponseNotStored, resp.BodySize)
		}
		out.Body = resp.Body
		return out, nil
	case answerLeaseLost:
		return Result{}, fmt.Errorf("%w: the outcome was not recorded", ErrLeaseLost)
	case answerTimedOut:
		return Result{}, fmt.Errorf("idem: the execution ran past MaxExecution and was recorded FAILED: %w", ErrExecutionTimeout)
	case answerTxAborted:
		return Result{}, ErrTxAborted
	}
	return Result{}, v.err
}

// doJob runs Do's fn.
type doJob struct {
	g   *Engine
	fn  func(ctx context.Context) (Result, error)
	out Result
	err error
}

func (j *doJob) run(ctx context.Context) (int, bool) {
	j.out, j.err = j.fn(ctx)
	if j.err != nil {
		return http.StatusInternalServerError, true
	}
	return j.out.Status, false
}

func (j *doJob) response() idemdriver.Response {
	resp := idemdriver.Response{Status: j.out.Status, Header: map[string][]string{}, BodySize: int64(len(j.out.Body))}
	for k, v := range j.out.Header {
		resp.Header[k] = append([]string(nil), v...)
	}
	if resp.BodySize <= j.g.cfg.MaxResponseBytes {
		resp.Body, resp.BodyStored = j.out.Body, true
	}
	return resp
}

// cmp0 is status, or 200 when it is 0.
func cmp0(status int) int {
	if status == 0 {
		return http.StatusOK
	}
	return status
}

// doParams checks p and turns it into the claim's parameters.
func (g *Engine) doParams(p DoParams) (idemdriver.ClaimParams, error) {
	if _, err := ParseKey([]string{p.Key}); err != nil || p.Key == "" || p.Key[0] == '"' {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: a key is 1 to %d visible ASCII characters", ErrInvalidKey, MaxKeyLength)
	}
	if p.Scope == "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: DoParams.Scope is required", ErrMissingScope)
	}
	if why := unstorableScope(p.Scope); why != "" {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: the scope is %s", ErrScopeUnstorable, why)
	}
	if len(p.Route) > MaxPathLength {
		return idemdriver.ClaimParams{}, fmt.Errorf("%w: DoParams.Route is longer than %d bytes", ErrPathTooLong, MaxPathLength)
	}
	fp := p.Fingerprint
	if fp == nil {
		sum := sha256.Sum256(p.Payload)
		fp = sum[:]
	} else if len(fp) != sha256.Size {
		return idemdriver.ClaimParams{}, fmt.Errorf("idem: DoParams.Fingerprint is %d bytes; it must be a %d-byte SHA-256", len(fp), sha256.Size)
	}
	method := p.Method
	if method == "" {
		method = "DO"
	}
	return g.claimParams(p.Scope, p.Key, method, p.Route, fp), nil
}

// claimParams are the claim's parameters for one request.
func (g *Engine) claimParams(scope, key, method, path string, fp []byte) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: scope, Key: key, Method: method, Path: path, Fingerprint: fp,
		LeaseDuration: g.cfg.LeaseDuration, Retention: g.cfg.Retention, Owner: g.cfg.Owner}
}

// mode is how a claim and the outcomes that are not the completion reach
// the store: the one place the two modes differ (docs/contract.md section
// 6). durable is the default; oneCommit is Config.OneCommit.
type mode interface {
	// claim decides p's key: a won claim, or the verdict to answer (kind
	// not 0).
	claim(ctx context.Context, p idemdriver.ClaimParams) (claimed, verdict)
	// start holds the claim while the work runs (the lease's heartbeat, or
	// the time limit); stop ends that and reports whether the lease may
	// have run out.
	start(e *execution, sent time.Time) (stop func() bool)
	// fail records the Failed outcome once the business transaction is
	// rolled back: owned is false when another claim fenced this one out.
	fail(e *execution) (owned bool, err error)
	// release removes the execution's record (the Released outcome).
	release(e *execution) (owned bool, err error)
	// recordAlone records cp outside the business transaction, which
	// aborted (a 4xx or a 3xx answered in it is still replayed).
	recordAlone(e *execution, cp idemdriver.CompleteParams) (bool, error)
	// notCompleted is the verdict after the completion or its COMMIT
	// failed with err.
	notCompleted(e *execution, err error) verdict
	// finish ends the execution, once its outcome is recorded (or not).
	finish(e *execution)
}

// durable is the default mode: the claim commits on its own before the
// work runs, held by a lease the heartbeat renews (CONTRACT section 4).
type durable struct{ g *Engine }

func (d durable) claim(ctx context.Context, p idemdriver.ClaimParams) (claimed, verdict) {
	// Detached from the caller: a hang-up must not cancel a claim the
	// database may have committed (PROCESSING, with nobody running it).
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), d.g.cfg.ClaimTimeout)
	defer cancel()
	sent := time.Now()
	res, err := d.g.cfg.Store.Claim(cctx, p)
	switch {
	case err != nil:
		return claimed{}, d.g.cfg.claimFailed(ctx, err)
	case !res.Claimed:
		return claimed{res: res}, d.g.cfg.answerFrom(ctx, res.Record, p)
	}
	return claimed{res: res, sent: sent}, verdict{}
}

func (durable) start(e *execution, sent time.Time) func() bool {
	hb := e.startHeartbeat(sent)
	return func() bool {
		hb.stop()
		return hb.leaseRanOut()
	}
}

func (durable) fail(e *execution) (bool, error) { return e.storeFail() }

func (d durable) release(e *execution) (bool, error) {
	ctx, cancel := e.detached()
	defer cancel()
	owned, err := d.g.cfg.Store.Release(ctx, e.fence)
	if err != nil {
		return false, &StoreError{Op: "release", Err: err}
	}
	return owned, nil
}

func (durable) recordAlone(e *execution, cp idemdriver.CompleteParams) (bool, error) {
	return e.completeAlone(cp)
}

func (durable) notCompleted(e *execution, err error) verdict {
	// Fail is fenced on PROCESSING under this token and waits for the row
	// lock of a COMMIT still in flight: it marks FAILED only when the
	// outcome did not commit, so the retry runs at once.
	owned, ferr := e.storeFail()
	switch {
	case !owned && e.takenOver():
		// Another request took the key over (on Galera, a certification
		// failure against a takeover on another node).
		return verdict{kind: answerLeaseLost, err: ErrLeaseLost}
	case ferr != nil:
		return verdict{kind: answerCompletionUnknown, err: err}
	case owned:
		return verdict{kind: answerCompletionNotRecorded, err: err}
	}
	return verdict{kind: answerCompletionMovedOn, err: err}
}

func (durable) finish(*execution) {}
