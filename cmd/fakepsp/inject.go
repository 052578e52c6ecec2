package main

import (
	"bytes"
	"context"
	"net/http"
	"time"

	"github.com/idemgo/idem"
)

// withhold plays the "outcome unknown" failure (--timeout-rate): with
// probability TimeoutRate, a new charge's answer, already recorded by idem
// together with the charge, is held back for Hang or until the client hangs
// up, whichever comes first; the client times out not knowing whether it was
// charged. A retry with the same key then gets idem's replay (replays are
// never held back). Answers other than a fresh 2xx pass through.
func (a *api) withhold(next http.Handler) http.Handler {
	if a.cfg.TimeoutRate <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			next.ServeHTTP(w, r)
			return
		}
		buf := &bufferedResponse{header: http.Header{}}
		next.ServeHTTP(buf, r)
		fresh := buf.status >= 200 && buf.status < 300 && buf.header.Get(idem.HeaderReplayed) == ""
		if fresh && a.cfg.Roll() < a.cfg.TimeoutRate {
			merchant, _ := merchantFrom(r.Context())
			a.log.WarnContext(r.Context(), "fault injected: charged and recorded; withholding the answer",
				"merchant", merchant, "idempotency_key", r.Header.Get(idem.HeaderKey), "for", a.cfg.Hang.String())
			if info := requestInfoFrom(r.Context()); info != nil {
				info.withheld = true
			}
			t := time.NewTimer(a.cfg.Hang)
			select {
			case <-r.Context().Done():
				t.Stop()
				return // the client gave up: it never learns the outcome
			case <-t.C:
			}
		}
		buf.sendTo(w)
	})
}

// bufferedResponse holds a response until withhold decides to send it.
type bufferedResponse struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedResponse) Header() http.Header { return b.header }

func (b *bufferedResponse) WriteHeader(status int) {
	if b.status == 0 {
		b.status = status
	}
}

func (b *bufferedResponse) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

func (b *bufferedResponse) sendTo(w http.ResponseWriter) {
	if b.status == 0 {
		return // nothing was answered (idem saw the client hang up)
	}
	for k, v := range b.header {
		w.Header()[k] = v
	}
	if b.status == 0 {
		b.status = http.StatusOK
	}
	w.WriteHeader(b.status)
	_, _ = w.Write(b.body.Bytes())
}

// keepClaiming detaches the request's context from the client's connection
// before idem claims the key. idem runs its claim statement on the request's
// context: when the client hangs up during that statement, the database may
// commit the claim (PROCESSING) while the driver reports the cancellation,
// and idem then returns without running the handler, so the key stays
// claimed by nobody until its lease runs out (30 s by default), answering
// 409 to every retry meanwhile. paymentsd, killed while charging, is such a
// client. Detached, the claim completes and the charge runs, as a provider's
// should once the request has arrived whole. The handler's own context is
// detached by idem anyway.
func keepClaiming(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(w, r.WithContext(context.WithoutCancel(r.Context())))
	})
}
