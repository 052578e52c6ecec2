package idem

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httprec"
	"github.com/idemgo/idem/internal/protocol"
	"github.com/idemgo/idem/seal"
	"github.com/maypok86/otter/v2"
)

// Middleware is the HTTP front of an Engine (CONTRACT sections 2 to 6).
type Middleware struct {
	g       *Engine
	cfg     Config
	methods map[string]bool
	replay  map[string]bool // canonical header names kept for replay
	replays *replayCache    // nil without Config.ReplayCacheBytes
	// lastDate is the last HTTP-date httpDate wrote: the retries of one key
	// (and the keys of one second) carry the same expiry.
	lastDate atomic.Pointer[httpDate]
}

// httpDate is t's second as an RFC 9110 HTTP-date (section 5.6.7).
type httpDate struct {
	unix int64
	text string
}

// httpDate formats t as an HTTP-date (http.TimeFormat, in UTC), the last
// one kept.
func (m *Middleware) httpDate(t time.Time) string {
	unix := t.Unix()
	if d := m.lastDate.Load(); d != nil && d.unix == unix {
		return d.text
	}
	d := &httpDate{unix: unix, text: t.UTC().Format(http.TimeFormat)}
	m.lastDate.Store(d)
	return d.text
}

// neverReplayed are never replayed (CONTRACT section 5, RFC 9110 section 7.6.1).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true, HeaderKey: true, HeaderKeyExpires: true,
	HeaderPreferenceApplied: true, // each answer's own (RFC 7240 section 3)
}

// HeaderKeyExpires carries the record's expires_at as an RFC 9110 HTTP-date
// on every answer from a record.
const HeaderKeyExpires = "Idempotency-Key-Expires"

// New validates cfg after WithDefaults; the error names every field.
func New(cfg Config) (*Middleware, error) {
	cfg = cfg.WithDefaults()
	if err := invalid(cfg.validate()); err != nil {
		return nil, err
	}
	m := &Middleware{g: newEngine(cfg.EngineConfig), cfg: cfg, methods: map[string]bool{}, replay: map[string]bool{}}
	for _, meth := range cfg.Methods {
		m.methods[strings.ToUpper(meth)] = true
	}
	for _, h := range cfg.ReplayHeaders {
		if k := http.CanonicalHeaderKey(h); !neverReplayed[k] {
			m.replay[k] = true
		}
	}
	if cfg.ReplayCacheBytes > 0 {
		m.replays = newReplayCache(cfg.ReplayCacheBytes, cfg.ReplayCacheTTL)
	}
	return m, nil
}

// Engine returns the engine behind m.
func (m *Middleware) Engine() *Engine { return m.g }

// Handler wraps next: protected requests go through the claim.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.serve(w, r, next)
	})
}

func (m *Middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	// RFC 9110 methods are case-sensitive, but routers may not be.
	if !m.methods[strings.ToUpper(r.Method)] {
		next.ServeHTTP(w, r)
		return
	}
	values := r.Header.Values(HeaderKey)
	if len(values) == 0 && m.cfg.KeyOptional {
		next.ServeHTTP(w, r)
		return
	}
	p, key, body, pr := m.request(w, r, values)
	if pr != nil {
		m.writeProblem(w, r, *pr)
		return
	}
	w.Header().Set(HeaderKey, values[0])
	var a protocol.Answer
	var ev Event
	var cw *captureWriter // the handler's, once it runs
	var applied http.Header
	if rec, opened, ok := m.replays.get(p.Scope, p.Key); ok {
		a = m.g.proto.Decide(r.Context(), rec, p, opened)
		ev = m.g.event(a, p, "")
		ev.Cached = true
	} else {
		j := &httpJob{m: m, r: r, w: w, body: body, next: next}
		wait, asked := m.wait(r)
		a, ev = m.g.run(r.Context(), p, key, wait, j, func() string { return j.route })
		cw = j.cw
		if asked && a.Waited {
			applied = http.Header{HeaderPreferenceApplied: {"wait=" + strconv.FormatInt(retryAfterSeconds(wait), 10)}}
		}
	}
	m.respond(w, r, next, a, cw, applied, &ev)
	if ev.Kind != 0 {
		m.g.observe(r.Context(), &ev)
	}
}

// wait is how long r waits for its key's execution in flight: its Prefer
// wait (RFC 7240 section 4.3), at most MaxWait, else Config.Wait; asked
// reports the Prefer wait's, to be named in Preference-Applied (section 3)
// when the request waits.
func (m *Middleware) wait(r *http.Request) (time.Duration, bool) {
	if m.cfg.MaxWait == 0 {
		return 0, false
	}
	if d, ok := preferredWait(r); ok {
		return min(d, m.cfg.MaxWait), d > 0
	}
	return m.cfg.Wait, false
}

// request reads r's claim (its key the stored one), the client's key and
// the body; w carries what the body's reading asks of the connection.
func (m *Middleware) request(w http.ResponseWriter, r *http.Request, values []string) (idemdriver.ClaimParams, string, []byte, *Problem) {
	refuse := func(kind error, detail string) (idemdriver.ClaimParams, string, []byte, *Problem) {
		pr := ProblemFor(kind, detail)
		return idemdriver.ClaimParams{}, "", nil, &pr
	}
	key, err := ParseKey(values)
	if errors.Is(err, ErrMissingKey) {
		return refuse(ErrMissingKey, fmt.Sprintf("this endpoint requires an %s header: a unique value per logical request, sent again unchanged on every retry", HeaderKey))
	} else if err != nil {
		return refuse(ErrInvalidKey, strings.TrimPrefix(err.Error(), "idem: "))
	}
	scope, err := m.cfg.Scope(r)
	if err != nil || scope == "" {
		// The error is the server's: logged, never sent.
		if err != nil {
			m.cfg.Logger.InfoContext(r.Context(), "idem: Scope refused the request", "err", err)
		}
		return refuse(ErrMissingScope, "this request names no owner for its key; authenticate first")
	}
	if why := unstorableScope(scope); why != "" {
		m.cfg.Logger.ErrorContext(r.Context(), "idem: Scope returned a scope no store can hold", "reason", why, "length", len(scope))
		return refuse(ErrScopeUnstorable, "the server could not scope this request")
	}
	path := r.URL.EscapedPath()
	if len(path) > MaxPathLength {
		return refuse(ErrPathTooLong, fmt.Sprintf("the request path is %d bytes; a protected request's path may have at most %d", len(path), MaxPathLength))
	}
	body, err := m.readBody(w, r)
	if errors.Is(err, ErrRequestTooLarge) {
		return refuse(ErrRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBytes))
	} else if err != nil {
		return refuse(ErrBodyUnreadable, "the request body could not be read to its end; nothing was processed, send the request again with the same key")
	}
	return m.g.claimParams(scope, key, r.Method, path, m.cfg.Fingerprint(r, body)), key, body, nil
}

type httpJob struct {
	m    *Middleware
	r    *http.Request
	w    http.ResponseWriter
	body []byte // as read, MaxRequestBytes at most
	next http.Handler
	cw   *captureWriter // made by Run: an answer from a record needs none
	// route is the request's route, once the handler ran (Event.Route).
	route string
}

func (j *httpJob) Run(ctx context.Context) (int, protocol.Override) {
	j.cw = newCaptureWriter(j.w)
	j.r.Body = io.NopCloser(bytes.NewReader(j.body)) // read whole by the claim
	hr := j.r.WithContext(ctx)
	defer func() { j.route = j.m.route(j.r, hr, j.next) }() // a panic included
	j.next.ServeHTTP(j.cw, hr)
	if status := j.cw.statusCode(); !finalStatus(status) {
		return j.refuseStatus(status)
	}
	return j.cw.statusCode(), protocol.ByPolicy
}

// refuseStatus answers 500 invalid-status in place of the handler's answer
// with status, no final status: net/http would panic sending one under 100
// or over 999, and the retries would run the handler again. The 500 is
// recorded SUCCEEDED whatever EngineConfig.Outcome says, since the
// handler's effects may have happened: every retry replays it.
func (j *httpJob) refuseStatus(status int) (int, protocol.Override) {
	j.m.cfg.Logger.ErrorContext(j.r.Context(), "idem: the handler answered a status outside 200-599; answering 500 invalid-status in its place, recorded: it does not run again",
		"status", status, "method", j.r.Method, "path", j.r.URL.Path)
	pr := ProblemFor(ErrInvalidStatus, fmt.Sprintf("the server answered this request with status %d, which HTTP does not allow as a final status; "+
		"the request was processed and will not run again: ask the operator what it did", status))
	j.cw.reset()
	j.m.writeProblem(j.cw, j.r, pr)
	if !finalStatus(j.cw.statusCode()) { // the ProblemWriter's own
		j.cw.reset()
		pr.Write(j.cw)
	}
	return j.cw.statusCode(), protocol.OverrideSucceeded
}

func (j *httpJob) Response() idemdriver.Response { return j.m.storedResponse(j.cw) }

func (j *httpJob) Kept(limit int64) seal.Request {
	return keptRequest(j.body, limit, j.r.Header.Get("Content-Type"), j.r.URL.RawQuery)
}

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

func (m *Middleware) route(r, hr *http.Request, next http.Handler) string {
	pattern := r.Pattern
	if hr != nil && hr.Pattern != "" {
		pattern = hr.Pattern
	}
	if mux, ok := next.(*http.ServeMux); ok && pattern == "" {
		_, pattern = mux.Handler(r) // wrapping the mux itself: a replay never reaches it
	}
	switch {
	case pattern != "":
		// http.route is the path template: the pattern without its method
		// and host (OpenTelemetry's HTTP semantic conventions).
		if i := strings.IndexByte(pattern, '/'); i >= 0 {
			return pattern[i:]
		}
		return pattern
	case m.cfg.Route != nil:
		return m.cfg.Route(r)
	}
	return ""
}

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

func (m *Middleware) storedResponse(c *captureWriter) idemdriver.Response {
	resp := idemdriver.Response{Status: c.statusCode(), Header: map[string][]string{}, BodySize: int64(c.body.Len())}
	for k, v := range c.sentHeader() {
		if m.replay[http.CanonicalHeaderKey(k)] {
			resp.Header[http.CanonicalHeaderKey(k)] = append([]string(nil), v...)
		}
	}
	for name, v := range c.trailers() {
		if m.replay[name] {
			resp.Header[http.TrailerPrefix+name] = append([]string(nil), v...)
		}
	}
	if resp.BodySize <= m.cfg.MaxResponseBytes {
		resp.Body, resp.BodyStored = c.body.Bytes(), true
	}
	return resp
}

// Trailers need chunking: no Content-Length with them (RFC 9110 section 8.6).
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

type replayCache struct {
	c *otter.Cache[replayKey, *cachedRecord]
}

type replayKey struct{ scope, key string }

type cachedRecord struct {
	method, path string
	fingerprint  []byte
	response     *idemdriver.Response
	opened       bool      // response is the replay's, opened; else as the store returned it
	expiresAt    time.Time // database clock
}

const recordOverhead = 256

func newReplayCache(maxBytes int64, ttl time.Duration) *replayCache {
	return &replayCache{c: otter.Must(&otter.Options[replayKey, *cachedRecord]{
		MaximumWeight: uint64(maxBytes),
		Weigher: func(k replayKey, r *cachedRecord) uint32 {
			n := recordOverhead + len(k.scope) + len(k.key) + len(r.method) + len(r.path) + len(r.fingerprint) + len(r.response.Body)
			for name, vs := range r.response.Header {
				n += len(name)
				for _, v := range vs {
					n += len(v)
				}
			}
			return uint32(min(n, math.MaxUint32))
		},
		ExpiryCalculator: otter.ExpiryCreatingFunc(func(e otter.Entry[replayKey, *cachedRecord]) time.Duration {
			return min(ttl, time.Until(e.Value.expiresAt))
		}),
	})}
}

// get returns the record cached for (scope, key), and whether its response
// is opened already (put's opened).
func (rc *replayCache) get(scope, key string) (idemdriver.Record, bool, bool) {
	if rc == nil {
		return idemdriver.Record{}, false, false
	}
	r, ok := rc.c.GetIfPresent(replayKey{scope, key})
	if !ok || !time.Now().Before(r.expiresAt) {
		return idemdriver.Record{}, false, false
	}
	// Copied: the replay hands the header slices to a writer others may change.
	resp := *r.response
	resp.Header = http.Header(resp.Header).Clone()
	return idemdriver.Record{Scope: scope, Key: key, Method: r.method, Path: r.path, Fingerprint: r.fingerprint,
		State: idemdriver.StateSucceeded, Response: &resp, ExpiresAt: r.expiresAt}, r.opened, true
}

// put caches rec, a SUCCEEDED record; opened says that its response is the
// one replayed (opened, EngineConfig.answer), not the store's.
func (rc *replayCache) put(scope, key string, rec idemdriver.Record, opened bool) {
	if rc == nil || rec.State != idemdriver.StateSucceeded || rec.Response == nil || !time.Now().Before(rec.ExpiresAt) {
		return
	}
	resp := *rec.Response
	resp.Header = http.Header(resp.Header).Clone()
	rc.c.Set(replayKey{scope, key}, &cachedRecord{method: rec.Method, path: rec.Path,
		fingerprint: rec.Fingerprint, response: &resp, opened: opened, expiresAt: rec.ExpiresAt})
}
