package idem

import (
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"

	"github.com/idemgo/idem/internal/httpread"
	"github.com/idemgo/idem/internal/protocol"
)

// Middleware is the HTTP front of an Engine (CONTRACT sections 2 to 6).
type Middleware struct {
	g       *Engine
	cfg     Config
	methods map[string]bool
	replay  map[string]bool // canonical header names kept for replay
	replays *replayCache    // nil without Config.ReplayCacheBytes
	body    httpread.Body
	// lastDate is the last HTTP-date httpDate wrote: the retries of one key
	// (and the keys of one second) carry the same expiry.
	lastDate atomic.Pointer[httpDate]
}

// neverReplayed are never replayed (CONTRACT section 5, RFC 9110 section 7.6.1).
var neverReplayed = map[string]bool{
	"Set-Cookie": true, "Date": true, "Content-Length": true, "Connection": true,
	"Keep-Alive": true, "Proxy-Connection": true, "Transfer-Encoding": true,
	"Te": true, "Trailer": true, "Upgrade": true, "Proxy-Authenticate": true,
	HeaderReplayed: true, HeaderKey: true, HeaderKeyExpires: true,
	HeaderPreferenceApplied: true, // each answer's own (RFC 7240 section 3)
}

// HeaderPreferenceApplied names the preferences a server honoured (RFC 7240
// section 3). idem sends "wait=N" on the answer to a request that waited,
// N the wait it was given in whole seconds; it is never stored or replayed.
const HeaderPreferenceApplied = "Preference-Applied"

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
	m.body = httpread.Body{Limit: cfg.MaxRequestBytes, DiscardBytes: cfg.DiscardBytes, DiscardTimeout: cfg.DiscardTimeout}
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
