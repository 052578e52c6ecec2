package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// The one-commit mode (Config.OneCommit; docs/contract.md "Modes"): the
// claim runs in the business transaction (idemdriver.TxClaimer), the
// handler writes in it, and the completion commits with both. Nothing is
// visible before that COMMIT, so there is no lease to renew and nothing to
// clean up after a crash: a rollback is the FAILED outcome.

// validateOneCommit checks the one-commit fields of c.
func (c Config) validateOneCommit() []error {
	var errs []error
	if c.OneCommitWait < 0 {
		errs = append(errs, errors.New("OneCommitWait must not be negative"))
	}
	if _, ok := c.Store.(idemdriver.TxClaimer); c.OneCommit && c.Store != nil && !ok {
		errs = append(errs, fmt.Errorf("OneCommit needs a Store that implements idemdriver.TxClaimer; %T does not", c.Store))
	}
	return errs
}

// serveOneCommit serves a protected request in the one-commit mode, from
// the claim on (serve has parsed the key, the scope and the body). It
// reports one Event, as serve and execute do.
//
// A request waiting on the key's row lock holds a connection of the
// store's pool. So that a storm of duplicates of one key cannot take every
// connection (and stall every other key's requests), the requests of one
// key in this process go to the store one wave at a time (a keyTurn): the
// first claims (the leader), the others wait here, holding no connection,
// for at most OneCommitWait, then get 409. When the leader's claim answers
// without claiming (a replay, 422, 409), the waiters claim at once,
// concurrently: the committed record answers them. When the leader ran the
// key, its turn ends with its transaction (before its response is sent,
// which a slow client may take long to read), and one waiter leads the
// next wave: the replay, or the claim after a rollback. On a single-writer
// store (SQLite), where every transaction waits for the database's write
// lock anyway, the wait here is bounded by the leader's own transaction
// instead of OneCommitWait.
func (m *Middleware) serveOneCommit(w http.ResponseWriter, r *http.Request, next http.Handler, p idemdriver.ClaimParams, body []byte) {
	ctx := r.Context()
	waitStart := time.Now()
	lk := localKey{scope: p.Scope, key: p.Key}
	turn, ok := m.awaitTurn(ctx, lk, waitStart.Add(m.turnWait))
	if !ok {
		ev := Event{Method: r.Method, Scope: p.Scope, Key: p.Key, Claim: time.Since(waitStart), Kind: EventInFlight}
		ev.Status = m.oneCommitInFlight(w, r)
		ev.Route = m.route(r, nil)
		m.observe(ctx, &ev)
		return
	}
	if turn != nil {
		// A no-op once the turn has ended (below, or at the first write);
		// here for a handler that panics.
		defer m.endTurn(lk, turn, false)
	}

	// Detached from the client, like the durable claim; bounded as a whole
	// (database/sql ends a transaction when the context it began on ends).
	txCtx, cancelTx := context.WithTimeout(context.WithoutCancel(ctx),
		m.cfg.ClaimTimeout+m.cfg.MaxExecution+m.cfg.CompleteTimeout)
	defer cancelTx()
	// The whole OneCommitWait, whatever was waited in the process: on
	// PostgreSQL it is the transaction's lock_timeout, the handler's too.
	res, tx, err := m.claimTx(txCtx, cancelTx, p, m.cfg.OneCommitWait)
	if turn != nil && (err != nil || !res.Claimed) {
		// Answered without claiming: the waiters go now, not once this
		// request's client has read its answer. They claim at once when
		// the record answered (settled); when the store did not, or the
		// row lock stayed held past the bound, one of them leads next.
		m.endTurn(lk, turn, err == nil || errors.Is(err, idemdriver.ErrUnstorable))
	}
	ev := Event{Method: r.Method, Scope: p.Scope, Key: p.Key, Claim: time.Since(waitStart), Attempt: res.Record.Attempts}
	if err == nil && !res.Record.ExpiresAt.IsZero() {
		w.Header().Set(HeaderKeyExpires, res.Record.ExpiresAt.UTC().Format(http.TimeFormat)) // as serve does
	}
	switch {
	case errors.Is(err, idemdriver.ErrLockWait):
		// Another one-commit execution of the key (another process's)
		// holds its row past the wait bound: it is in flight, though no
		// lease says so; the next waiter leads, the others keep waiting.
		ev.Kind, ev.Status = EventInFlight, m.oneCommitInFlight(w, r)
	case errors.Is(err, idemdriver.ErrUnstorable):
		m.cfg.Logger.ErrorContext(ctx, "idem: the store cannot hold this request's scope", "err", err)
		m.writeProblem(w, r, ProblemFor(ErrScopeUnstorable, "the server could not scope this request"))
		return
	case err != nil:
		serr := &StoreError{Op: "claim", Err: err}
		m.storeUnavailable(w, r, serr)
		ev.Kind, ev.Status, ev.Err = EventStoreUnavailable, http.StatusServiceUnavailable, serr
	case !res.Claimed:
		m.remember(p, res.Record)
		ev.Kind, ev.Status = m.answer(w, r, res.Record, p)
	default:
		// The response is held until the transaction has ended: the turn
		// ends at its first write (or when the handler panics), and a
		// waiter leads the next wave, whatever the outcome was.
		if turn != nil {
			w = &turnWriter{ResponseWriter: w, end: func() { m.endTurn(lk, turn, false) }}
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		m.executeOneCommit(w, r, next, res, tx, p, &ev)
		return
	}
	ev.Route = m.route(r, nil)
	m.observe(ctx, &ev)
}

// localKey names a key in Middleware.turns.
type localKey struct{ scope, key string }

// keyTurn is one wave of lk's requests in this process (see
// serveOneCommit): ended is closed when its leader's turn is over, settled
// (written before) says whether the key's record is then committed.
type keyTurn struct {
	ended   chan struct{}
	settled bool
	over    bool // endTurn has run; turnsMu guards it
}

// awaitTurn waits for this request's turn to claim lk. It returns the turn
// the request leads (end it with endTurn), or nil to claim as a waiter of
// a settled turn; ok is false when deadline came first, or the client went
// away: the key is in flight.
func (m *Middleware) awaitTurn(ctx context.Context, lk localKey, deadline time.Time) (turn *keyTurn, ok bool) {
	for {
		m.turnsMu.Lock()
		other := m.turns[lk]
		if other == nil {
			turn = &keyTurn{ended: make(chan struct{})}
			m.turns[lk] = turn
		}
		m.turnsMu.Unlock()
		if other == nil {
			return turn, true
		}
		left := time.NewTimer(time.Until(deadline))
		select {
		case <-other.ended:
			left.Stop()
			if other.settled {
				return nil, true
			}
			// Rolled back, or no answer: one of the waiters leads next.
		case <-left.C:
			return nil, false
		case <-ctx.Done():
			left.Stop()
			return nil, false
		}
	}
}

// endTurn ends turn, the leader's, once its claim has answered or its
// transaction has ended: the waiters claim (settled) or elect the next
// leader. Only its first call counts.
func (m *Middleware) endTurn(lk localKey, turn *keyTurn, settled bool) {
	m.turnsMu.Lock()
	if turn.over {
		m.turnsMu.Unlock()
		return
	}
	turn.over = true
	delete(m.turns, lk)
	m.turnsMu.Unlock()
	turn.settled = settled
	close(turn.ended)
}

// turnWriter is the client's writer while a leader runs its key: its first
// write ends the leader's turn (end). Nothing is written before the claim's
// transaction has ended (the response is held until then), and a client
// that reads slowly must not keep the key's waiters from the committed
// record.
type turnWriter struct {
	http.ResponseWriter
	end func()
}

func (t *turnWriter) WriteHeader(status int) {
	t.end()
	t.ResponseWriter.WriteHeader(status)
}

func (t *turnWriter) Write(b []byte) (int, error) {
	t.end()
	return t.ResponseWriter.Write(b)
}

// Unwrap returns the client's writer (http.ResponseController).
func (t *turnWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

// claimTx runs the store's ClaimTx on txCtx, bounded by ClaimTimeout plus
// wait, the bound of the lock wait: a claim that gets no connection from
// the pool, or no answer, by then fails (context.DeadlineExceeded; the
// caller answers 503), as a durable claim fails past ClaimTimeout. The
// bound cancels txCtx (cancelTx) only while ClaimTx runs: the transaction
// it returns lives on txCtx.
func (m *Middleware) claimTx(txCtx context.Context, cancelTx context.CancelFunc, p idemdriver.ClaimParams, wait time.Duration) (idemdriver.ClaimResult, idemdriver.Tx, error) {
	bound := m.cfg.ClaimTimeout + wait
	timer := time.AfterFunc(bound, cancelTx)
	res, tx, err := m.cfg.Store.(idemdriver.TxClaimer).ClaimTx(txCtx, p, wait)
	if timer.Stop() {
		return res, tx, err
	}
	// The bound ran out, perhaps just as ClaimTx returned: a transaction it
	// returned is on a cancelled context and is rolled back.
	if tx != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(txCtx), m.cfg.CompleteTimeout)
		_ = tx.Rollback(rctx)
		cancel()
	}
	return idemdriver.ClaimResult{}, nil, fmt.Errorf("idem: the one-commit claim had no answer within ClaimTimeout + OneCommitWait (%s): %w", bound, context.DeadlineExceeded)
}

// oneCommitInFlight answers 409 request-in-flight to a one-commit request
// that waited for the key past OneCommitWait, and returns the status sent.
func (m *Middleware) oneCommitInFlight(w http.ResponseWriter, r *http.Request) int {
	pr := ProblemFor(ErrInFlight, "another request with this key is being processed; retry after the Retry-After delay to get its result")
	pr.RetryAfter = m.inFlightRetryAfter(m.cfg.LeaseDuration)
	return m.writeProblem(w, r, pr)
}

// executeOneCommit runs next as the owner of the uncommitted claim res,
// in tx, and commits or rolls back.
func (m *Middleware) executeOneCommit(w http.ResponseWriter, r *http.Request, next http.Handler, res idemdriver.ClaimResult, tx idemdriver.Tx,
	p idemdriver.ClaimParams, ev *Event) {
	e := newExecution(m, r.Context(), res.Record, p)
	defer e.cancel(nil)
	e.tx = tx // the claim's own transaction: TxFromContext returns it
	limit := time.AfterFunc(m.cfg.MaxExecution, func() { e.cancel(ErrExecutionTimeout) })
	cw := newCaptureWriter(w)
	hr := r.WithContext(e.ctx)
	ran := time.Now()
	panicked, recovered := runHandler(next, cw, hr)
	limit.Stop()
	ev.Handler, ev.Route, ev.Kind = time.Since(ran), m.route(r, hr), EventExecuted
	recording := time.Now()
	defer func() {
		if ev.Completion == 0 {
			ev.Completion = time.Since(recording)
		}
		m.observe(r.Context(), ev)
	}()
	if panicked {
		e.rollback() // the claim with it: the retry runs at once
		ev.Outcome = Failed
		panic(recovered)
	}
	if errors.Is(context.Cause(e.ctx), ErrExecutionTimeout) {
		e.rollback()
		ev.Outcome, ev.Err = Failed, ErrExecutionTimeout
		ev.Status = m.outcomeUnknown(w, r, ErrExecutionTimeout, fmt.Sprintf("the request ran past its time limit (%s); its writes were rolled back "+
			"and nothing was recorded; retry with the same key: the request runs again", m.cfg.MaxExecution))
		return
	}
	outcome := e.outcome(cw.statusCode())
	ev.Outcome = outcome
	switch outcome {
	case Failed:
		// The rollback is the FAILED outcome: the record is as it was
		// before the claim (none for a new key), and the retry runs at once.
		e.rollback()
		ev.Status = sendCaptured(cw)
		return
	case Released:
		e.rollback()
		ev.Kind = EventReleased
		if res.Record.FencingToken > 1 && !m.releaseAfterRollback(p) {
			// The key's earlier record (FAILED, say) is back and could not
			// be removed: a corrected request would meet key-reused.
			ev.Kind = EventCompletionFailed
			ev.Status = m.outcomeUnknown(w, r, errors.New("release after rollback"), fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
				"retry the same request with the same key", cw.statusCode()))
			return
		}
		ev.Status = sendCaptured(cw)
		return
	}
	ev.Status, ev.Err = m.commitOneCommit(w, r, e, cw, p)
	if ev.Err != nil && !errors.Is(ev.Err, ErrTxAborted) {
		ev.Kind = EventCompletionFailed
	}
}

// commitOneCommit writes the completion in the claim's transaction and
// commits: claim, business writes and outcome together. It returns the
// status sent and what went wrong, if anything.
func (m *Middleware) commitOneCommit(w http.ResponseWriter, r *http.Request, e *execution, cw *captureWriter, p idemdriver.ClaimParams) (int, error) {
	cp := idemdriver.CompleteParams{FenceParams: e.fence, Response: m.storedResponse(cw)}
	tx := e.endTx()
	ok, committed, err := e.completeIn(tx, cp)
	switch {
	case committed && err != nil:
		return m.commitFailed(w, r, err), err
	case committed:
		return sendCaptured(cw), nil
	case errors.Is(err, idemdriver.ErrTxDone):
		// The handler ended the transaction itself, against the contract:
		// a commit took the claim with it (record the outcome on its own); a
		// rollback took it away (nothing to record: the retry runs again).
		m.cfg.Logger.ErrorContext(e.parent, "idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", p.Scope, "key", p.Key)
		if _, err := e.completeAlone(cp); err != nil {
			return m.outcomeUnknown(w, r, err, "the idempotency store failed while recording the result; retry with the same key"), err
		}
		return sendCaptured(cw), nil
	case errors.Is(err, idemdriver.ErrTxAborted):
		_ = e.rollbackTx(tx)
		if cp.Response.Status >= 200 && cp.Response.Status < 300 {
			m.cfg.Logger.ErrorContext(e.parent, "idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
				"its writes are gone: answer an error when a statement fails", "scope", p.Scope, "key", p.Key, "status", cp.Response.Status)
			return m.writeProblem(w, r, ProblemFor(ErrTxAborted, fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
				"(the server answered %d regardless); retry with the same key: the request runs again", cp.Response.Status))), ErrTxAborted
		}
		// The claim went with the aborted transaction: record the answer
		// on its own (a claim and a completion), so that it is replayed as
		// in the default mode.
		ctx, cancel := e.detached()
		defer cancel()
		if !m.recordAfterRollback(ctx, p, cp.Response) {
			err := errors.New("idem: the answer of an aborted one-commit transaction could not be recorded")
			return m.outcomeUnknown(w, r, err, "the request's transaction failed and its answer could not be recorded; retry with the same key: the request runs again"), err
		}
		return sendCaptured(cw), nil
	case err != nil:
		_ = e.rollbackTx(tx)
		serr := &StoreError{Op: "complete", Err: err}
		return m.outcomeUnknown(w, r, serr, "the idempotency store failed while recording the result, which was not recorded "+
			"(the request's writes were rolled back with it); retry with the same key: the request runs again"), serr
	case !ok:
		// Only the handler itself can have changed the row its claim locks.
		_ = e.rollbackTx(tx)
		return m.leaseLost(w, r), ErrLeaseLost
	}
	// The COMMIT is never cancelled (see execution.durable).
	if _, err := e.durable(func(ctx context.Context) (bool, error) { return true, tx.Commit(ctx) }); err != nil {
		serr := &StoreError{Op: "commit", Err: err}
		return m.commitFailed(w, r, serr), serr
	}
	return sendCaptured(cw), nil
}

// commitFailed answers a one-commit execution whose COMMIT failed: its
// outcome, writes and result together, is unknown.
func (m *Middleware) commitFailed(w http.ResponseWriter, r *http.Request, err error) int {
	return m.outcomeUnknown(w, r, err, "the idempotency store failed while committing the request's writes and result; "+
		"retry with the same key: it gets the result if the commit took effect, or the request runs again")
}

// recordAfterRollback records resp for p after the claim's transaction was
// rolled back: a durable claim and a completion. It reports false when the
// key could not be claimed or the store failed (another request took the
// key meanwhile, or the store is down).
func (m *Middleware) recordAfterRollback(ctx context.Context, p idemdriver.ClaimParams, resp idemdriver.Response) bool {
	res, err := m.cfg.Store.Claim(ctx, p)
	if err != nil || !res.Claimed {
		return false
	}
	f := idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt}
	ok, err := m.cfg.Store.Complete(ctx, idemdriver.CompleteParams{FenceParams: f, Response: resp})
	return err == nil && ok
}

// releaseAfterRollback removes the record of p's key that the rollback of
// a released execution restored (a FAILED record re-claimed, say): a
// durable claim and a fenced Release, as ReleaseKey does in the default
// mode. It reports whether the key is free of this request's record.
func (m *Middleware) releaseAfterRollback(p idemdriver.ClaimParams) bool {
	ctx, cancel := context.WithTimeout(context.Background(), m.cfg.CompleteTimeout)
	defer cancel()
	res, err := m.cfg.Store.Claim(ctx, p)
	if err != nil {
		return false
	}
	if !res.Claimed {
		return true // another request owns the key now: nothing of ours is left
	}
	f := idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt}
	ok, err := m.cfg.Store.Release(ctx, f)
	return err == nil && ok
}

// sendCaptured sends the captured response and returns its status.
func sendCaptured(cw *captureWriter) int {
	cw.send()
	return cw.statusCode()
}
