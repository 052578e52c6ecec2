package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/naivecache"
	"github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver/idemsql"
)

// The routes of the server under test, one per way of serving POST
// /payments (see the variants in variants.go).
const (
	routeBare      = "/bare/payments"           // no idempotency; the handler commits its own transaction
	routeClaimTx   = "/idem-tx/payments"        // idem; the handler writes in the claim's transaction
	routeOwnTx     = "/idem-own/payments"       // idem; the handler commits its own transaction
	routeOneCommit = "/idem-1c/payments"        // idem in the one-commit mode; the handler writes in the claim's transaction
	routeFloor     = "/floor/payments"          // idem's statements sent by hand
	routeFloor1c   = "/floor-1c/payments"       // the one-commit mode's statements sent by hand
	routeFloorRead = "/floor-read/payments"     // the replay floor: the record read by hand, its response sent
	routeContract  = "/floor-contract/payments" // the contract floor: the replay floor with what the contract asks of an answer
	routeNaive     = "/naive/payments"          // the article's naive Redis cache
	routeHold      = "/hold/payments"           // idem; the handler waits for release (409s)
	routeCached    = "/idem-cached/payments"    // idem with a replay cache; the handler writes in the claim's transaction
	routeWait      = "/idem-wait/payments"      // idem in wait mode (Waiting.Wait); the handler writes in the claim's transaction
	routeStep      = "/idem-step/payments"      // idem; a step (idem.Step) before the writes in the claim's transaction
	routeStepKept  = "/idem-step-kept/payments" // the same with the request kept for a re-drive (Request.KeepForRedrive)
)

// The request of every variant: a payment as cmd/paymentsd takes it.
var (
	paymentBody      = []byte(`{"amount":1000,"currency":"JPY","customer":"cus_42","description":"Order #1001"}`)
	otherPaymentBody = []byte(`{"amount":2000,"currency":"JPY","customer":"cus_42","description":"Order #1001"}`)
)

// merchant is the scope of every request (Authorization: Bearer sk_test_<merchant>).
const merchant = "acme"

// scopeOf is Options.Scope: the merchant of the bearer token, as
// cmd/paymentsd's authentication gives it.
func scopeOf(r *http.Request) (string, error) {
	m, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer sk_test_")
	if !ok || m == "" {
		return "", errors.New("no bearer token sk_test_<merchant>")
	}
	return m, nil
}

// paymentInput is the request body.
type paymentInput struct {
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
}

// paymentJSON is the 201 body: 176 bytes for paymentBody, as the benchmark's
// handler answers.
type paymentJSON struct {
	ID          string  `json:"id"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
	Status      string  `json:"status"`
	CreatedAt   string  `json:"created_at"`
}

// replayCacheBytes is the replay cache of routeCached's middleware.
const replayCacheBytes = 16 << 20

// waitModeWait is routeWait's Waiting.Wait: cmd/paymentsd's --max-wait.
const waitModeWait = 10 * time.Second

// app serves the routes above on one target.
type app struct {
	t     *target
	mw    *idem.Middleware
	mw1c  *idem.Middleware // Options.Engine.OneCommit.Enabled
	mwRC  *idem.Middleware // Options.Replay.Cache.Bytes
	mwW   *idem.Middleware // Options.Engine.Waiting.Wait: waitModeWait
	mwK   *idem.Middleware // Options.Request.KeepForRedrive
	naive *naiveCache      // nil without Redis
	hold  holdGate
	log   *slog.Logger
}

func newApp(t *target, naive *naiveCache, log *slog.Logger) (*app, error) {
	mw, err := idem.NewMiddleware(t.store, idem.Options{Engine: idem.EngineOptions{Logger: log}, Scope: scopeOf})
	if err != nil {
		return nil, err
	}
	mw1c, err := idem.NewMiddleware(t.store, idem.Options{Engine: idem.EngineOptions{Logger: log, OneCommit: idem.OneCommitOptions{Enabled: true}}, Scope: scopeOf})
	if err != nil {
		return nil, err
	}
	mwRC, err := idem.NewMiddleware(t.store, idem.Options{Engine: idem.EngineOptions{Logger: log}, Scope: scopeOf, Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: replayCacheBytes}}})
	if err != nil {
		return nil, err
	}
	mwW, err := idem.NewMiddleware(t.store, idem.Options{Engine: idem.EngineOptions{Logger: log, Waiting: idem.WaitOptions{Wait: waitModeWait}}, Scope: scopeOf})
	if err != nil {
		return nil, err
	}
	mwK, err := idem.NewMiddleware(t.store, idem.Options{Engine: idem.EngineOptions{Logger: log}, Scope: scopeOf,
		Request: idem.RequestOptions{KeepForRedrive: true}})
	if err != nil {
		return nil, err
	}
	return &app{t: t, mw: mw, mw1c: mw1c, mwRC: mwRC, mwW: mwW, mwK: mwK, naive: naive, log: log}, nil
}

func (a *app) routes() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST "+routeBare, http.HandlerFunc(a.createOwnTx))
	mux.Handle("POST "+routeClaimTx, a.mw.Handler(http.HandlerFunc(a.createInClaimTx)))
	mux.Handle("POST "+routeOwnTx, a.mw.Handler(http.HandlerFunc(a.createOwnTx)))
	mux.Handle("POST "+routeOneCommit, a.mw1c.Handler(http.HandlerFunc(a.createInClaimTx)))
	mux.Handle("POST "+routeCached, a.mwRC.Handler(http.HandlerFunc(a.createInClaimTx)))
	mux.Handle("POST "+routeWait, a.mwW.Handler(http.HandlerFunc(a.createInClaimTx)))
	mux.Handle("POST "+routeStep, a.mw.Handler(http.HandlerFunc(a.createAfterStep)))
	mux.Handle("POST "+routeStepKept, a.mwK.Handler(http.HandlerFunc(a.createAfterStep)))
	mux.Handle("POST "+routeFloor, http.HandlerFunc(a.createFloor))
	mux.Handle("POST "+routeFloor1c, http.HandlerFunc(a.createFloor1c))
	mux.Handle("POST "+routeFloorRead, http.HandlerFunc(a.floorReplay))
	mux.Handle("POST "+routeContract, http.HandlerFunc(a.floorContract))
	mux.Handle("POST "+routeHold, a.mw.Handler(http.HandlerFunc(a.held)))
	if a.naive != nil {
		mux.Handle("POST "+routeNaive, a.naive.wrap(http.HandlerFunc(a.createOwnTx)))
	}
	return mux
}

// payment is one payment about to be written.
type payment struct {
	id      string
	in      paymentInput
	created time.Time
}

func newPayment(body io.Reader) (payment, error) {
	var p payment
	if err := json.NewDecoder(body).Decode(&p.in); err != nil {
		return p, err
	}
	u, err := uuid.NewV7()
	if err != nil {
		return p, err
	}
	p.id, p.created = "pay_"+u.String(), time.Now().UTC()
	return p, nil
}

// write inserts the payment row and its ledger row in tx.
func (a *app) write(ctx context.Context, tx bizTx, scope string, p payment) error {
	us := p.created.UnixMicro()
	if err := tx.exec(ctx, a.t.insertPayment, p.id, scope, p.in.Amount, p.in.Currency, p.in.Customer, p.in.Description, us); err != nil {
		return err
	}
	return tx.exec(ctx, a.t.insertLedger, p.id, scope, p.in.Amount, us)
}

func (p payment) response() []byte {
	b, _ := json.Marshal(paymentJSON{
		ID: p.id, Amount: p.in.Amount, Currency: p.in.Currency, Customer: p.in.Customer,
		Description: p.in.Description, Status: "succeeded", CreatedAt: p.created.Format(time.RFC3339),
	})
	return b
}

func (p payment) respond(w http.ResponseWriter, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/payments/"+p.id)
	w.WriteHeader(http.StatusCreated)
	_, _ = w.Write(body)
}

func (a *app) fail(w http.ResponseWriter, status int, err error) {
	a.log.Error("idembench: handler", "err", err)
	http.Error(w, err.Error(), status)
}

// createOwnTx is the bare handler: one transaction of its own (payment +
// ledger row), committed, then 201.
func (a *app) createOwnTx(w http.ResponseWriter, r *http.Request) { a.create(w, r, a.t.begin, true) }

// createInClaimTx writes in the claim's transaction and leaves the commit to
// idem (durable-claim mode, CONTRACT section 6).
func (a *app) createInClaimTx(w http.ResponseWriter, r *http.Request) {
	a.create(w, r, a.t.claimTx, false)
}

// createAfterStep runs one step (idem.Step: its start and its result
// committed, the function itself doing nothing, as a provider call that
// costs no time), then writes in the claim's transaction as
// createInClaimTx does: what a step adds to a first execution.
func (a *app) createAfterStep(w http.ResponseWriter, r *http.Request) {
	if _, err := idem.Step(r.Context(), "charge", func(context.Context) (string, error) { return "ch_bench", nil }); err != nil {
		a.fail(w, http.StatusInternalServerError, err)
		return
	}
	a.createInClaimTx(w, r)
}

// create writes the payment and its ledger row in the transaction open
// gives, commits it when commit is set, and answers 201.
func (a *app) create(w http.ResponseWriter, r *http.Request, open func(context.Context) (bizTx, error), commit bool) {
	ctx := r.Context()
	scope, _ := scopeOf(r)
	p, err := newPayment(r.Body)
	if err != nil {
		a.fail(w, http.StatusBadRequest, err)
		return
	}
	tx, err := open(ctx)
	if err != nil {
		a.fail(w, http.StatusInternalServerError, err)
		return
	}
	err = a.write(ctx, tx, scope, p)
	if err == nil && commit {
		err = tx.commit(ctx)
	} else if err != nil && commit {
		_ = tx.rollback(ctx)
	}
	if err != nil {
		a.fail(w, http.StatusInternalServerError, err)
		return
	}
	p.respond(w, p.response())
}

// floorHeaders are the stored headers of the floor's completion.
func floorHeaders(p payment) ([]byte, error) {
	return idemsql.EncodeHeader(map[string][]string{
		"Content-Type": {"application/json"}, "Location": {"/v1/payments/" + p.id},
	})
}

// createFloor is "the floor": the statements idem needs for a first
// execution in durable-claim mode that writes in the claim's transaction,
// sent by hand with no middleware: the claim (an INSERT of the PROCESSING
// record, committed on its own), then the business transaction with the
// completion (an UPDATE by primary key and fencing token) before its COMMIT.
// The request is read whole and hashed (SHA-256) for the fingerprint column,
// as any claim must.
func (a *app) createFloor(w http.ResponseWriter, r *http.Request) { a.hashedFloor(w, r, false) }

// createFloor1c is the one-commit mode's floor: the same statements in one
// transaction, the claim INSERT first (it takes the key's lock until the
// COMMIT), then the business writes and the completion. It sets no lock
// bound and sends every statement on its own (pgx's Begin sends BEGIN
// alone): idem's one-commit claim also bounds the wait, in the claim
// statement, and goes with the BEGIN.
func (a *app) createFloor1c(w http.ResponseWriter, r *http.Request) { a.hashedFloor(w, r, true) }

// hashedFloor serves createFloor (oneCommit false) and createFloor1c: the
// request read whole, its SHA-256 the fingerprint.
func (a *app) hashedFloor(w http.ResponseWriter, r *http.Request, oneCommit bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, idem.DefaultMaxRequestBytes))
	if err != nil {
		a.fail(w, http.StatusBadRequest, err)
		return
	}
	fp := sha256.Sum256(body)
	a.floor(w, r, oneCommit, body, fp[:])
}

// floor is the floors' first execution of the request r whose body and
// fingerprint its caller read.
func (a *app) floor(w http.ResponseWriter, r *http.Request, oneCommit bool, body, fp []byte) {
	ctx := r.Context()
	var tx bizTx
	abort := func(status int, err error) {
		if tx != nil {
			_ = tx.rollback(ctx)
		}
		a.fail(w, status, err)
	}
	scope, _ := scopeOf(r)
	key := r.Header.Get(idem.HeaderKey)
	var err error
	if oneCommit {
		if tx, err = a.t.begin(ctx); err != nil {
			abort(http.StatusInternalServerError, err)
			return
		}
	}
	// The claim: on its own (tx nil), or the one-commit transaction's first
	// statement.
	claimed, err := a.t.floorClaim(ctx, tx, scope, key, r.URL.EscapedPath(), fp)
	switch {
	case err != nil:
		abort(http.StatusServiceUnavailable, err)
		return
	case !claimed: // not an error: no log
		if tx != nil {
			_ = tx.rollback(ctx)
		}
		http.Error(w, "key in use", http.StatusConflict)
		return
	}
	p, err := newPayment(bytes.NewReader(body))
	if err != nil {
		abort(http.StatusBadRequest, err)
		return
	}
	if tx == nil {
		if tx, err = a.t.begin(ctx); err != nil {
			abort(http.StatusInternalServerError, err)
			return
		}
	}
	resp := p.response()
	headers, err := floorHeaders(p)
	if err == nil {
		err = a.write(ctx, tx, scope, p)
	}
	if err == nil {
		err = a.t.floorComplete(ctx, tx, scope, key, http.StatusCreated, headers, resp)
	}
	if err != nil {
		abort(http.StatusInternalServerError, err)
		return
	}
	if err := tx.commit(ctx); err != nil {
		a.fail(w, http.StatusInternalServerError, err)
		return
	}
	p.respond(w, resp)
}

// floorReplay is "the replay floor": what answering a retry of an existing
// key cannot do without, by hand with no middleware. The request is read
// whole and hashed (SHA-256), the record read with one prepared SELECT by
// primary key (target.floorRead), and the answer is the stored response,
// headers and body as stored, with Idempotent-Replayed: true; a record in
// flight is answered 409 and one of another request 422, in plain text. No
// claim: it can answer only a key that exists, which is all the replay, 409
// and 422 variants send.
func (a *app) floorReplay(w http.ResponseWriter, r *http.Request) {
	scope, _ := scopeOf(r)
	body, err := io.ReadAll(io.LimitReader(r.Body, idem.DefaultMaxRequestBytes))
	if err != nil {
		a.fail(w, http.StatusBadRequest, err)
		return
	}
	fp := sha256.Sum256(body)
	rec, found, err := a.t.floorRead(r.Context(), scope, r.Header.Get(idem.HeaderKey))
	switch {
	case err != nil:
		a.fail(w, http.StatusServiceUnavailable, err)
		return
	case !found:
		a.fail(w, http.StatusInternalServerError, errors.New("the replay floor read no record"))
		return
	}
	a.answerRecord(w, rec, fp[:], "")
}

// answerRecord is the floors' answer from the record rec of a request whose
// fingerprint is fp: 422 for another request's record and 409 for one in
// flight, in plain text; else the stored response, headers and body as
// stored, with Idempotent-Replayed: true and, when key is not "" (the
// contract floor), Idempotency-Key: key and Idempotency-Key-Expires.
func (a *app) answerRecord(w http.ResponseWriter, rec floorRecord, fp []byte, key string) {
	switch {
	case !bytes.Equal(rec.fingerprint, fp):
		http.Error(w, "key reused with another request", http.StatusUnprocessableEntity)
		return
	case rec.state != "SUCCEEDED":
		http.Error(w, "key in flight", http.StatusConflict)
		return
	}
	h, err := idemsql.DecodeHeader(rec.headers)
	if err != nil {
		a.fail(w, http.StatusInternalServerError, err)
		return
	}
	for name, values := range h {
		w.Header()[name] = values
	}
	if key != "" {
		w.Header().Set(idem.HeaderKey, key)
		w.Header().Set(idem.HeaderKeyExpires, rec.expires.UTC().Format(http.TimeFormat))
	}
	w.Header().Set(idem.HeaderReplayed, "true")
	w.WriteHeader(rec.status)
	_, _ = w.Write(rec.body)
}

// floorContract is "the contract floor": the replay floor with what the
// contract requires of every answer from a record, by hand with no
// middleware, so that idem's answers can be measured against the same work
// done without idem's engine. Beyond floorReplay it parses the key
// (idem.ParseKey: 400 for a bad one), takes the fingerprint idem takes
// (fingerprint.Request: RFC 8785 form of a JSON body, method, path, query
// and media type), bounds the read as idem bounds its claim (the request's
// hang-up detached, DefaultClaimTimeout; 503 past it), replays only a
// record that has not expired (contractRead) and echoes the key and its
// expiry (Idempotency-Key, Idempotency-Key-Expires: CONTRACT section 5). A
// key it does not find runs the floor's first execution (its keys are
// completed through it in setup). It answers 409 and 422 in plain text,
// as floorReplay does: only its replay is measured.
func (a *app) floorContract(w http.ResponseWriter, r *http.Request) {
	scope, _ := scopeOf(r)
	key, err := idem.ParseKey(r.Header.Values(idem.HeaderKey))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, idem.DefaultMaxRequestBytes))
	if err != nil {
		a.fail(w, http.StatusBadRequest, err)
		return
	}
	fp := fingerprint.Request(r, body)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), idem.DefaultClaimTimeout)
	rec, found, err := a.t.contractRead(ctx, scope, key)
	cancel()
	switch {
	case err != nil:
		a.fail(w, http.StatusServiceUnavailable, err)
		return
	case !found:
		a.floor(w, r, false, body, fp)
		return
	}
	a.answerRecord(w, rec, fp, r.Header.Get(idem.HeaderKey))
}

// holdGate keeps one protected request inside its handler while the 409
// variant runs: its key is PROCESSING under a live lease (renewed by idem's
// heartbeat), so every duplicate is answered 409.
type holdGate struct {
	mu      sync.Mutex
	entered chan struct{}
	release chan struct{}
}

// arm prepares the gate for the next held request.
func (g *holdGate) arm() (entered, release chan struct{}) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.entered, g.release = make(chan struct{}), make(chan struct{})
	return g.entered, g.release
}

func (a *app) held(w http.ResponseWriter, r *http.Request) {
	a.hold.mu.Lock()
	entered, release := a.hold.entered, a.hold.release
	a.hold.mu.Unlock()
	if entered == nil {
		a.fail(w, http.StatusInternalServerError, errors.New("the hold route ran unarmed"))
		return
	}
	close(entered)
	select {
	case <-release:
	case <-r.Context().Done():
	}
	w.WriteHeader(http.StatusNoContent)
}

// naiveCache is the article's naive idempotency middleware, for comparison
// only (cmd/internal/naivecache, the one cmd/paymentsd's --naive runs): GET the
// key from Redis; on a hit replay the stored response; on a miss run the
// handler and SET its response with a TTL. No lock, no fingerprint, fails open: it double-executes concurrent
// duplicates (README, "Why not cache the response in Redis?").
type naiveCache struct {
	rdb    *redis.Client
	prefix string
	ttl    time.Duration
}

func openNaiveCache(ctx context.Context, rawURL, prefix string) (*naiveCache, string, error) {
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, "", fmt.Errorf("redis: %w", err)
	}
	c := redis.NewClient(opt)
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return nil, "", fmt.Errorf("redis %s: %w", opt.Addr, errors.Join(err, c.Close()))
	}
	version := "Redis"
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			version = "Redis " + v
		}
	}
	// The TTL outlives any run: an entry that expired mid-run would turn a
	// replay into a first execution.
	return &naiveCache{rdb: c, prefix: prefix, ttl: 6 * time.Hour}, version, nil
}

// close removes the run's entries (every key under the prefix) and closes
// the client.
func (n *naiveCache) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	iter := n.rdb.Scan(ctx, 0, n.prefix+"*", 1000).Iterator()
	var batch []string
	var err error
	for iter.Next(ctx) {
		if batch = append(batch, iter.Val()); len(batch) == 1000 {
			err = cmp.Or(err, n.rdb.Unlink(ctx, batch...).Err())
			batch = batch[:0]
		}
	}
	if len(batch) > 0 {
		err = cmp.Or(err, n.rdb.Unlink(ctx, batch...).Err())
	}
	return errors.Join(err, iter.Err(), n.rdb.Close())
}

// wrap is naivecache.Middleware on (scope, Idempotency-Key) of any request
// with the header; Redis errors are ignored (a miss runs the handler, fail
// open).
func (n *naiveCache) wrap(next http.Handler) http.Handler {
	return naivecache.Middleware(naivecache.Config{Cache: &naivecache.Redis{Client: n.rdb}, TTL: n.ttl, Key: func(r *http.Request) string {
		key := r.Header.Get(idem.HeaderKey)
		if key == "" {
			return ""
		}
		scope, _ := scopeOf(r)
		return n.prefix + scope + ":" + key
	}}, next)
}
