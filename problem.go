package idem

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// ProblemTypeBase prefixes idem's problem type URIs; the fragment names the
// kind's section of docs/problems.md.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/docs/problems.md#"

// Problem is an RFC 9457 problem details object.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	// Instance is left empty by idem; handlers may set it.
	Instance string `json:"instance,omitempty"`
	// RetryAfter, when positive, is sent as Retry-After in whole seconds (RFC
	// 9110 section 10.2.3).
	RetryAfter time.Duration `json:"-"`
	// Extra members, merged into the JSON object (RFC 9457 section 3.2).
	Extra map[string]any `json:"-"`
}

type problemKind struct {
	err    error
	slug   string
	title  string
	status int
}

// problemKinds: one type each, documented in docs/problems.md (CONTRACT section 8).
var problemKinds = []problemKind{
	{ErrMissingKey, "missing-key", "Idempotency-Key header required", http.StatusBadRequest},
	{ErrInvalidKey, "invalid-key", "Invalid Idempotency-Key header", http.StatusBadRequest},
	{ErrMissingScope, "missing-scope", "No scope for this request", http.StatusUnauthorized},
	{ErrScopeUnstorable, "scope-unstorable", "The server could not scope this request", http.StatusInternalServerError},
	{ErrPathTooLong, "path-too-long", "Request path too long", http.StatusRequestURITooLong},
	{ErrRequestTooLarge, "request-too-large", "Request body too large", http.StatusRequestEntityTooLarge},
	{ErrBodyUnreadable, "body-unreadable", "Request body could not be read", http.StatusBadRequest},
	{ErrKeyReused, "key-reused", "Idempotency-Key reused with a different request", http.StatusUnprocessableEntity},
	{ErrInFlight, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict},
	{ErrLeaseLost, "request-in-flight", "A request with this Idempotency-Key is in progress", http.StatusConflict},
	{ErrResponseNotStored, "response-not-stored", "The response for this Idempotency-Key was not stored", http.StatusGone},
	{ErrResponseMissing, "response-missing", "The response for this Idempotency-Key is missing from the store", http.StatusInternalServerError},
	{ErrRecordDamaged, "record-damaged", "The record for this Idempotency-Key is damaged", http.StatusInternalServerError},
	{ErrTxAborted, "transaction-aborted", "The request's transaction aborted", http.StatusInternalServerError},
	{ErrInvalidStatus, "invalid-status", "The server answered with an invalid status", http.StatusInternalServerError},
	{ErrSealKeyMissing, "seal-key-missing", "The stored response for this Idempotency-Key is sealed with a key the server does not hold", http.StatusInternalServerError},
	{ErrSealBroken, "seal-broken", "The stored response for this Idempotency-Key failed its integrity check", http.StatusInternalServerError},
	{ErrStoreUnavailable, "store-unavailable", "Idempotency store unavailable", http.StatusServiceUnavailable},
	{ErrOverloaded, "overloaded", "Too many requests in progress", http.StatusServiceUnavailable},
}

var problemTypes = func() map[string]string {
	types := make(map[string]string, len(problemKinds))
	for _, k := range problemKinds {
		types[k.slug] = ProblemTypeBase + k.slug
	}
	return types
}()

func (k problemKind) typeURI() string { return problemTypes[k.slug] }

// ProblemFor returns the problem of the idem kind that kind matches
// (errors.Is), or a 500 about:blank.
func ProblemFor(kind error, detail string) Problem {
	for _, k := range problemKinds {
		if kind != nil && errors.Is(kind, k.err) {
			return Problem{Type: k.typeURI(), Title: k.title, Status: k.status, Detail: detail}
		}
	}
	return Problem{Type: "about:blank", Title: http.StatusText(http.StatusInternalServerError), Status: http.StatusInternalServerError, Detail: detail}
}

// Write sends p as application/problem+json.
func (p Problem) Write(w http.ResponseWriter) {
	body := p.encode()
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Cache-Control", "no-store")
	if p.RetryAfter > 0 {
		h.Set("Retry-After", strconv.FormatInt(retryAfterSeconds(p.RetryAfter), 10))
	}
	w.WriteHeader(p.Status)
	_, _ = w.Write(body) // Encode ends it with a newline; a client gone is no error of ours
}

// encode is p's JSON: its members sorted, Extra's merged. A problem with no
// Extra is encoded once and kept (problemBodies): idem's own problems are a
// few dozen texts, and a retry storm's 409s and 422s send the same ones.
func (p Problem) encode() []byte {
	members := problemMembers{p.Detail, p.Instance, p.Status, p.Title, p.Type}
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
	if p.Detail != "" {
		obj["detail"] = p.Detail
	}
	if p.Instance != "" {
		obj["instance"] = p.Instance
	}
	return enc.Encode(obj)
}

type problemMembers struct {
	Detail   string `json:"detail,omitempty"`
	Instance string `json:"instance,omitempty"`
	Status   int    `json:"status"`
	Title    string `json:"title"`
	Type     string `json:"type"`
}

func retryAfterSeconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second > 0 {
		s++
	}
	return max(s, 1)
}

type answerKind int

const (
	answerRan      answerKind = iota + 1 // the outcome was recorded: the work's answer
	answerReleased                       // the record was removed: the work's answer
	answerReplay                         // the stored response
	answerKeyReused
	answerInFlight
	answerClaimFailed
	answerUnstorable
	answerLeaseLost
	answerTimedOut
	answerUnreachable
	answerReleaseFailed
	answerTxAborted
	answerCompletionUnknown
	answerCompletionNotRecorded
	answerCompletionMovedOn
	answerCommitFailed
	answerResponseMissing // a SUCCEEDED record without its response
	answerSealKeyMissing  // a SUCCEEDED record sealed under a key not configured
	answerSealBroken      // a SUCCEEDED record whose sealed response does not authenticate
	answerRecordDamaged   // a record that cannot be a valid one (idemdriver.DecisionDamaged)
	answerOverloaded      // refused before the claim: MaxInFlight executions in flight
)

type verdict struct {
	kind       answerKind
	rec        idemdriver.Record // the record a lost claim was answered from
	err        error             // the cause; Do's error
	retryAfter time.Duration     // answerInFlight
	status     int               // the work's status, for the answers that quote it
	sameOp     bool              // answerKeyReused: the same method and path, another payload
	waited     bool              // the request waited for another execution of its key (claimed.waited)
}

var answers = [...]struct {
	kind   error
	event  EventKind
	detail func(c *Config, v verdict) string
}{
	answerKeyReused: {ErrKeyReused, EventKeyReused, func(_ *Config, v verdict) string {
		return fmt.Sprintf("this %s was first used for %s %s; a key names one request", HeaderKey, v.rec.Method, v.rec.Path)
	}},
	answerInFlight: {ErrInFlight, EventInFlight, fixed("another request with this key is being processed; retry after the Retry-After delay to get its result")},
	answerClaimFailed: {ErrStoreUnavailable, EventStoreUnavailable,
		fixed("the idempotency store did not answer; the request was not processed, retry later with the same key")},
	answerUnstorable: {ErrScopeUnstorable, 0, fixed("the server could not scope this request")},
	answerLeaseLost: {ErrLeaseLost, EventLeaseLost, func(c *Config, _ verdict) string {
		if c.OneCommit { // no lease: the transaction lost a conflict (Galera: another node's commit of the key)
			return "this request's writes conflicted with another transaction committed first (on a database cluster, most often another request " +
				"with this key on another node), so they were rolled back and its result was not recorded; retry with the same key: " +
				"it gets that request's result, or runs again"
		}
		return "this request's lease ran out and another request took its key over; its result was not recorded; retry with the same key to get the new owner's result"
	}},
	answerTimedOut: {ErrStoreUnavailable, EventExecuted, func(c *Config, _ verdict) string {
		return fmt.Sprintf("the request ran past its time limit (%s) and its result was not recorded "+
			"(in transactional mode its writes were rolled back); retry with the same key: the request runs again", c.MaxExecution)
	}},
	answerUnreachable: {ErrStoreUnavailable, EventStoreUnavailable, func(c *Config, _ verdict) string {
		return fmt.Sprintf("the idempotency store stopped answering while the request ran, so its result was not recorded; "+
			"retry with the same key: once the store answers and the lease (%s) runs out, the request runs again", c.LeaseDuration)
	}},
	answerReleaseFailed: {ErrStoreUnavailable, EventCompletionFailed, func(_ *Config, v verdict) string {
		return fmt.Sprintf("the request was refused (status %d), but the idempotency store could not release its key; "+
			"retry the same request with the same key", v.status)
	}},
	answerTxAborted: {ErrTxAborted, EventExecuted, func(_ *Config, v verdict) string {
		return fmt.Sprintf("the request failed: a statement in its transaction failed, so its writes were rolled back "+
			"(the server answered %d regardless); retry with the same key: the request runs again", v.status)
	}},
	answerCompletionUnknown: {ErrStoreUnavailable, EventCompletionFailed, func(c *Config, _ verdict) string {
		return fmt.Sprintf("the idempotency store failed while recording the result; "+
			"retry with the same key: it gets the result if it was recorded, or runs again once the lease (%s) runs out", c.LeaseDuration)
	}},
	answerCompletionNotRecorded: {ErrStoreUnavailable, EventCompletionFailed, fixed("the idempotency store failed while recording the result, which was not recorded " +
		"(in transactional mode the request's writes were rolled back with it); retry with the same key: the request runs again")},
	answerCompletionMovedOn: {ErrStoreUnavailable, EventCompletionFailed, fixed("the idempotency store reported an error while recording the result, but the key's record " +
		"has moved on (the result was recorded after all, or another request took the key over); retry with the same key to get its result")},
	answerResponseMissing: {ErrResponseMissing, EventReplayed, fixed("the request with this key succeeded, but its stored response is missing from the idempotency store or damaged there; " +
		"it will not run again: ask the operator to release the key, or use a new key only if you know the first request had no effect")},
	answerSealKeyMissing: {ErrSealKeyMissing, EventReplayed, fixed("the request with this key succeeded, but its stored response is sealed with a key this server " +
		"does not hold; it will not run again: retry later with the same key, or ask the operator")},
	answerSealBroken: {ErrSealBroken, EventReplayed, fixed("the request with this key succeeded, but its stored response failed its integrity check; " +
		"it will not run again: ask the operator")},
	answerRecordDamaged: {ErrRecordDamaged, EventInFlight, fixed("the record of this key is damaged in the idempotency store (it is in progress but has no lease), " +
		"so whether the first request is still running cannot be told; it will not run again: ask the operator")},
	answerCommitFailed: {ErrStoreUnavailable, EventCompletionFailed, fixed("the idempotency store failed while committing the request's writes and result; " +
		"retry with the same key: it gets the result if the commit took effect, or the request runs again")},
	answerOverloaded: {ErrOverloaded, EventOverloaded, fixed("the server has as many requests in progress as it takes; this one was not processed " +
		"(nothing was claimed or run): retry after the Retry-After delay with the same key")},
}

func fixed(s string) func(*Config, verdict) string { return func(*Config, verdict) string { return s } }

// sameOpReusedDetail is the detail of a 422 for the same method and path
// with another payload.
const sameOpReusedDetail = "this " + HeaderKey + " was first used with a different request (its body, query or media type differ); use a new key for a new request"

// keyReusedError is the error of a 422 (ErrKeyReused), its message made
// only when it is read: an HTTP 422 sends a problem, and never reads it.
type keyReusedError struct{ method, path string }

func (e *keyReusedError) Error() string {
	return fmt.Sprintf("%s: the key was first used for %s %q with another payload or operation", ErrKeyReused, e.method, e.path)
}

// Unwrap returns ErrKeyReused.
func (e *keyReusedError) Unwrap() error { return ErrKeyReused }

func (v verdict) event() EventKind {
	switch v.kind {
	case answerReplay:
		return EventReplayed
	case answerRan, answerReleased:
		return 0
	}
	return answers[v.kind].event
}

func (v verdict) problem(c *Config) Problem {
	row := answers[v.kind]
	detail := row.detail(c, v)
	if v.kind == answerKeyReused && v.sameOp {
		detail = sameOpReusedDetail
	}
	p := ProblemFor(row.kind, detail)
	switch {
	case v.kind == answerInFlight:
		p.RetryAfter = v.retryAfter
	case v.kind == answerLeaseLost:
		p.RetryAfter = time.Second
	case p.Status == http.StatusServiceUnavailable:
		p.RetryAfter = c.StoreRetryAfter
	}
	return p
}

// answerFrom is the verdict of the record rec, as the store returned it,
// that a claim of p lost to.
func (c *EngineConfig) answerFrom(ctx context.Context, rec idemdriver.Record, p idemdriver.ClaimParams) verdict {
	return c.answer(ctx, rec, p, false)
}

// errPlainRecord is why a sealed engine without ReplayPlain refuses a
// record stored plain.
var errPlainRecord = fmt.Errorf("%w: the record is stored plain (its seal_key is empty), and this engine holds SealKeys "+
	"and replays sealed records only (EngineConfig.ReplayPlain)", ErrSealBroken)

// answer is answerFrom of rec; opened says that rec's response is opened
// already (the replay cache holds replays as they were answered).
func (c *EngineConfig) answer(ctx context.Context, rec idemdriver.Record, p idemdriver.ClaimParams, opened bool) verdict {
	switch idemdriver.Decide(&rec, false, p) {
	case idemdriver.DecisionReplay:
		if rec.Response == nil {
			// Damaged by hand or by a partial restore: say so, not 409 forever.
			c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record holds no readable response (its response columns are missing or damaged)",
				"scope", p.Scope, "key", p.Key)
			return verdict{kind: answerResponseMissing, rec: rec, err: ErrResponseMissing}
		}
		switch {
		case opened:
		case rec.Response.SealKey == "" && c.keyring != nil && !c.ReplayPlain:
			// Sealing's downgrade: a plain body planted under an emptied
			// seal_key authenticates nothing. A server fault, as a broken seal.
			c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record is stored plain but this engine replays sealed records only; "+
				"answering 500, it is not run again (set ReplayPlain while plain records written before sealing live)",
				"scope", p.Scope, "key", p.Key)
			return verdict{kind: answerSealBroken, rec: rec, err: errPlainRecord}
		case rec.Response.SealKey != "":
			resp, err := c.keyring.OpenResponse(seal.LifeOf(rec), *rec.Response)
			if err != nil {
				// A server fault, never a re-execution: the record stays SUCCEEDED.
				c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record cannot be opened; answering 500, it is not run again",
					"scope", p.Scope, "key", p.Key, "seal_key", rec.Response.SealKey, "err", err)
				kind := answerSealBroken
				if errors.Is(err, ErrSealKeyMissing) {
					kind = answerSealKeyMissing
				}
				return verdict{kind: kind, rec: rec, err: err}
			}
			rec.Response = &resp
		}
		return verdict{kind: answerReplay, rec: rec}
	case idemdriver.DecisionDamaged:
		// Damaged by hand or by a partial restore: no lease says whether its
		// execution runs. A server fault, never a 503 that invites retries
		// forever, and never a takeover.
		c.Logger.ErrorContext(ctx, "idem: a PROCESSING record has no lease bound (locked_until is NULL), so it cannot be told whether "+
			"its execution still runs; answering 500, it is not run (`idem stuck` lists it; release the key once its execution is known)",
			"scope", p.Scope, "key", p.Key, "fencing_token", rec.FencingToken, "owner", rec.Owner)
		return verdict{kind: answerRecordDamaged, rec: rec, err: ErrRecordDamaged}
	case idemdriver.DecisionKeyReused:
		return verdict{kind: answerKeyReused, rec: rec, sameOp: rec.Method == p.Method && rec.Path == p.Path,
			err: &keyReusedError{method: rec.Method, path: rec.Path}}
	}
	ra := c.inFlightRetryAfter(rec.LeaseLeft)
	return verdict{kind: answerInFlight, rec: rec, retryAfter: ra, err: &InFlightError{RetryAfter: ra}}
}

func (c *EngineConfig) inFlightRetryAfter(leaseLeft time.Duration) time.Duration {
	return max(time.Second, min(c.InFlightRetryAfter, leaseLeft, c.LeaseDuration))
}

func (c *EngineConfig) claimFailed(ctx context.Context, err error) verdict {
	if errors.Is(err, idemdriver.ErrUnstorable) {
		c.Logger.ErrorContext(ctx, "idem: the store cannot hold this request's scope", "err", err)
		return verdict{kind: answerUnstorable, err: fmt.Errorf("%w: %w", ErrScopeUnstorable, err)}
	}
	serr := &StoreError{Op: "claim", Err: err}
	c.Logger.ErrorContext(ctx, "idem: store unavailable", "err", serr)
	return verdict{kind: answerClaimFailed, err: serr}
}
