package main

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"hash/crc64"
	"io/fs"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idempgx"
)

//go:embed migrations/postgres/*.sql
var postgresMigrations embed.FS

// postgresStore is the Store on PostgreSQL (idempgx, pgx v5 pool).
type postgresStore struct {
	drv  *idempgx.Driver
	pool *pgxpool.Pool
}

var _ Store = (*postgresStore)(nil)

// openPostgres connects a pool to url (pgxpool syntax; a search_path query
// parameter picks the schema) and checks that the server answers.
func openPostgres(ctx context.Context, url string) (*postgresStore, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return newPostgresStore(pool), nil
}

// newPostgresStore returns the Store on pool; Close closes the pool.
func newPostgresStore(pool *pgxpool.Pool) *postgresStore {
	return &postgresStore{drv: idempgx.New(pool), pool: pool}
}

func (s *postgresStore) Idem() idem.Store               { return s.drv }
func (s *postgresStore) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
func (s *postgresStore) Close() error                   { s.pool.Close(); return nil }

// Migrate runs idem's migrations, then the demo's under a PostgreSQL
// advisory lock, so replicas starting together migrate once.
func (s *postgresStore) Migrate(ctx context.Context) error {
	if err := s.drv.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(postgresMigrations, "migrations/postgres")
	if err != nil {
		return err
	}
	// The advisory lock is per schema, so that services (or tests) using
	// other schemas of the database do not wait for each other; it is
	// retried every second instead of goose's default five.
	var schema *string
	if err := s.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("paymentsd: migrate: %w", err)
	}
	if schema == nil {
		return errors.New("paymentsd: migrate: the search_path names no existing schema")
	}
	lockID := int64(crc64.Checksum([]byte("paymentsd:"+*schema), crc64.MakeTable(crc64.ECMA)))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub,
		goose.WithTableName(SchemaVersionTable), goose.WithSessionLocker(locker))
	if err != nil {
		return fmt.Errorf("paymentsd: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("paymentsd: migrate: %w", err)
	}
	return nil
}

func (s *postgresStore) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	if mode == WriteSeparate {
		tx, err := s.pool.Begin(ctx)
		if err != nil {
			return Payment{}, err
		}
		defer tx.Rollback(ctx)
		got, err := insertPostgresPayment(ctx, tx, p)
		if err != nil {
			return Payment{}, err
		}
		return got, tx.Commit(ctx)
	}
	tx, err := idempgx.Tx(ctx)
	if err != nil {
		return Payment{}, err
	}
	return insertPostgresPayment(ctx, tx, p)
}

// insertPostgresPayment writes p and its ledger entry in tx, unless a payment
// already records p's charge: then it returns that payment and writes nothing.
func insertPostgresPayment(ctx context.Context, tx pgx.Tx, p NewPayment) (Payment, error) {
	var createdAt time.Time
	err := tx.QueryRow(ctx, `INSERT INTO payments
		(id, merchant, amount, currency, customer, description, status, provider_charge_id)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, ''), $7, $8)
		ON CONFLICT (provider_charge_id) DO NOTHING
		RETURNING created_at`,
		p.ID, p.Merchant, p.Amount, p.Currency, p.Customer, p.Description, p.Status, p.ProviderChargeID,
	).Scan(&createdAt)
	if errors.Is(err, pgx.ErrNoRows) {
		// Another execution recorded this charge (READ COMMITTED: the
		// statement below sees its committed row).
		return scanPostgresPayment(tx.QueryRow(ctx,
			`SELECT `+postgresPaymentColumns+` FROM payments WHERE provider_charge_id = $1`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", err)
	}
	_, err = tx.Exec(ctx, `INSERT INTO ledger_entries (id, payment_id, merchant, amount, currency, created_at)
		VALUES ($1, $2, $3, $4, $5, $6)`, newID("le"), p.ID, p.Merchant, p.Amount, p.Currency, createdAt)
	if err != nil {
		return Payment{}, fmt.Errorf("insert ledger entry: %w", err)
	}
	return Payment{NewPayment: p, CreatedAt: createdAt.UTC()}, nil
}

const postgresPaymentColumns = `id, merchant, amount, currency, customer, coalesce(description, ''), status, provider_charge_id, created_at`

func (s *postgresStore) Payment(ctx context.Context, merchant, id string) (Payment, error) {
	p, err := scanPostgresPayment(s.pool.QueryRow(ctx,
		`SELECT `+postgresPaymentColumns+` FROM payments WHERE merchant = $1 AND id = $2`, merchant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

func (s *postgresStore) Payments(ctx context.Context, merchant string, limit int) ([]Payment, error) {
	rows, err := s.pool.Query(ctx, `SELECT `+postgresPaymentColumns+` FROM payments
		WHERE merchant = $1 ORDER BY created_at DESC, id DESC LIMIT $2`, merchant, limit)
	if err != nil {
		return nil, err
	}
	payments, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Payment, error) {
		return scanPostgresPayment(row)
	})
	if payments == nil {
		payments = []Payment{}
	}
	return payments, err
}

func (s *postgresStore) Balance(ctx context.Context, merchant string) (Balance, error) {
	rows, err := s.pool.Query(ctx, `SELECT currency, COUNT(*), SUM(amount)::bigint FROM ledger_entries
		WHERE merchant = $1 GROUP BY currency ORDER BY currency`, merchant)
	if err != nil {
		return Balance{}, err
	}
	defer rows.Close()
	b := Balance{Merchant: merchant, Totals: map[string]int64{}}
	for rows.Next() {
		var (
			currency     string
			count, total int64
		)
		if err := rows.Scan(&currency, &count, &total); err != nil {
			return Balance{}, err
		}
		b.Payments += count
		b.Totals[currency] = total
	}
	return b, rows.Err()
}

func scanPostgresPayment(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.Merchant, &p.Amount, &p.Currency, &p.Customer, &p.Description,
		&p.Status, &p.ProviderChargeID, &p.CreatedAt)
	p.CreatedAt = p.CreatedAt.UTC()
	return p, err
}
