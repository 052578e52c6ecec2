// Command river is an example payments service on PostgreSQL whose
// follow-up work, a receipt, is a River job (github.com/riverqueue/river)
// enqueued in the claim's transaction: the handler writes the payment and
// inserts the job with River's InsertTx on idem.Tx[pgx.Tx], and idem commits
// them with its record of the 201. So the job exists exactly when the payment
// does: a process killed before the commit leaves neither (the retry runs
// again, as new), one killed after it leaves both, and retries and replays of
// the key insert nothing (no job is inserted outside the handler, which
// runs once per key).
//
// A receipt worker takes the jobs (RECEIPT_WORKERS of them in this process,
// or in another process of the same program) and records each receipt once:
// it writes the receipt and completes its job in one transaction
// (river.JobCompleteTx), so a job run again after a crash finds its receipt
// written and sends no second one.
//
// River's InsertTx may send a NOTIFY, in the payment's transaction, to wake
// idle workers; PostgreSQL serialises the commits of transactions that
// notified. River sends at most one per queue and FetchCooldown per client
// (100 ms by default), whatever the insert rate, and its PollOnly setting
// does not change that (it stops the client's LISTEN, not its inserts'
// NOTIFY). The README of this directory gives the figures measured both ways
// (BenchmarkPayment).
//
// Configuration, by environment: DATABASE_URL (required; a postgres:// URL,
// its search_path the schema of idem's tables, River's and the example's),
// ADDR (default 127.0.0.1:8080), LEASE (idem's LeaseDuration, default 30s),
// RECEIPT_WORKERS (default 2; 0 makes an API process that only inserts jobs).
//
//	curl -si http://127.0.0.1:8080/v1/payments -H 'Idempotency-Key: order-1' \
//	    -d '{"amount":1000,"currency":"EUR","customer":"cus_42"}'
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "river:", err)
		os.Exit(1)
	}
}

// run serves until SIGINT or SIGTERM, then stops accepting, lets the
// requests and jobs under way finish (at most 10 s) and closes the pool.
func run() error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg, err := configFromEnv()
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	pool, err := pgxpool.New(ctx, cfg.databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return err
	}
	svc, err := newService(pool, cfg.lease, cfg.receiptWorkers, log)
	if err != nil {
		return err
	}
	if cfg.receiptWorkers > 0 { // an insert-only client has nothing to start
		if err := svc.jobs.Start(ctx); err != nil {
			return err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", svc.handler())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	l, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	log.Info("listening", "addr", l.Addr().String(), "receipt_workers", cfg.receiptWorkers, "pid", os.Getpid())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	end, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(end)
	if cfg.receiptWorkers > 0 {
		err = errors.Join(err, svc.jobs.Stop(end))
	}
	return err
}

type config struct {
	databaseURL, addr string
	lease             time.Duration
	receiptWorkers    int
}

func configFromEnv() (config, error) {
	c := config{databaseURL: os.Getenv("DATABASE_URL"), addr: os.Getenv("ADDR"), lease: 30 * time.Second, receiptWorkers: 2}
	if c.databaseURL == "" {
		return c, errors.New("DATABASE_URL is required (postgres://...; its search_path is the schema)")
	}
	if c.addr == "" {
		c.addr = "127.0.0.1:8080"
	}
	if v := os.Getenv("LEASE"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return c, fmt.Errorf("LEASE: %w", err)
		}
		c.lease = d
	}
	if v := os.Getenv("RECEIPT_WORKERS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return c, fmt.Errorf("RECEIPT_WORKERS must be a number of workers, 0 or more, not %q", v)
		}
		c.receiptWorkers = n
	}
	return c, nil
}

// schema is the example's own tables: the payments, and the receipts the
// worker sends (one per payment).
const schema = `
CREATE TABLE IF NOT EXISTS payments (
	id bigserial PRIMARY KEY, amount bigint NOT NULL, currency text NOT NULL, customer text NOT NULL,
	created_at timestamptz NOT NULL DEFAULT now());
CREATE TABLE IF NOT EXISTS receipts (
	payment_id bigint PRIMARY KEY REFERENCES payments (id), customer text NOT NULL, job_id bigint NOT NULL,
	sent_at timestamptz NOT NULL DEFAULT now())`

// migrate creates idem's tables, River's (rivermigrate) and the example's,
// in the pool's search_path schema.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := idempgx.New(pool).Migrate(ctx); err != nil {
		return err
	}
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("river's migrations: %w", err)
	}
	_, err = pool.Exec(ctx, schema)
	return err
}

// service is the payment endpoint and the receipt worker.
type service struct {
	mw   *idem.Middleware
	jobs *river.Client[pgx.Tx]
	log  *slog.Logger
}

// newService builds idem's middleware and the River client on pool:
// workers receipt workers (0: the client only inserts), River's defaults
// otherwise.
func newService(pool *pgxpool.Pool, lease time.Duration, workers int, log *slog.Logger) (*service, error) {
	return newServiceWith(pool, lease, log, riverConfig(pool, workers, log))
}

// riverConfig is the River client's configuration: the receipt worker
// registered, and the receipts queue worked by workers of them when workers
// is above zero.
func riverConfig(pool *pgxpool.Pool, workers int, log *slog.Logger) *river.Config {
	registered := river.NewWorkers()
	river.AddWorker(registered, &receiptWorker{pool: pool})
	cfg := &river.Config{Workers: registered, Logger: log}
	if workers > 0 {
		cfg.Queues = map[string]river.QueueConfig{receiptQueue: {MaxWorkers: workers}}
	}
	return cfg
}

func newServiceWith(pool *pgxpool.Pool, lease time.Duration, log *slog.Logger, rc *river.Config) (*service, error) {
	mw, err := idem.NewMiddleware(idempgx.New(pool), idem.Options{
		Engine: idem.EngineOptions{Lease: idem.LeaseOptions{Duration: lease}, Logger: log},
		Scope:  idem.SingleTenant, // with many customers: the authenticated account
	})
	if err != nil {
		return nil, err
	}
	jobs, err := river.NewClient(riverpgxv5.New(pool), rc)
	if err != nil {
		return nil, err
	}
	return &service{mw: mw, jobs: jobs, log: log}, nil
}

// handler is POST /v1/payments under idem.
func (s *service) handler() http.Handler { return s.mw.Handler(http.HandlerFunc(s.pay)) }

type payment struct {
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	Customer string `json:"customer"`
}

// pay records the payment and enqueues its receipt, both in the claim's
// transaction, which idem commits with the 201 (never Commit it here).
func (s *service) pay(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	var p payment
	if err := json.NewDecoder(r.Body).Decode(&p); err != nil || p.Amount <= 0 || p.Currency == "" || p.Customer == "" {
		_ = idem.ReleaseKey(ctx) // the corrected request may use the key
		http.Error(w, "want a JSON body with amount (above 0), currency and customer", http.StatusBadRequest)
		return
	}
	id, err := s.record(ctx, p)
	if err != nil { // a 5xx is recorded FAILED: the retry runs again, and nothing of this one committed
		s.log.ErrorContext(ctx, "recording the payment", "err", err)
		http.Error(w, "try again", http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, "{\"payment\":%d}\n", id)
}

// record writes the payment and inserts its receipt job in the claim's
// transaction.
func (s *service) record(ctx context.Context, p payment) (int64, error) {
	tx, err := idem.Tx[pgx.Tx](ctx) // the claim's transaction: idem commits it, never you
	if err != nil {
		return 0, err
	}
	var id int64
	if err := tx.QueryRow(ctx, `INSERT INTO payments (amount, currency, customer) VALUES ($1, $2, $3) RETURNING id`,
		p.Amount, p.Currency, p.Customer).Scan(&id); err != nil {
		return 0, err
	}
	if _, err := s.jobs.InsertTx(ctx, tx, receiptArgs{PaymentID: id, Customer: p.Customer}, nil); err != nil {
		return 0, fmt.Errorf("enqueueing the receipt: %w", err)
	}
	return id, nil
}

// receiptQueue is the queue of the receipt jobs.
const receiptQueue = "receipts"

// receiptArgs is a receipt job: which payment, to whom.
type receiptArgs struct {
	PaymentID int64  `json:"payment_id"`
	Customer  string `json:"customer"`
}

func (receiptArgs) Kind() string { return "receipt" }

func (receiptArgs) InsertOpts() river.InsertOpts { return river.InsertOpts{Queue: receiptQueue} }

// receiptWorker sends a payment's receipt; here, sending is writing it to
// the receipts table.
type receiptWorker struct {
	river.WorkerDefaults[receiptArgs]
	pool *pgxpool.Pool
}

// Work writes the receipt and completes the job in one transaction. River
// runs a job at least once (again after a crash mid-job); the receipt's
// primary key makes a second run write nothing.
func (w *receiptWorker) Work(ctx context.Context, job *river.Job[receiptArgs]) error {
	tx, err := w.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(ctx) }() // after Commit, a no-op
	if _, err := tx.Exec(ctx, `INSERT INTO receipts (payment_id, customer, job_id) VALUES ($1, $2, $3) ON CONFLICT (payment_id) DO NOTHING`,
		job.Args.PaymentID, job.Args.Customer, job.ID); err != nil {
		return err
	}
	if _, err := river.JobCompleteTx[*riverpgxv5.Driver](ctx, tx, job); err != nil {
		return err
	}
	return tx.Commit(ctx)
}
