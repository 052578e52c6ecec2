// The README's "In your own server": a payment endpoint on PostgreSQL with
// a scope per account, a validation that releases the key, and a provider
// called with the relayed key. The README shows main between its markers;
// the helpers below are stand-ins for yours. It takes, from the
// environment: DATABASE_URL (postgres://...; its search_path is the schema
// of idem's table and the payments), PROVIDER_URL and PROVIDER_KEY (a
// payment provider that honours Idempotency-Key and its API key: cmd/fakepsp
// at http://127.0.0.1:8090 with sk_test_<merchant>), and ADDR (default
// 127.0.0.1:8080). Its clients authenticate with Authorization: Bearer
// <account>, and pay with {"amount":1000,"currency":"EUR","customer":"cus_42"}.
package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func main() {
	ctx := context.Background()
	// README begin
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	store := idempgx.New(pool) // or: store, err := idemsqlite.Open(ctx, "idem.db")
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	if _, err := pool.Exec(ctx, createPayments); err != nil { // your table, beside idem's
		log.Fatal(err)
	}
	mw, err := idem.NewMiddleware(store, idem.Options{
		// Who owns the key (required; idem.SingleTenant if one owner has every key).
		Scope: func(r *http.Request) (string, error) { return accountFrom(r.Context()) },
	})
	if err != nil {
		log.Fatal(err)
	}

	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, err := validate(r)
		if err != nil {
			_ = idem.ReleaseKey(r.Context()) // a request the client will correct does not burn the key
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		// The provider gets the relayed key, the same on every retry: a retry after a 5xx cannot charge twice.
		relayed, err := idem.RelayKey(r.Context(), "charge") // errs only outside an idem handler
		var chargeID string
		if err == nil {
			chargeID, err = callProvider(r.Context(), relayed, p) // first the slow call (Idempotency-Key: relayed)...
		}
		var tx pgx.Tx
		if err == nil {
			tx, err = idem.Tx[pgx.Tx](r.Context()) // ...then the claim's transaction
		}
		if err == nil {
			_, err = tx.Exec(r.Context(), "INSERT INTO payments (charge_id, amount, currency) VALUES ($1, $2, $3)", chargeID, p.Amount, p.Currency)
		}
		if err != nil { // never ignore it: a failed statement aborts the transaction
			log.Printf("payment: %v", err)
			http.Error(w, "try again", http.StatusServiceUnavailable) // 5xx: recorded FAILED, the retry runs again
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated) // idem commits the row with the outcome: never Commit it yourself
		_, _ = fmt.Fprintf(w, "{\"charge\":%q}\n", chargeID)
	})))
	log.Fatal(http.ListenAndServe(cmp.Or(os.Getenv("ADDR"), "127.0.0.1:8080"), authenticate(mux)))
	// README end
}

// createPayments is the payments table: one row per charge.
const createPayments = `CREATE TABLE IF NOT EXISTS payments (
	id bigserial PRIMARY KEY, charge_id text NOT NULL UNIQUE, amount bigint NOT NULL, currency text NOT NULL)`

type accountKey struct{}

// authenticate stands in for your authentication: it puts the account of
// the bearer token into the request's context.
func authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		account, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok || account == "" {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), accountKey{}, account)))
	})
}

// accountFrom returns the account authenticate found.
func accountFrom(ctx context.Context) (string, error) {
	if account, ok := ctx.Value(accountKey{}).(string); ok {
		return account, nil
	}
	return "", errors.New("no account")
}

// payment is a payment's request body, and the charge's at the provider.
type payment struct {
	Amount   int64  `json:"amount"`   // minor units
	Currency string `json:"currency"` // ISO 4217
	Customer string `json:"customer"`
}

// validate decodes and checks the request.
func validate(r *http.Request) (payment, error) {
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil {
		return p, fmt.Errorf("invalid JSON: %w", err)
	}
	switch {
	case p.Amount <= 0:
		return p, errors.New("amount must be positive")
	case len(p.Currency) != 3:
		return p, errors.New("currency must be a three-letter code")
	case p.Customer == "":
		return p, errors.New("customer is required")
	}
	return p, nil
}

// callProvider charges p at PROVIDER_URL, authenticated with PROVIDER_KEY,
// with idempotencyKey, and returns the charge's id.
func callProvider(ctx context.Context, idempotencyKey string, p payment) (string, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return "", err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, os.Getenv("PROVIDER_URL")+"/v1/charges", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Authorization", "Bearer "+os.Getenv("PROVIDER_KEY"))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Idempotency-Key", idempotencyKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer func() { _ = resp.Body.Close() }()
	var charge struct {
		ID string `json:"id"`
	}
	if resp.StatusCode != http.StatusCreated { // fakepsp's answer, and its replay, to a charge
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return "", fmt.Errorf("provider: %s: %s", resp.Status, b)
	}
	if err := json.NewDecoder(resp.Body).Decode(&charge); err != nil || charge.ID == "" {
		return "", fmt.Errorf("provider: no charge id in its answer (%v)", err)
	}
	return charge.ID, nil
}
