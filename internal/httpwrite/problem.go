package httpwrite

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Problem is an RFC 9457 problem details object, field for field the root
// package's idem.Problem (which converts to it), documented there.
type Problem struct {
	Type       string         `json:"type"`
	Title      string         `json:"title"`
	Status     int            `json:"status"`
	Detail     string         `json:"detail,omitempty"`
	Instance   string         `json:"instance,omitempty"`
	NewKeySafe bool           `json:"new_key_safe"`
	RetryAfter time.Duration  `json:"-"`
	Extra      map[string]any `json:"-"`
}

// Write sends p as application/problem+json, with Retry-After in whole
// seconds (RetryAfterSeconds) when p.RetryAfter is positive.
func (p Problem) Write(w http.ResponseWriter) {
	body := p.encode()
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(RetryAfterSeconds(p.RetryAfter), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body) // Encode ends it with a newline; a client gone is no error of ours
}

// RetryAfterSeconds is d in whole seconds, rounded up, at least 1: a
// Retry-After's delay-seconds (RFC 9110 section 10.2.3).
func RetryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}

// encode is p's JSON: its members sorted, Extra's merged. A problem with no
// Extra is encoded once and kept (problemBodies): idem's own problems are a
// few dozen texts, and a retry storm's 409s and 422s send the same ones.
func (p Problem) encode() []byte {
	members := problemMembers{p.Detail, p.Instance, p.keySafeMember(), p.Status, p.Title, p.Type}
	if len(p.Extra) == 0 {
		if b, ok := problemBodies.Load(members); ok {
			return b.([]byte)
		}
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false) // a detail may quote <placeholders>; this is no HTML
	if err := p.encodeExtra(enc); len(p.Extra) == 0 || err != nil {
		// Sorted members; also when an Extra member cannot be encoded.
		buf.Reset()
		_ = enc.Encode(members) // strings and a number: no error
	}
	if len(p.Extra) == 0 && buf.Len() <= maxProblemBodyBytes && problemBodiesKept.Add(1) <= maxProblemBodies {
		problemBodies.Store(members, buf.Bytes())
	}
	return buf.Bytes()
}

// problemBodies holds the encoded bodies of problems without Extra
// (problemMembers to []byte, never changed once stored), at most
// maxProblemBodies of them, each at most maxProblemBodyBytes: details that
// quote a request's method and path or a status are as many as an
// application's routes (and a client chooses its path); past either bound,
// a problem is encoded each time, so what is kept stays under 256 KiB
// twice over (the key holds the detail too).
var (
	problemBodies     sync.Map
	problemBodiesKept atomic.Int64
)

const (
	maxProblemBodies    = 256
	maxProblemBodyBytes = 1 << 10
)

func (p Problem) encodeExtra(enc *json.Encoder) error {
	if len(p.Extra) == 0 {
		return nil
	}
	obj := make(map[string]any, len(p.Extra)+5)
	for k, v := range p.Extra {
		obj[k] = v
	}
	obj["type"], obj["title"], obj["status"] = p.Type, p.Title, p.Status
	if safe := p.keySafeMember(); safe != nil {
		obj["new_key_safe"] = *safe
	}
	if p.Detail != "" {
		obj["detail"] = p.Detail
	}
	if p.Instance != "" {
		obj["instance"] = p.Instance
	}
	return enc.Encode(obj)
}

type problemMembers struct {
	Detail     string `json:"detail,omitempty"`
	Instance   string `json:"instance,omitempty"`
	NewKeySafe *bool  `json:"new_key_safe,omitempty"` // keySafeTrue, keySafeFalse or nil: comparable
	Status     int    `json:"status"`
	Title      string `json:"title"`
	Type       string `json:"type"`
}

// TypeBase prefixes idem's own problem type URIs (idem.ProblemTypeBase).
const TypeBase = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"

// keySafeTrue and keySafeFalse are the values of problemMembers.NewKeySafe:
// two addresses, so that members stay a comparable key of problemBodies.
var keySafeTrue, keySafeFalse = new(bool), new(bool)

func init() { *keySafeTrue = true }

// keySafeMember is the new_key_safe member of p: always on idem's own
// problem types, on another only when true (a handler's own problem that
// says so); nil when it is left out.
func (p Problem) keySafeMember() *bool {
	switch {
	case p.NewKeySafe:
		return keySafeTrue
	case strings.HasPrefix(p.Type, TypeBase):
		return keySafeFalse
	}
	return nil
}
