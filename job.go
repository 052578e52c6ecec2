package idem

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httpwrite"
	"github.com/idemgo/idem/internal/protocol"
	"github.com/idemgo/idem/seal"
)

// httpJob is a request's handler run under its claim (protocol.Job): it
// captures the answer, which is recorded, then sent.
type httpJob struct {
	m    *Middleware
	r    *http.Request
	w    http.ResponseWriter
	body []byte // as read, Request.MaxBytes at most
	next http.Handler
	cw   *httpwrite.Capture // made by Run: an answer from a record needs none
	// route is the request's route, once the handler ran (Event.Route).
	route string
}

func (j *httpJob) Run(ctx context.Context) (int, protocol.Override) {
	j.cw = httpwrite.NewCapture(j.w)
	j.r.Body = io.NopCloser(bytes.NewReader(j.body)) // read whole by the claim
	hr := j.r.WithContext(ctx)
	defer func() { j.route = j.m.route(j.r, hr, j.next) }() // a panic included
	j.next.ServeHTTP(j.cw, hr)
	if status := j.cw.Status(); !httpwrite.FinalStatus(status) {
		return j.refuseStatus(status)
	}
	return j.cw.Status(), protocol.ByPolicy
}

// refuseStatus answers 500 invalid-status in place of the handler's answer
// with status, no final status: net/http would panic sending one under 100
// or over 999, and the retries would run the handler again. The 500 is
// recorded SUCCEEDED whatever EngineOptions.Response.Outcome says, since the
// handler's effects may have happened: every retry replays it.
func (j *httpJob) refuseStatus(status int) (int, protocol.Override) {
	j.m.o.Engine.Logger.ErrorContext(j.r.Context(), "idem: the handler answered a status outside 200-599; answering 500 invalid-status in its place, recorded: it does not run again",
		"status", status, "method", j.r.Method, "path", j.r.URL.Path)
	pr := ProblemFor(ErrInvalidStatus, fmt.Sprintf("the server answered this request with status %d, which HTTP does not allow as a final status; "+
		"the request was processed and will not run again: ask the operator what it did", status))
	j.cw.Reset()
	j.m.writeProblem(j.cw, j.r, pr)
	if !httpwrite.FinalStatus(j.cw.Status()) { // the ProblemWriter's own
		j.cw.Reset()
		pr.Write(j.cw)
	}
	return j.cw.Status(), protocol.OverrideSucceeded
}

func (j *httpJob) Response() idemdriver.Response { return j.m.storedResponse(j.cw) }

func (j *httpJob) Kept(limit int64) seal.Request {
	return keptRequest(j.body, limit, j.r.Header.Get("Content-Type"), j.r.URL.RawQuery)
}

// unkept are the headers a request kept for a re-drive never holds: its
// credentials (the completer rebuilds them from the scope) and the key
// (kept apart).
var unkept = []string{"Authorization", "Proxy-Authorization", "Cookie", HeaderKey}

// Redrive is the request kept for a re-drive (Request.KeepForRedrive):
// whole (Request.MaxBytes bounds what was read), its key, and its headers
// but unkept and what Request.Redact removes.
func (j *httpJob) Redrive() (seal.Request, bool) {
	if !j.m.o.Request.KeepForRedrive {
		return seal.Request{}, false
	}
	r := keptRequest(j.body, int64(len(j.body)), j.r.Header.Get("Content-Type"), j.r.URL.RawQuery)
	h := j.r.Header.Clone()
	for _, name := range unkept {
		h.Del(name)
	}
	if j.m.o.Request.Redact != nil {
		j.m.o.Request.Redact(h)
	}
	r.Key, r.Header = j.r.Header.Get(HeaderKey), h
	return r, true
}

// storedResponse is the answer c captured as it is recorded: the replayed
// headers only, the body when Response.MaxBytes allows.
func (m *Middleware) storedResponse(c *httpwrite.Capture) idemdriver.Response {
	resp := idemdriver.Response{Status: c.Status(), Header: map[string][]string{}, BodySize: int64(len(c.Body()))}
	for k, v := range c.SentHeader() {
		if m.replay[http.CanonicalHeaderKey(k)] {
			resp.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
	for name, v := range c.Trailers() {
		if m.replay[name] {
			resp.Header[http.TrailerPrefix+name] = append([]string(nil), v...)
		}
	}
	if resp.BodySize <= m.o.Engine.Response.MaxBytes {
		resp.Body, resp.BodyStored = c.Body(), true
	}
	return resp
}
