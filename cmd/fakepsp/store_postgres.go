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

func openPostgres(ctx context.Context, url string) (*postgresStore, error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, fmt.Errorf("postgres: %w", err)
	}
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("postgres: %w", err)
	}
	return &postgresStore{drv: idempgx.New(pool), pool: pool}, nil
}

func (s *postgresStore) Idem() idem.Store               { return s.drv }
func (s *postgresStore) Ping(ctx context.Context) error { return s.pool.Ping(ctx) }
func (s *postgresStore) Close() error                   { s.pool.Close(); return nil }

// Migrate runs idem's migrations, then fakepsp's under an advisory lock
// named after the schema.
func (s *postgresStore) Migrate(ctx context.Context) error {
	if err := s.drv.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(postgresMigrations, "migrations/postgres")
	if err != nil {
		return err
	}
	var schema *string
	if err := s.pool.QueryRow(ctx, `SELECT current_schema()`).Scan(&schema); err != nil {
		return fmt.Errorf("fakepsp: migrate: %w", err)
	}
	if schema == nil {
		return errors.New("fakepsp: migrate: the search_path names no existing schema")
	}
	lockID := int64(crc64.Checksum([]byte("fakepsp:"+*schema), crc64.MakeTable(crc64.ECMA)))
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(s.pool)
	defer db.Close()
	p, err := goose.NewProvider(goose.DialectPostgres, db, sub, goose.WithTableName(SchemaVersionTable),
		goose.WithSessionLocker(locker), goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("fakepsp: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("fakepsp: migrate: %w", err)
	}
	return nil
}

func (s *postgresStore) CreateCharge(ctx context.Context, c NewCharge) (Charge, error) {
	tx, err := idempgx.Tx(ctx)
	if err != nil {
		return Charge{}, err
	}
	var createdAt time.Time
	err = tx.QueryRow(ctx, `INSERT INTO charges (id, merchant, amount, currency, customer, description)
		VALUES ($1, $2, $3, $4, $5, NULLIF($6, '')) RETURNING created_at`,
		c.ID, c.Merchant, c.Amount, c.Currency, c.Customer, c.Description).Scan(&createdAt)
	if err != nil {
		return Charge{}, fmt.Errorf("insert charge: %w", err)
	}
	return Charge{NewCharge: c, CreatedAt: createdAt.UTC()}, nil
}

func (s *postgresStore) Charge(ctx context.Context, merchant, id string) (Charge, error) {
	var c Charge
	err := s.pool.QueryRow(ctx, `SELECT id, merchant, amount, currency, customer, coalesce(description, ''), created_at
		FROM charges WHERE merchant = $1 AND id = $2`, merchant, id).
		Scan(&c.ID, &c.Merchant, &c.Amount, &c.Currency, &c.Customer, &c.Description, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

func (s *postgresStore) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.pool.Query(ctx, `SELECT merchant, currency, COUNT(*), SUM(amount)::bigint FROM charges
		GROUP BY merchant, currency ORDER BY merchant, currency`)
	if err != nil {
		return Stats{}, err
	}
	defer rows.Close()
	st := Stats{Merchants: map[string]*MerchantStats{}}
	for rows.Next() {
		var (
			merchant, currency string
			count, amount      int64
		)
		if err := rows.Scan(&merchant, &currency, &count, &amount); err != nil {
			return Stats{}, err
		}
		st.addStat(merchant, currency, count, amount)
	}
	return st, rows.Err()
}
