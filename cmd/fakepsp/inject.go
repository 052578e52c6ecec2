package main

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
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
			merchant, _ := service.Merchant(r.Context())
			a.log.WarnContext(r.Context(), "fault injected: charged and recorded; withholding the answer",
				"merchant", merchant, "idempotency_key", r.Header.Get(idem.HeaderKey), "for", a.cfg.Hang.String())
			if withheld, ok := r.Context().Value(withheldKey{}).(*bool); ok {
				*withheld = true
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

type withheldKey struct{}

// logWithheld adds "withheld" to every request's log line (it goes inside
// service.LogRequests): whether withhold held the answer back.
func logWithheld(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		withheld := false
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), withheldKey{}, &withheld)))
		if info := service.RequestInfoFrom(r.Context()); info != nil {
			info.Attrs = append(info.Attrs, slog.Bool("withheld", withheld))
		}
	})
}
