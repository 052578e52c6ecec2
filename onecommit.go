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
// the claim on (serve has parsed the key, the scope and the body).
func (m *Middleware) serveOneCommit(w http.ResponseWriter, r *http.Request, next http.Handler, p idemdriver.ClaimParams, body []byte) {
	// Detached from the client, like the durable claim; bounded as a whole
	// (database/sql ends a transaction when the context it began on ends).
	txCtx, cancelTx := context.WithTimeout(context.WithoutCancel(r.Context()),
		m.cfg.ClaimTimeout+m.cfg.MaxExecution+m.cfg.CompleteTimeout)
	defer cancelTx()
	res, tx, err := m.cfg.Store.(idemdriver.TxClaimer).ClaimTx(txCtx, p, m.cfg.OneCommitWait)
	switch {
	case errors.Is(err, idemdriver.ErrLockWait):
		// Another one-commit execution of the key holds its row past the
		// wait bound: it is in flight, though no lease says so.
		pr := ProblemFor(ErrInFlight, "another request with this key is being processed; retry after the Retry-After delay to get its result")
		pr.RetryAfter = m.inFlightRetryAfter(m.cfg.LeaseDuration)
		pr.Write(w)
		return
	case errors.Is(err, idemdriver.ErrUnstorable):
		m.cfg.Logger.Error("idem: the store cannot hold this request's scope", "err", err)
		ProblemFor(ErrScopeUnstorable, "the server could not scope this request").Write(w)
		return
	case err != nil:
		m.storeUnavailable(w, &StoreError{Op: "claim", Err: err})
		return
	case !res.Claimed:
		m.answer(w, res.Record, p)
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	e := newExecution(m, r.Context(), res.Record, p)
	defer e.cancel(nil)
	e.tx = tx // the claim's own transaction: TxFromContext returns it
	limit := time.AfterFunc(m.cfg.MaxExecution, func() { e.cancel(ErrExecutionTimeout) })
	cw := newCaptureWriter(w)
	panicked, recovered := runHandler(next, cw, r.WithContext(e.ctx))
	limit.Stop()
	if panicked {
		e.rollback() // the claim with it: the retry runs at once
		panic(recovered)
	}
	if errors.Is(context.Cause(e.ctx), ErrExecutionTimeout) {
		e.rollback()
		m.outcomeUnknown(w, ErrExecutionTimeout, fmt.Sprintf("the request ran past its time limit (%s); its writes were rolled back "+
			"and nothing was recorded; retry with the same key: the request runs again", m.cfg.MaxExecution))
		return
	}
	outcome := m.cfg.Outcome(cw.statusCode())
	if e.released() {
		outcome = Released
	}
	switch outcome {
	case Failed:
		// The rollback is the FAILED outcome: the record is as it was
		// before the claim (none for a new key), and the retry runs at once.
		e.rollback()
		cw.send()
		return
	case Released:
		e.rollback()
		if res.Record.FencingToken > 1 && !m.releaseAfterRollback(p) {
			// The key's earlier record (FAILED, say) is back and could not
			// be removed: a corrected request would meet key-reused.
			m.outcomeUnknown(w, errors.New("release after rollback"), fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
				"retry the same request with the same key", cw.statusCode()))
			return
		}
		cw.send()
		return
	}
	m.commitOneCommit(w, e, cw, p)
}

// commitOneCommit writes the completion in the claim's transaction and
// commits: claim, business writes and outcome together.
func (m *Middleware) commitOneCommit(w http.ResponseWriter, e *execution, cw *captureWriter, p idemdriver.ClaimParams) {
	ctx, cancel := e.detached()
	defer cancel()
	cp := idemdriver.CompleteParams{FenceParams: e.fence, Response: m.storedResponse(cw)}
	tx := e.endTx()
	ok, err := tx.Complete(ctx, cp)
	switch {
	case errors.Is(err, idemdriver.ErrTxDone):
		// The handler ended the transaction itself, against the contract:
		// a commit took the claim with it (record the outcome on its own); a
		// rollback took it away (nothing to record: the retry runs again).
		m.cfg.Logger.Error("idem: the handler committed or rolled back the claim's transaction itself; leave Commit and Rollback to idem",
			"scope", p.Scope, "key", p.Key)
		if _, err := e.completeAlone(ctx, cp); err != nil {
			m.outcomeUnknown(w, err, "the idempotency store failed while recording the result; retry with the same key")
			return
		}
		cw.send()
	case errors.Is(err, idemdriver.ErrTxAborted):
		_ = tx.Rollback(ctx)
		if cp.Response.Status >= 200 && cp.Response.Status < 300 {
			m.cfg.Logger.Error("idem: the handler answered 2xx although a statement failed in the claim's transaction, which aborted; "+
				"its writes are gone: answer an error when a statement fails", "scope", p.Scope, "key", p.Key, "status", cp.Response.Status)
			ProblemFor(ErrTxAborted, fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
				"(the server answered %d regardless); retry with the same key: the request runs again", cp.Response.Status)).Write(w)
			return
		}
		// The claim went with the aborted transaction: record the answer
		// on its own (a claim and a completion), so that it is replayed as
		// in the default mode.
		if !m.recordAfterRollback(ctx, p, cp.Response) {
			m.outcomeUnknown(w, errors.New("record after rollback"), "the request's transaction failed and its answer could not be recorded; retry with the same key: the request runs again")
			return
		}
		cw.send()
	case err != nil:
		_ = tx.Rollback(ctx)
		m.outcomeUnknown(w, err, "the idempotency store failed while recording the result, which was not recorded "+
			"(the request's writes were rolled back with it); retry with the same key: the request runs again")
	case !ok:
		// Only the handler itself can have changed the row its claim locks.
		_ = tx.Rollback(ctx)
		m.leaseLost(w)
	default:
		if err := tx.Commit(ctx); err != nil {
			m.outcomeUnknown(w, &StoreError{Op: "commit", Err: err}, "the idempotency store failed while committing the request's writes and result; "+
				"retry with the same key: it gets the result if the commit took effect, or the request runs again")
			return
		}
		cw.send()
	}
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
