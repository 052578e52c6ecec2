package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/service"
)

// sqliteStore is the Store on an embedded SQLite file (idemsqlite):
// service.DB's SQL pool and idem's driver.
type sqliteStore struct{ *service.DB }

// sqliteNow is SQLite's clock in integer microseconds.
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
	err := s.SQL.QueryRowContext(ctx, `SELECT id, merchant, amount, currency, customer, description, created_at
		FROM charges WHERE merchant = ? AND id = ?`, merchant, id).
		Scan(&c.ID, &c.Merchant, &c.Amount, &c.Currency, &c.Customer, &description, &createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return c, ErrNotFound
	}
	c.Description, c.CreatedAt = description.String, time.UnixMicro(createdAt).UTC()
	return c, err
}

func (s *sqliteStore) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.SQL.QueryContext(ctx, statsSQL(func(sum string) string { return sum }))
	if err != nil {
		return Stats{}, err
	}
	defer rows.Close()
	return readStats(rows)
}
