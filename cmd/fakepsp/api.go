package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// handlerConfig is what newHandler wires together.
type handlerConfig struct {
	Store  Store
	Logger *slog.Logger
	// Lease is idem's LeaseDuration; zero means idem's default (30 s).
	Lease time.Duration
	// Latency is how long each charge takes before it is made.
	Latency time.Duration
	// FailRate is the probability that a charge fails with 503 without
	// charging (recorded FAILED by idem: a retry with the key runs again).
	FailRate float64
	// TimeoutRate is the probability that a new charge, once made and
	// recorded, has its answer withheld for Hang (or until the client hangs
	// up): the client's "outcome unknown". A retry with the key gets idem's
	// replay of the charge, never withheld.
	TimeoutRate float64
	// Hang is how long a withheld answer is held before it is sent anyway.
	Hang time.Duration
	// WithoutIdempotency turns the provider's key handling off, as at a
	// provider that has none: POST /v1/charges runs without idem, and every
	// call charges anew, whatever its Idempotency-Key (then optional).
	WithoutIdempotency bool
	// Roll returns a number in [0, 1) for the injections; default rand.Float64.
	Roll func() float64
	// Observer is idem's Options.Engine.Observer (service.Telemetry); nil: none.
	Observer idem.Observer
	// Metrics, when not nil, is served at GET /metrics, without
	// authentication (service.Telemetry.Metrics).
	Metrics http.Handler
}

type api struct {
	store Store
	log   *slog.Logger
	cfg   handlerConfig
	// inProgress counts the createCharge calls running (Stats.InProgress).
	inProgress atomic.Int64
}

// newHandler returns fakepsp's whole HTTP handler:
//
//	service.LogRequests (status 0 when no answer was sent) -> logWithheld
//	  GET /healthz                      (no authentication)
//	  GET /v1/charges/stats             (no authentication: a test-mode view)
//	  GET /metrics                      (no authentication; with cfg.Metrics)
//	  everything else: svc.Authenticate -> routes below
//	    POST /v1/charges                withhold -> idem -> createCharge
//	                                    (Idempotency-Key required; no idem
//	                                    with cfg.WithoutIdempotency)
//	    GET  /v1/charges/{id}
//	    anything else                   404
//
// idem protects the one route with a side effect, not the router: a key
// sent to a mistyped path gets the 404 without a record, so the client can
// correct the request and keep its key.
func newHandler(cfg handlerConfig) (http.Handler, error) {
	if cfg.Roll == nil {
		cfg.Roll = rand.Float64
	}
	mw, err := idem.NewMiddleware(cfg.Store.Idem(), idem.Options{
		Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: cfg.Lease}, Logger: cfg.Logger, Observer: cfg.Observer},
		Scope:  service.Scope,
	})
	if err != nil {
		return nil, err
	}
	a := &api{store: cfg.Store, log: cfg.Logger, cfg: cfg}

	routes := http.NewServeMux()
	charge := mw.Handler(http.HandlerFunc(a.createCharge))
	if cfg.WithoutIdempotency {
		charge = http.HandlerFunc(a.createCharge)
	}
	routes.Handle("POST /v1/charges", a.withhold(charge))
	routes.HandleFunc("GET /v1/charges/{id}", a.getCharge)
	routes.HandleFunc("/", notFound)

	root := http.NewServeMux()
	// GET /healthz: the SQLite file is still the one open, and the
	// database answers a ping.
	root.Handle("GET /healthz", service.Health{API: svc, Log: cfg.Logger, CheckFile: cfg.Store.CheckFile, Probe: cfg.Store.Ping})
	root.HandleFunc("GET /v1/charges/stats", a.stats)
	if cfg.Metrics != nil {
		root.Handle("GET /metrics", cfg.Metrics)
	}
	root.Handle("/", svc.Authenticate(routes))
	return service.LogRequests(cfg.Logger, 0, nil, logWithheld(root)), nil
}

// chargeJSON is a charge as the API shows it: id, merchant, amount,
// currency, customer, description (null when empty), created_at (RFC 3339
// with fractional seconds, UTC).
type chargeJSON struct {
	ID       string `json:"id"`
	Merchant string `json:"merchant"`
	service.AmountJSON
	CreatedAt string `json:"created_at"`
}

func toJSON(c Charge) chargeJSON {
	return chargeJSON{ID: c.ID, Merchant: c.Merchant, AmountJSON: c.AmountJSON(),
		CreatedAt: c.CreatedAt.UTC().Format(time.RFC3339Nano)}
}

// createCharge is POST /v1/charges, run under idem's claim: once per
// (merchant, Idempotency-Key); its answer is recorded with the charge, in
// the same transaction, and replayed.
func (a *api) createCharge(w http.ResponseWriter, r *http.Request) {
	a.inProgress.Add(1)
	defer a.inProgress.Add(-1)
	ctx := r.Context()
	merchant, _ := service.Merchant(ctx)
	body, err := io.ReadAll(r.Body)
	if err != nil {
		a.releaseKey(ctx)
		svc.WriteProblem(w, service.ProblemInvalidRequest, http.StatusBadRequest, "the request body could not be read")
		return
	}
	in, err := parseChargeInput(r.Header.Get("Content-Type"), body)
	if err != nil {
		a.releaseKey(ctx)
	}
	if err != nil {
		svc.WriteInputError(w, err, (*inputError).Error)
		return
	}

	if a.cfg.Latency > 0 {
		t := time.NewTimer(a.cfg.Latency)
		select {
		case <-ctx.Done(): // idem's lease was lost
			t.Stop()
			svc.WriteProblem(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the charge was interrupted")
			return
		case <-t.C:
		}
	}
	if a.cfg.FailRate > 0 && a.cfg.Roll() < a.cfg.FailRate {
		a.log.WarnContext(ctx, "fault injected: failing the charge without charging", "merchant", merchant)
		svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the card network did not answer; nothing was charged; retry with the same Idempotency-Key")
		return
	}
	c, err := a.store.CreateCharge(ctx, NewCharge{
		ID: service.NewID("ch"), Merchant: merchant, Amount: in.Amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description,
	})
	if err != nil {
		a.log.ErrorContext(ctx, "recording the charge", "err", err)
		svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the charge could not be recorded; nothing was charged; retry with the same Idempotency-Key")
		return
	}
	exec, protected := idem.ExecutionFromContext(ctx)
	if !protected { // WithoutIdempotency: the key, if any, as sent
		exec.Key = r.Header.Get(idem.HeaderKey)
	}
	a.log.InfoContext(ctx, "charged", "merchant", merchant, "charge", c.ID, "amount", c.Amount, "currency", c.Currency,
		"idempotency_key", exec.Key, "attempt", exec.Attempt)
	w.Header().Set("Location", "/v1/charges/"+c.ID)
	svc.WriteJSON(w, http.StatusCreated, toJSON(c))
}

// releaseKey asks idem not to record this execution's answer: a
// validation failure, before any charge, so the corrected request with the
// same key runs instead of getting 422 key-reused.
func (a *api) releaseKey(ctx context.Context) {
	if err := idem.ReleaseKey(ctx); err != nil && !a.cfg.WithoutIdempotency {
		a.log.ErrorContext(ctx, "releasing the key of an invalid charge", "err", err)
	}
}

// getCharge is GET /v1/charges/{id}: one of the merchant's charges.
func (a *api) getCharge(w http.ResponseWriter, r *http.Request) {
	merchant, _ := service.Merchant(r.Context())
	c, err := a.store.Charge(r.Context(), merchant, r.PathValue("id"))
	switch {
	case errors.Is(err, ErrNotFound):
		svc.WriteProblem(w, service.ProblemNotFound, http.StatusNotFound, fmt.Sprintf("no charge %q", r.PathValue("id")))
	case err != nil:
		a.log.ErrorContext(r.Context(), "reading a charge", "err", err)
		svc.WriteProblem(w, service.ProblemInternal, http.StatusInternalServerError, "the charge could not be read")
	default:
		svc.WriteJSON(w, http.StatusOK, toJSON(c))
	}
}

// stats is GET /v1/charges/stats: the distinct charges made, per merchant
// and in total, e.g.
// {"merchants":{"acme":{"charges":3,"amount":{"JPY":3000}}},"charges":3,"in_progress":0},
// each amount the exact sum (a JSON number past 2^63 if need be). 503 when
// the database fails.
func (a *api) stats(w http.ResponseWriter, r *http.Request) {
	inProgress := a.inProgress.Load() // before the count: a charge made meanwhile is counted, or still in progress
	st, err := a.store.Stats(r.Context())
	if err != nil {
		a.log.ErrorContext(r.Context(), "counting charges", "err", err)
		svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the database failed while counting the charges; retry later")
		return
	}
	st.InProgress = inProgress
	svc.WriteJSON(w, http.StatusOK, st)
}

func notFound(w http.ResponseWriter, r *http.Request) {
	svc.WriteProblem(w, service.ProblemNotFound, http.StatusNotFound, fmt.Sprintf("no resource at %s %s", r.Method, r.URL.Path))
}
