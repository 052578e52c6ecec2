package idem

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httprec"
	"github.com/idemgo/idem/internal/protocol"
)

// respond writes a's answer; applied holds the Preference-Applied field of
// a request that waited (nil for none), never stored nor replayed.
func (m *Middleware) respond(w http.ResponseWriter, r *http.Request, next http.Handler, a protocol.Answer, cw *captureWriter, applied http.Header, ev *Event) {
	if !a.Record.ExpiresAt.IsZero() && a.Kind != protocol.KindReleased {
		w.Header()[HeaderKeyExpires] = []string{m.httpDate(a.Record.ExpiresAt)}
	}
	for k, vs := range applied {
		w.Header()[k] = vs
	}
	if ev.Route == "" {
		ev.Route = m.route(r, nil, next)
	}
	switch a.Kind {
	case protocol.KindRan, protocol.KindReleased:
		cw.send(applied)
		ev.Status = cw.statusCode()
		return
	case protocol.KindReplay:
		if status := a.Record.Response.Status; !finalStatus(status) {
			// Damaged: net/http would panic sending it, dropping the connection on every retry.
			m.cfg.Logger.ErrorContext(r.Context(), "idem: a SUCCEEDED record holds a status outside 200-599; answering 500 response-missing, it is not run again",
				"scope", ev.Scope, "key", ev.Key, "status", status)
			a = protocol.Answer{Kind: protocol.KindResponseMissing, Record: a.Record, Err: ErrResponseMissing}
			ev.Kind = eventOf(a)
			break
		}
		if !ev.Cached {
			m.replays.put(ev.Scope, ev.Key, a.Record, true)
		}
		ev.Status = m.replayResponse(w, r, a.Record.Response)
		return
	case protocol.KindKeyReused:
		if !ev.Cached {
			m.replays.put(ev.Scope, ev.Key, a.Record, false)
		}
	}
	pr := problemOf(a, &m.cfg)
	// A failed claim logged its own cause; a refusal (MaxInFlight) is load,
	// counted by the observer, not a failure.
	if pr.Status == http.StatusServiceUnavailable && a.Kind != protocol.KindClaimFailed && a.Kind != protocol.KindOverloaded {
		m.cfg.Logger.ErrorContext(r.Context(), "idem: outcome not recorded", "err", a.Err)
	}
	ev.Status = m.writeProblem(w, r, pr)
}

// writeProblem writes pr through Config.ProblemWriter, or as RFC 9457
// problem details; it returns the status sent.
func (m *Middleware) writeProblem(w http.ResponseWriter, r *http.Request, pr Problem) int {
	if m.cfg.ProblemWriter == nil {
		pr.Write(w)
		return pr.Status
	}
	sw := httprec.New(w, false)
	m.cfg.ProblemWriter(sw, r, pr)
	if sw.Status == 0 {
		return http.StatusOK
	}
	return sw.Status
}

// replayResponse writes the stored response resp, marked replayed, or 410
// response-not-stored for a body not kept; it returns the status sent.
func (m *Middleware) replayResponse(w http.ResponseWriter, r *http.Request, resp *idemdriver.Response) int {
	h := w.Header()
	for k, v := range resp.Header {
		h[k] = v // the record's own (the replay cache hands out copies)
	}
	h.Set(HeaderReplayed, "true")
	if !resp.BodyStored {
		h.Del("Content-Type")
		h.Del("Content-Encoding")
		for k := range h {
			if strings.HasPrefix(k, http.TrailerPrefix) {
				delete(h, k) // the trailers of a body not replayed
			}
		}
		pr := ProblemFor(ErrResponseNotStored, fmt.Sprintf(
			"the request with this key succeeded with status %d, but its response (a %d-byte body) was too large to store, "+
				"for the replay limit or for what the store takes in one write, and was not kept; it will not run again",
			resp.Status, resp.BodySize))
		pr.Extra = map[string]any{"original_status": resp.Status}
		return m.writeProblem(w, r, pr)
	}
	writeResponse(w, resp.Status, resp.Body)
	return resp.Status
}

// writeResponse writes status and body under w's header. Trailers need
// chunking: no Content-Length with them (RFC 9110 section 8.6).
func writeResponse(w http.ResponseWriter, status int, body []byte) {
	bodyAllowed := status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
	if bodyAllowed && w.Header().Get("Content-Length") == "" && !hasTrailerKeys(w.Header()) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if bodyAllowed {
		_, _ = w.Write(body)
	}
	_ = http.NewResponseController(w).Flush()
}
