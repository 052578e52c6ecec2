package main

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"time"

	"github.com/pressly/goose/v3"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

//go:embed migrations/sqlite/*.sql
var sqliteMigrations embed.FS

// sqliteStore is the Store on an embedded SQLite file (idemsqlite).
type sqliteStore struct {
	drv *idemsqlite.Driver
	db  *sql.DB
}

var _ Store = (*sqliteStore)(nil)

func openSQLite(ctx context.Context, path string) (*sqliteStore, error) {
	drv, err := idemsqlite.Open(ctx, path)
	if err != nil {
		return nil, err
	}
	return &sqliteStore{drv: drv, db: drv.DB()}, nil
}

func (s *sqliteStore) Idem() idem.Store               { return s.drv }
func (s *sqliteStore) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }
func (s *sqliteStore) Close() error                   { return s.drv.Close() }

func (s *sqliteStore) Migrate(ctx context.Context) error {
	if err := s.drv.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(sqliteMigrations, "migrations/sqlite")
	if err != nil {
		return err
	}
	p, err := goose.NewProvider(goose.DialectSQLite3, s.db, sub, goose.WithTableName(SchemaVersionTable),
		goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("fakepsp: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("fakepsp: migrate: %w", err)
	}
	return nil
}

const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

func (s *sqliteStore) CreateCharge(ctx context.Context, c NewCharge) (Charge, error) {
	tx, err := idemsqlite.Tx(ctx)
	if err != nil {
		return Charge{}, err
	}
	var createdAt int64
	err = tx.QueryRowContext(ctx, `INSERT INTO charges (id, merchant, amount, currency, customer, description, created_at)
		VALUES (?, ?, ?, ?, ?, ?, `+sqliteNow+`) RETURNING created_at`,
		c.ID, c.Merchant, c.Amount, c.Currency, c.Customer, sql.NullString{String: c.Description, Valid: c.Description != ""},
	).Scan(&createdAt)
	if err != nil {
		return Charge{}, fmt.Errorf("insert charge: %w", err)
	}
	return Charge{NewCharge: c, CreatedAt: time.UnixMicro(createdAt).UTC()}, nil
}

func (s *sqliteStore) Charge(ctx context.Context, merchant, id string) (Charge, error) {
	var (
		c           Charge
		description sql.NullString
		createdAt   int64
	)
	err := s.db.QueryRowContext(ctx, `SELECT id, merchant, amount, currency, customer, description, created_at
		FROM charges WHERE merchant = ? AND id = ?`, merchant, id).
		Scan(&c.ID, &c.Merchant, &c.Amount, &c.Currency, &c.Customer, &description, &createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return c, ErrNotFound
	}
	c.Description, c.CreatedAt = description.String, time.UnixMicro(createdAt).UTC()
	return c, err
}

func (s *sqliteStore) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT merchant, currency, COUNT(*), SUM(amount) FROM charges
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
