package main

// The "before" picture: --naive replaces idem's middleware with the
// idempotency middleware of the common blog article, a response cache in
// Redis:
//
//	GET key -> hit: replay the stored response
//	        -> miss: run the handler, then SET key response EX ttl
//
// It takes no lock at all; that is the point. cmd/idemstorm runs the same
// storm against it and against idem and counts the double charges
// (README.md, "The storm: the Redis cache and idem, side by side").
//
// Its failure modes (the storm and naive_test.go reproduce the first five):
//
//   - Concurrent duplicates: a retry that arrives while the first request
//     is still running finds no entry (nothing is stored until the handler
//     is done) and runs the payment again: a second charge and a second
//     payment. Four concurrent duplicates of a 200 ms charge make four.
//   - A client that times out and retries during the charge: the same.
//   - A process that dies between the charge and the SET (SIGKILL, OOM,
//     deploy): nothing was stored, the retry charges again. The provider
//     cannot deduplicate, because the handler never saw the client's key
//     and sends a new one on every execution (it could forward the raw key,
//     which would leak the client's key to a third party and still double
//     the ledger on a crash after the charge).
//   - No fingerprint: the same key with another body replays the first
//     body's response (idem answers 422 key-reused).
//   - Fails open: when Redis does not answer, the request runs unprotected
//     (what such middleware does so as "not to take the API down"); idem
//     fails closed with 503.
//   - The entry lives for a TTL in memory that Redis may evict (maxmemory
//     policies): after that, or after a Redis restart without persistence,
//     a retry runs again.
//   - The payment rows commit in a transaction of their own
//     (WriteSeparate) and the cached response is written after the commit,
//     in another system: there is no atomic "rows and outcome".
//
// Keys are per merchant (scope + Idempotency-Key), which is kinder than the
// article, whose cache key is the header alone: there, two merchants that
// pick the same key get each other's responses.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/naivecache"
	"github.com/idemgo/idem/cmd/internal/service"
)

// DefaultRedisURL is --redis-url's default.
const DefaultRedisURL = "redis://127.0.0.1:6379/0"

// DefaultNaiveTTL is --naive-ttl's default: how long the naive cache keeps a
// response (the article's 24 hours).
const DefaultNaiveTTL = 24 * time.Hour

// naiveKeyPrefix starts every Redis key the naive middleware writes.
const naiveKeyPrefix = "paymentsd:naive:"

// naiveOptions are the flags of the naive mode. The zero value is the
// default: off, DefaultRedisURL, DefaultNaiveTTL.
type naiveOptions struct {
	enabled  bool
	redisURL string        // "" means DefaultRedisURL
	ttl      time.Duration // 0 means DefaultNaiveTTL
}

// registerNaiveFlags adds --naive, --redis-url and --naive-ttl to fs.
func registerNaiveFlags(fs *flag.FlagSet, o *naiveOptions) {
	fs.BoolVar(&o.enabled, "naive", false,
		"for comparison only: replace idem with the naive Redis response cache (GET key, run, SET key; no lock), which double-charges concurrent retries (see naive.go); --lease, --relay-secret and --write-mode do not apply")
	fs.StringVar(&o.redisURL, "redis-url", "", "the Redis server of --naive, redis://[user:password@]host:port/db (default "+DefaultRedisURL+")")
	fs.DurationVar(&o.ttl, "naive-ttl", 0, "how long --naive keeps a response in Redis (default "+DefaultNaiveTTL.String()+")")
}

// url returns the Redis URL, DefaultRedisURL when none was given.
func (o naiveOptions) url() string {
	if o.redisURL == "" {
		return DefaultRedisURL
	}
	return o.redisURL
}

// cacheTTL returns the TTL, DefaultNaiveTTL when none was given.
func (o naiveOptions) cacheTTL() time.Duration {
	if o.ttl == 0 {
		return DefaultNaiveTTL
	}
	return o.ttl
}

// validate checks the naive options once parsed.
func (o naiveOptions) validate() error {
	if o.ttl != 0 && o.ttl < time.Second {
		return errors.New("--naive-ttl must be at least 1s")
	}
	if _, err := redis.ParseURL(o.url()); err != nil {
		return fmt.Errorf("--redis-url: %w", err)
	}
	return nil
}

// describe names the naive mode for the log, without credentials.
func (o naiveOptions) describe() string {
	opt, err := redis.ParseURL(o.url())
	if err != nil {
		return "naive"
	}
	return fmt.Sprintf("naive (Redis %s db %d, TTL %s)", opt.Addr, opt.DB, o.cacheTTL())
}

// naiveCache is the article's middleware (naivecache.Middleware): on a
// protected request (POST or PATCH with an Idempotency-Key) it replays the
// cached response of (merchant, key) when there is one; otherwise it runs
// next and caches its response when it is not a 5xx. A cache error on GET
// runs next anyway (fail open); one on SET is logged and ignored.
func naiveCache(cache naivecache.Cache, ttl time.Duration, log *slog.Logger, next http.Handler) http.Handler {
	return naivecache.Middleware(naivecache.Config{Cache: cache, TTL: ttl, Log: log, Key: func(r *http.Request) string {
		key := r.Header.Get(idem.HeaderKey)
		if (r.Method != http.MethodPost && r.Method != http.MethodPatch) || key == "" {
			return ""
		}
		merchant, _ := service.Merchant(r.Context())
		return naiveKeyPrefix + merchant + ":" + key
	}}, next)
}

// newNaiveHandler is newHandler with the naive cache in idem's place:
//
//	service.LogRequests
//	  GET /healthz                      (no authentication)
//	  everything else: svc.Authenticate -> routes below
//	    POST /v1/payments               fault injection -> naiveCache -> createPaymentNaive
//	    GET  /v1/payments/{id}, GET /v1/payments?limit=N, GET /v1/balance (as in newHandler)
//
// cfg.Lease, cfg.RelaySecret and cfg.WriteMode are ignored: there is no
// claim, no relayed key, and the rows always commit on their own.
func newNaiveHandler(cfg handlerConfig, cache naivecache.Cache, ttl time.Duration) (http.Handler, error) {
	if cache == nil {
		return nil, errors.New("naive mode needs a cache")
	}
	if ttl <= 0 {
		ttl = DefaultNaiveTTL
	}
	a := &api{store: cfg.Store, provider: cfg.Provider, log: cfg.Logger, writeMode: WriteSeparate, faults: cfg.Faults, metrics: cfg.Metrics}

	return a.serve(a.routes(cfg.Faults.wrap(naiveCache(cache, ttl, cfg.Logger, http.HandlerFunc(a.createPaymentNaive))))), nil
}

// createPaymentNaive is POST /v1/payments as the article writes it: charge,
// write the payment in a plain transaction, answer 201. It runs on every
// request the cache misses. The crash points before-charge, after-charge
// and after-write apply as in createPayment.
func (a *api) createPaymentNaive(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	merchant, _ := service.Merchant(ctx)
	if r.Header.Get(idem.HeaderKey) == "" {
		svc.WriteProblem(w, service.ProblemInvalidRequest, http.StatusBadRequest, "send an Idempotency-Key header")
		return
	}
	in, ok := readPayment(w, r, io.LimitReader(r.Body, idem.DefaultMaxRequestBytes+1))
	if !ok {
		return
	}

	a.faults.beforeCharge(ctx)
	// No relayed key: each execution asks for a new charge.
	providerKey := service.NewID("naive")
	charge, err := a.provider.Charge(ctx, in.chargeRequest(providerKey, merchant))
	if err != nil {
		a.providerFailed(w, r, providerKey, err)
		return
	}
	a.faults.afterCharge(ctx, charge.ID)
	a.faults.stall(ctx)
	p, err := a.store.CreatePayment(ctx, in.payment(merchant, charge.ID), WriteSeparate)
	if err != nil {
		a.storeFailed(w, r, "recording the payment", err)
		return
	}
	a.faults.afterWrite(ctx, charge.ID, p.ID, WriteSeparate)
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	svc.WriteJSON(w, http.StatusCreated, toJSON(p))
}
