package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"net/http"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/completer"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemotel"
	"github.com/idemgo/idem/seal"
)

// List limits of GET /v1/payments.
const (
	DefaultListLimit = 10
	MaxListLimit     = 100
)

// healthProbe is the merchant, scope and key that GET /healthz reads: none
// exists (merchant names are sk_test_ suffixes, never empty).
const healthProbe = ""

// handlerConfig is what newHandler wires together.
type handlerConfig struct {
	Store    Store
	Provider Provider
	Logger   *slog.Logger
	// Lease is idem's LeaseDuration; zero means idem's default (30 s).
	Lease time.Duration
	// RelaySecret is idem's Options.Engine.RelaySecret: it keys the derivation of
	// the Idempotency-Key relayed to the provider. Empty: plain SHA-256.
	RelaySecret []byte
	// WriteMode says where the payment's rows are written; empty means
	// WriteInClaim.
	WriteMode WriteMode
	// Wait and MaxWait are idem's EngineOptions.Waiting.Wait and MaxWait: how long a
	// duplicate of a payment in flight waits for its outcome (zero: 409 at
	// once), and the most a request may ask for with Prefer: wait.
	Wait, MaxWait time.Duration
	// MaxInFlight is idem's EngineOptions.Admission.MaxInFlight, for each protected
	// route: zero, no bound.
	MaxInFlight int
	// Faults are the injected crashes and stalls (built with -tags
	// idemfaults only); nil injects none.
	Faults *faults
	// Observer is idem's Options.Engine.Observer (service.Telemetry); nil: none.
	Observer idem.Observer
	// Metrics, when not nil, is served at GET /metrics, without
	// authentication (service.Telemetry.Metrics).
	Metrics http.Handler
	// SealKeys, ReplayPlain, KeyHashSecret and KeepRequestBytes are idem's
	// (docs/sealing.md); zero: plain records, plain keys, no request kept
	// (with SealKeys, sealed records only).
	SealKeys         []seal.Key
	ReplayPlain      bool
	KeyHashSecret    []byte
	KeepRequestBytes int64
	// AtMostOnceCharge declares the charge an at-most-once step
	// (idem.AtMostOnce), for a provider without idempotency: never sent
	// twice; a charge whose outcome is unknown holds the payment UNKNOWN
	// (409 outcome-unknown) until an operator resolves it (idem resolve).
	AtMostOnceCharge bool
	// Completer, when not nil, keeps each payment's request at its charge
	// (idem's RequestOptions.KeepForRedrive) and configures the completer
	// that finishes the payments whose client went away (newService).
	Completer *completer.Config
	// MeterProvider, when not nil, takes the completer's counter
	// (idemotel.NewCompleterCounter).
	MeterProvider metric.MeterProvider
}

// api serves the payments API.
type api struct {
	store     Store
	provider  Provider
	log       *slog.Logger
	writeMode WriteMode
	// atMostOnce: the charge is an at-most-once step (AtMostOnceCharge).
	atMostOnce bool
	faults     *faults
	metrics    http.Handler
	// storedKey is idem's Engine.StoredKey: the request log names a key as
	// idem stores it (hashed with --key-hash-secret).
	storedKey func(string) string
}

// newHandler returns the service's whole HTTP handler:
//
//	service.LogRequests
//	  GET /healthz                      (no authentication)
//	  GET /metrics                      (no authentication; with cfg.Metrics)
//	  everything else: svc.Authenticate -> routes below
//	    POST /v1/payments               fault injection -> idem -> createPayment
//	                                    (Idempotency-Key required)
//	    POST /v1/payment_intents        Stripe-compatible (stripe.go)
//	    GET  /v1/payments/{id}
//	    GET  /v1/payments?limit=N
//	    GET  /v1/balance
//	    anything else                   404 or 405
//
// idem protects the one route with a side effect, not the router: a key
// sent to a mistyped path or with another method gets the 404 or 405
// without a record, so the client can correct the request and keep its key.
func newHandler(cfg handlerConfig) (http.Handler, error) {
	h, _, err := newService(cfg)
	return h, err
}

// newService is newHandler, and the completer of its payments when
// cfg.Completer is set (not started).
func newService(cfg handlerConfig) (http.Handler, *completer.Completer, error) {
	mw, err := idem.NewMiddleware(cfg.idemOptions())
	if err != nil {
		return nil, nil, err
	}
	if cfg.WriteMode == "" {
		cfg.WriteMode = WriteInClaim
	}
	a := &api{store: cfg.Store, provider: cfg.Provider, log: cfg.Logger, writeMode: cfg.WriteMode, faults: cfg.Faults, metrics: cfg.Metrics,
		atMostOnce: cfg.AtMostOnceCharge,
		storedKey:  mw.Engine().StoredKey}
	routes := a.routes(cfg.Faults.wrap(mw.Handler(http.HandlerFunc(a.createPayment))))
	if err := a.stripeRoutes(routes, cfg); err != nil { // POST /v1/payment_intents (stripe.go)
		return nil, nil, err
	}
	var c *completer.Completer
	if cfg.Completer != nil {
		// The completer re-drives through the authenticated routes, its
		// Context standing for the authentication.
		cc := *cfg.Completer
		cc.Handler = routes
		cc.Context = func(ctx context.Context, merchant string) (context.Context, error) {
			return service.WithMerchant(ctx, merchant), nil
		}
		cc.Keys, cc.Lease, cc.Logger = cfg.SealKeys, cfg.Lease, cfg.Logger
		if cfg.MeterProvider != nil {
			if cc.OnRedrive, err = idemotel.NewCompleterCounter(idemotel.WithMeterProvider(cfg.MeterProvider)); err != nil {
				return nil, nil, err
			}
		}
		if c, err = completer.New(cfg.Store.Idem(), cc); err != nil { // its own statements: no fault
			return nil, nil, err
		}
	}
	return a.serve(routes), c, nil
}

// idemOptions is idem's store and options for both protected routes: cfg's
// store (through the fault injection), scoped by merchant, with cfg's lease,
// bound on executions in flight,
// relay secret, logger and observer, and its sealing (SealKeys,
// ReplayPlain, KeyHashSecret, KeepRequestBytes).
func (cfg handlerConfig) idemOptions() (idem.Store, idem.Options) {
	return cfg.Faults.store(cfg.Store.Idem()), idem.Options{
		Scope:   service.Scope,
		Request: idem.RequestOptions{KeepForRedrive: cfg.Completer != nil},
		Engine: idem.EngineOptions{
			Lease:       idem.LeaseOptions{Duration: cfg.Lease},
			Waiting:     idem.WaitOptions{Wait: cfg.Wait, Max: cfg.MaxWait},
			Admission:   idem.AdmissionOptions{MaxInFlight: cfg.MaxInFlight},
			Sealing:     idem.SealingOptions{Keys: cfg.SealKeys, ReplayPlain: cfg.ReplayPlain, KeyHashSecret: cfg.KeyHashSecret, KeepRequestBytes: cfg.KeepRequestBytes},
			RelaySecret: cfg.RelaySecret,
			Logger:      cfg.Logger,
			Observer:    cfg.Observer,
		},
	}
}

// routes returns the authenticated routes, with create as POST
// /v1/payments.
func (a *api) routes(create http.Handler) *http.ServeMux {
	routes := http.NewServeMux()
	routes.Handle("POST /v1/payments", create)
	routes.HandleFunc("GET /v1/payments", a.listPayments)
	routes.HandleFunc("GET /v1/payments/{id}", a.getPayment)
	routes.HandleFunc("GET /v1/balance", a.balance)
	// Paths without a method pattern answer the other methods (the mux
	// prefers the more specific pattern above), so every answer is a problem.
	routes.Handle("/v1/payments", methodNotAllowed("GET, HEAD, POST"))
	routes.Handle("/v1/payments/{id}", methodNotAllowed("GET, HEAD"))
	routes.Handle("/v1/balance", methodNotAllowed("GET, HEAD"))
	routes.HandleFunc("/", notFound)
	return routes
}

// serve returns the whole handler: the request log, GET /healthz, GET
// /metrics (with a.metrics), and everything else authenticated, then
// handled by routes.
func (a *api) serve(routes http.Handler) http.Handler {
	root := http.NewServeMux()
	root.Handle("GET /healthz", service.Health{API: svc, Log: a.log, CheckFile: a.store.CheckFile, Probe: a.probeTables, RetryAfter: true})
	root.Handle("/healthz", methodNotAllowed("GET, HEAD"))
	if a.metrics != nil {
		root.Handle("GET /metrics", a.metrics)
		root.Handle("/metrics", methodNotAllowed("GET, HEAD"))
	}
	root.Handle("/", svc.Authenticate(routes))
	return service.LogRequests(a.log, http.StatusOK, a.storedKey, root)
}

// paymentJSON is a payment as the API shows it.
type paymentJSON = service.PaymentJSON

func toJSON(p Payment) paymentJSON {
	return paymentJSON{ID: p.ID, AmountJSON: p.AmountJSON(), Status: p.Status, CreatedAt: p.CreatedAt.UTC().Format(time.RFC3339)}
}

// createPayment is POST /v1/payments. It runs under idem's claim: once per
// (merchant, Idempotency-Key), its answer recorded and replayed.
func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	merchant, _ := service.Merchant(ctx)
	// idem has read the body already (at most its MaxRequestBytes) and
	// hands it on in full.
	in, ok := readPayment(w, r, r.Body)
	if !ok {
		return
	}

	a.faults.beforeCharge(ctx)

	// Charge first, then write: the claim's transaction (and with SQLite the
	// database's one write lock) is only taken once the slow call is over.
	// The charge is an idem step (idem.Step): its result is recorded as soon
	// as the provider answers, so a re-execution of this (merchant,
	// Idempotency-Key) after a failure or a crash (a retry, a takeover)
	// books the recorded charge without calling the provider again. A charge
	// whose answer never came stays started: the re-execution asks again
	// with idem's relayed key, the same on every execution, and the provider
	// answers with the first charge.
	relay, err := idem.RelayKey(ctx, RelayStep)
	if err != nil {
		a.log.ErrorContext(ctx, "no relay key", "err", err)
		svc.WriteProblem(w, service.ProblemInternal, http.StatusInternalServerError, "the payment could not be keyed for the provider")
		return
	}
	exec, _ := idem.ExecutionFromContext(ctx)
	charge, called, providerErr, err := a.charge(ctx, in, relay, merchant)
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// idem answers 409 outcome-unknown whatever is written here, to
		// this request and every retry, until an operator resolves it.
		a.log.ErrorContext(ctx, "the charge's outcome cannot be known: the payment is held for an operator (idem resolve)",
			"merchant", merchant, "relay_key", relay, "err", err)
		svc.WriteProblem(w, service.ProblemInternal, http.StatusConflict, "the charge's outcome cannot be known; do not retry")
		return
	case providerErr != nil:
		a.providerFailed(w, r, relay, err)
		return
	case err != nil:
		// idem could not start or record the step (its store failed, or
		// the execution no longer owns its record): 5xx, the retry runs it.
		a.storeFailed(w, r, "recording the charge", err)
		return
	case charge.ID == "":
		// A recorded result without a charge id (an operator's idem
		// resolve --result that named no ID): never booked.
		a.log.ErrorContext(ctx, "the charge step's recorded result has no charge id; the payment is not booked", "relay_key", relay)
		svc.WriteProblem(w, service.ProblemInternal, http.StatusInternalServerError, "the recorded charge has no id; ask the operator")
		return
	}
	// provider_called is false when an earlier execution's charge was
	// recorded (the step's result); provider_replayed is what the provider
	// said when it was called.
	a.log.InfoContext(ctx, "charged", "merchant", merchant, "charge", charge.ID, "provider_called", called,
		"provider_replayed", charge.Replayed, "relay_key", relay, "attempt", exec.Attempt, "fencing_token", exec.FencingToken)
	a.faults.afterCharge(ctx, charge.ID)
	a.faults.stall(ctx)

	p, err := a.store.CreatePayment(ctx, in.payment(merchant, charge.ID), a.writeMode)
	if err != nil {
		// Answered 5xx: idem rolls the transaction back and records FAILED,
		// so a retry charges again with the same relay key (the provider
		// returns the same charge) and writes again.
		a.storeFailed(w, r, "recording the payment", err)
		return
	}
	if p.Merchant != merchant || p.Amount != in.Amount || p.Currency != in.Currency {
		// The charge is recorded for another payment: the provider answered
		// another request's charge. Never book it twice.
		a.log.ErrorContext(ctx, "the provider's charge is recorded for another payment", "charge", charge.ID, "payment", p.ID)
		svc.WriteProblem(w, service.ProblemInternal, http.StatusInternalServerError, "the provider's charge is already recorded for another payment")
		return
	}
	a.faults.afterWrite(ctx, charge.ID, p.ID, a.writeMode)
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	svc.WriteJSON(w, http.StatusCreated, toJSON(p))
}

// charge is the provider's charge for in, keyed with relay, as the idem
// step RelayStep (at-most-once with AtMostOnceCharge). called reports that
// the provider was called in this execution (not when an earlier one's
// charge is recorded), providerErr the provider's own error when err is it;
// any other err is idem's (a store error, ErrLeaseLost, ErrOutcomeUnknown).
func (a *api) charge(ctx context.Context, in paymentInput, relay, merchant string) (c Charge, called bool, providerErr, err error) {
	var opts []idem.StepOption
	if a.atMostOnce {
		opts = append(opts, idem.AtMostOnce())
	}
	c, err = idem.Step(ctx, RelayStep, func(ctx context.Context) (Charge, error) {
		called = true
		c, err := a.provider.Charge(ctx, in.chargeRequest(relay, merchant))
		providerErr = err
		if err == nil {
			a.faults.inCharge(ctx, c.ID)
		}
		if pe := (*ProviderError)(nil); a.atMostOnce && errors.As(err, &pe) && pe.NotCharged() {
			// The provider said that it charged nothing: not applied, so
			// the step may run again. A timeout, a broken connection or a
			// gateway's 502 stays uncertain.
			return c, idem.StepNotApplied(err)
		}
		return c, err
	}, opts...)
	if err == nil || errors.Is(err, idem.ErrOutcomeUnknown) || providerErr == nil || !errors.Is(err, providerErr) {
		providerErr = nil
	}
	return c, called, providerErr, err
}

// readPayment reads body (all or part of r's) and validates it as a
// payment. When it is not valid it answers: 415 unsupported-media-type, or
// 400 invalid-request (with invalid-params when fields are wrong), and
// returns false. Under idem, such an answer releases the key
// (idem.ReleaseKey: nothing was charged yet), so the corrected request with
// the same key runs instead of getting 422 key-reused.
func readPayment(w http.ResponseWriter, r *http.Request, body io.Reader) (paymentInput, bool) {
	b, err := io.ReadAll(body)
	if err != nil {
		releaseKey(r)
		svc.WriteProblem(w, service.ProblemInvalidRequest, http.StatusBadRequest, "the request body could not be read")
		return paymentInput{}, false
	}
	in, err := parsePaymentInput(r.Header.Get("Content-Type"), b)
	if err != nil {
		releaseKey(r)
	}
	if err != nil {
		svc.WriteInputError(w, err, func(ie *inputError) string { return invalidParamsDetail(ie.Params) })
	}
	return in, err == nil
}

// releaseKey asks idem not to record the answer of r's execution: a
// validation failure, before any side effect. Outside idem (the naive
// handler) there is no execution to release.
func releaseKey(r *http.Request) {
	_ = idem.ReleaseKey(r.Context()) // idem.ErrNoExecution outside idem: nothing to release
}

// chargeRequest is the provider's charge for in, keyed with key.
func (in paymentInput) chargeRequest(key, merchant string) ChargeRequest {
	return ChargeRequest{IdempotencyKey: key, Merchant: merchant, Amount: in.Amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description}
}

// payment is the new succeeded payment of in, recording the provider's
// charge.
func (in paymentInput) payment(merchant, chargeID string) NewPayment {
	return NewPayment{Payment: service.Payment{ID: service.NewID("pay"), Merchant: merchant, Amount: in.Amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description}, Status: "succeeded", ProviderChargeID: chargeID}
}

// providerFailed answers a charge the provider did not confirm: 504 when its
// answer did not come in time (the outcome is unknown), 502 otherwise. idem
// records both as FAILED, so a retry with the same key asks the provider
// again, with the same relayed key: it charges at most once.
func (a *api) providerFailed(w http.ResponseWriter, r *http.Request, relay string, err error) {
	merchant, _ := service.Merchant(r.Context())
	a.log.WarnContext(r.Context(), "payment provider failed", "merchant", merchant, "relay_key", relay, "err", err)
	if errors.Is(err, ErrProviderTimeout) {
		svc.WriteRetryLater(w, problemProviderTimeout, http.StatusGatewayTimeout,
			"the payment provider did not answer in time; the charge may have been made: retry with the same Idempotency-Key, the provider will not charge twice")
		return
	}
	// Retry-After: 1, whatever the provider said: its own Retry-After for a
	// key in flight is the lease left there (30 s for a fresh claim), while
	// its charge usually completes far sooner.
	svc.WriteRetryLater(w, problemProviderError, http.StatusBadGateway,
		"the payment provider did not confirm the charge; retry with the same Idempotency-Key")
}

// getPayment is GET /v1/payments/{id}.
func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	merchant, _ := service.Merchant(r.Context())
	id := r.PathValue("id")
	p, err := a.store.Payment(r.Context(), merchant, id)
	switch {
	case errors.Is(err, ErrNotFound):
		// Another merchant's payment is not found either.
		svc.WriteProblem(w, service.ProblemNotFound, http.StatusNotFound, fmt.Sprintf("no payment %q", id))
	case err != nil:
		a.readFailed(w, r, "reading a payment", err)
	default:
		svc.WriteJSON(w, http.StatusOK, toJSON(p))
	}
}

// listPayments is GET /v1/payments?limit=N: the merchant's newest payments.
func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	merchant, _ := service.Merchant(r.Context())
	limit, reason := parseLimit(r.URL.Query()["limit"])
	if reason != "" {
		writeInvalidParams(w, []invalidParam{{Name: "limit", Reason: reason}})
		return
	}
	payments, err := a.store.Payments(r.Context(), merchant, limit+1)
	if err != nil {
		a.readFailed(w, r, "listing payments", err)
		return
	}
	hasMore := len(payments) > limit
	if hasMore {
		payments = payments[:limit]
	}
	data := make([]paymentJSON, len(payments))
	for i, p := range payments {
		data[i] = toJSON(p)
	}
	svc.WriteJSON(w, http.StatusOK, struct {
		Data    []paymentJSON `json:"data"`
		HasMore bool          `json:"has_more"`
	}{data, hasMore})
}

// parseLimit reads the limit query parameter: absent means DefaultListLimit;
// otherwise one integer from 1 to MaxListLimit.
func parseLimit(values []string) (int, string) {
	switch len(values) {
	case 0:
		return DefaultListLimit, ""
	case 1:
	default:
		return 0, "is given more than once"
	}
	n, err := strconv.Atoi(values[0])
	if err != nil || n < 1 || n > MaxListLimit {
		return 0, fmt.Sprintf("must be an integer from 1 to %d", MaxListLimit)
	}
	return n, ""
}

// balance is GET /v1/balance: the merchant's ledger summed per currency,
// exactly (a total past 2^63 is still its exact JSON number).
func (a *api) balance(w http.ResponseWriter, r *http.Request) {
	merchant, _ := service.Merchant(r.Context())
	b, err := a.store.Balance(r.Context(), merchant)
	if err != nil {
		a.readFailed(w, r, "computing the balance", err)
		return
	}
	svc.WriteJSON(w, http.StatusOK, struct {
		Merchant string              `json:"merchant"`
		Payments int64               `json:"payments"`
		Totals   map[string]*big.Int `json:"totals"` // exact JSON numbers, unbounded
	}{b.Merchant, b.Payments, b.Totals})
}

// probeTables reads idem's table and the payments table for GET /healthz
// (service.Health): a ping alone would pass with the tables gone, while
// every POST fails. The reads reach the database (no separate ping needed).
func (a *api) probeTables(ctx context.Context) error {
	_, err := a.store.Idem().Get(ctx, idemdriver.GetParams{Scope: healthProbe, Key: healthProbe})
	if errors.Is(err, idemdriver.ErrNotFound) {
		err = nil
	}
	if err == nil {
		_, err = a.store.Payments(ctx, healthProbe, 1)
	}
	return err
}

// readFailed answers a database error of a read (GET): 503 with
// Retry-After, since nothing was written and the same request may simply
// be sent again once the database is back.
func (a *api) readFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.log.ErrorContext(r.Context(), "database error", "op", what, "err", err)
	svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the database failed while "+what+"; retry later")
}

// storeFailed answers a database error: 503 with Retry-After when idem
// could not begin the claim's transaction or the database refused the
// transaction as one of two that conflicted (conflicted: a lost race, never
// a 500), 500 otherwise. All are recorded as FAILED by idem's default
// policy, so a retry with the same key runs again.
func (a *api) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.log.ErrorContext(r.Context(), "database error", "op", what, "err", err)
	switch {
	case errors.Is(err, idem.ErrStoreUnavailable):
		svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable, "the database did not answer while "+what+"; retry later")
		return
	case conflicted(err):
		svc.WriteRetryLater(w, service.ProblemUnavailable, http.StatusServiceUnavailable,
			"the database refused the transaction "+what+" because it conflicted with another; retry with the same key")
		return
	}
	svc.WriteProblem(w, service.ProblemInternal, http.StatusInternalServerError, "the service failed while "+what)
}

func methodNotAllowed(allow string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		svc.WriteProblem(w, problemMethodNotAllowed, http.StatusMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
	})
}

func notFound(w http.ResponseWriter, r *http.Request) {
	svc.WriteProblem(w, service.ProblemNotFound, http.StatusNotFound, fmt.Sprintf("no resource at %s", r.URL.Path))
}
