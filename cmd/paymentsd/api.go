package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"

	"github.com/idemgo/idem"
)

// List limits of GET /v1/payments.
const (
	DefaultListLimit = 10
	MaxListLimit     = 100
)

// healthTimeout bounds the database ping of GET /healthz.
const healthTimeout = 2 * time.Second

// handlerConfig is what newHandler wires together.
type handlerConfig struct {
	Store    Store
	Provider Provider
	Logger   *slog.Logger
	// Lease is idem's LeaseDuration; zero means idem's default (30 s).
	Lease time.Duration
}

// api serves the payments API.
type api struct {
	store    Store
	provider Provider
	log      *slog.Logger
}

// newHandler returns the service's whole HTTP handler:
//
//	logRequests
//	  GET /healthz                      (no authentication)
//	  everything else: authenticate -> idem -> routes below
//	    POST /v1/payments               (Idempotency-Key required)
//	    GET  /v1/payments/{id}
//	    GET  /v1/payments?limit=N
//	    GET  /v1/balance
func newHandler(cfg handlerConfig) (http.Handler, error) {
	mw, err := idem.New(idem.Config{
		Store:         cfg.Store.Idem(),
		Scope:         scopeFromMerchant,
		LeaseDuration: cfg.Lease,
		Logger:        cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	a := &api{store: cfg.Store, provider: cfg.Provider, log: cfg.Logger}

	routes := http.NewServeMux()
	routes.HandleFunc("POST /v1/payments", a.createPayment)
	routes.HandleFunc("GET /v1/payments", a.listPayments)
	routes.HandleFunc("GET /v1/payments/{id}", a.getPayment)
	routes.HandleFunc("GET /v1/balance", a.balance)
	// Paths without a method pattern answer the other methods (the mux
	// prefers the more specific pattern above), so every answer is a problem.
	routes.Handle("/v1/payments", methodNotAllowed("GET, HEAD, POST"))
	routes.Handle("/v1/payments/{id}", methodNotAllowed("GET, HEAD"))
	routes.Handle("/v1/balance", methodNotAllowed("GET, HEAD"))
	routes.HandleFunc("/", notFound)

	root := http.NewServeMux()
	root.HandleFunc("GET /healthz", a.health)
	root.Handle("/healthz", methodNotAllowed("GET, HEAD"))
	root.Handle("/", authenticate(mw.Handler(routes)))
	return logRequests(cfg.Logger, root), nil
}

// paymentJSON is a payment as the API shows it.
type paymentJSON struct {
	ID          string  `json:"id"`
	Amount      int64   `json:"amount"`
	Currency    string  `json:"currency"`
	Customer    string  `json:"customer"`
	Description *string `json:"description"`
	Status      string  `json:"status"`
	CreatedAt   string  `json:"created_at"`
}

func toJSON(p Payment) paymentJSON {
	j := paymentJSON{
		ID: p.ID, Amount: p.Amount, Currency: p.Currency, Customer: p.Customer,
		Status: p.Status, CreatedAt: p.CreatedAt.UTC().Format(time.RFC3339),
	}
	if p.Description != "" {
		j.Description = &p.Description
	}
	return j
}

// createPayment is POST /v1/payments. It runs under idem's claim: once per
// (merchant, Idempotency-Key), its answer recorded and replayed.
func (a *api) createPayment(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	merchant, _ := merchantFrom(ctx)
	// idem has read the body already (at most its MaxRequestBytes) and
	// hands it on in full.
	body, err := io.ReadAll(r.Body)
	if err != nil {
		writeProblem(w, problemInvalidRequest, http.StatusBadRequest, "the request body could not be read")
		return
	}
	in, err := parsePaymentInput(r.Header.Get("Content-Type"), body)
	var ie *inputError
	switch {
	case errors.Is(err, errUnsupportedMedia):
		writeProblem(w, problemUnsupportedMedia, http.StatusUnsupportedMediaType, err.Error())
		return
	case errors.As(err, &ie) && ie.params != nil:
		writeInvalidParams(w, ie.params)
		return
	case err != nil:
		writeProblem(w, problemInvalidRequest, http.StatusBadRequest, err.Error())
		return
	}

	// Charge first, then write: the claim's transaction (and with SQLite the
	// database's one write lock) is only taken once the slow call is over.
	relay, _ := relayKey(ctx, "charge")
	charge, err := a.provider.Charge(ctx, ChargeRequest{
		IdempotencyKey: relay, Merchant: merchant, Amount: in.Amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description,
	})
	if err != nil {
		a.log.WarnContext(ctx, "payment provider failed", "merchant", merchant, "err", err)
		writeProblem(w, problemProviderError, http.StatusBadGateway,
			"the payment provider did not confirm the charge; retry with the same Idempotency-Key")
		return
	}

	p, err := a.store.CreatePayment(ctx, NewPayment{
		ID: newID("pay"), Merchant: merchant, Amount: in.Amount, Currency: in.Currency,
		Customer: in.Customer, Description: in.Description, Status: "succeeded",
		ProviderChargeID: charge.ID,
	})
	if err != nil {
		// Answered 5xx: idem rolls the transaction back and records FAILED,
		// so a retry charges again with the same relay key (the provider
		// returns the same charge) and writes again.
		a.storeFailed(w, r, "recording the payment", err)
		return
	}
	w.Header().Set("Location", "/v1/payments/"+p.ID)
	writeJSON(w, http.StatusCreated, toJSON(p))
}

// getPayment is GET /v1/payments/{id}.
func (a *api) getPayment(w http.ResponseWriter, r *http.Request) {
	merchant, _ := merchantFrom(r.Context())
	id := r.PathValue("id")
	p, err := a.store.Payment(r.Context(), merchant, id)
	switch {
	case errors.Is(err, ErrNotFound):
		// Another merchant's payment is not found either.
		writeProblem(w, problemNotFound, http.StatusNotFound, fmt.Sprintf("no payment %q", id))
	case err != nil:
		a.storeFailed(w, r, "reading a payment", err)
	default:
		writeJSON(w, http.StatusOK, toJSON(p))
	}
}

// listPayments is GET /v1/payments?limit=N: the merchant's newest payments.
func (a *api) listPayments(w http.ResponseWriter, r *http.Request) {
	merchant, _ := merchantFrom(r.Context())
	limit, reason := parseLimit(r.URL.Query()["limit"])
	if reason != "" {
		writeInvalidParams(w, []invalidParam{{Name: "limit", Reason: reason}})
		return
	}
	payments, err := a.store.Payments(r.Context(), merchant, limit+1)
	if err != nil {
		a.storeFailed(w, r, "listing payments", err)
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
	writeJSON(w, http.StatusOK, struct {
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

// balance is GET /v1/balance: the merchant's ledger summed per currency.
func (a *api) balance(w http.ResponseWriter, r *http.Request) {
	merchant, _ := merchantFrom(r.Context())
	b, err := a.store.Balance(r.Context(), merchant)
	if err != nil {
		a.storeFailed(w, r, "computing the balance", err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		Merchant string           `json:"merchant"`
		Payments int64            `json:"payments"`
		Totals   map[string]int64 `json:"totals"`
	}{b.Merchant, b.Payments, b.Totals})
}

// health is GET /healthz: 200 when the database answers a ping.
func (a *api) health(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), healthTimeout)
	defer cancel()
	if err := a.store.Ping(ctx); err != nil {
		a.log.WarnContext(ctx, "health check: database ping failed", "err", err)
		p := problem(problemUnavailable, http.StatusServiceUnavailable, "the database does not answer")
		p.RetryAfter = time.Second
		p.Write(w)
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// storeFailed answers a database error: 503 when idem could not begin the
// claim's transaction, 500 otherwise. Both are recorded as FAILED by idem's
// default policy, so a retry with the same key runs again.
func (a *api) storeFailed(w http.ResponseWriter, r *http.Request, what string, err error) {
	a.log.ErrorContext(r.Context(), "database error", "op", what, "err", err)
	if errors.Is(err, idem.ErrStoreUnavailable) {
		p := problem(problemUnavailable, http.StatusServiceUnavailable, "the database did not answer while "+what+"; retry later")
		p.RetryAfter = time.Second
		p.Write(w)
		return
	}
	writeProblem(w, problemInternal, http.StatusInternalServerError, "the service failed while "+what)
}

func methodNotAllowed(allow string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", allow)
		writeProblem(w, problemMethodNotAllowed, http.StatusMethodNotAllowed,
			fmt.Sprintf("%s is not allowed on %s; allowed: %s", r.Method, r.URL.Path, allow))
	})
}

func notFound(w http.ResponseWriter, r *http.Request) {
	writeProblem(w, problemNotFound, http.StatusNotFound, fmt.Sprintf("no resource at %s", r.URL.Path))
}

// writeJSON sends v as application/json with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		writeProblem(w, problemInternal, http.StatusInternalServerError, "the response could not be encoded")
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(append(body, '\n'))
}

// newID returns prefix_<uuid>, with a version 7 (time-ordered) UUID.
func newID(prefix string) string {
	id, err := uuid.NewV7()
	if err != nil {
		id = uuid.New()
	}
	return prefix + "_" + id.String()
}
