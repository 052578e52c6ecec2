package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/service"
)

// postgresStore is the Store on PostgreSQL (idempgx): service.DB's pgx
// pool and idem's driver.
type postgresStore struct{ *service.DB }

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
	err := s.Pool.QueryRow(ctx, `SELECT id, merchant, amount, currency, customer, coalesce(description, ''), created_at
		FROM charges WHERE merchant = $1 AND id = $2`, merchant, id).
		Scan(&c.ID, &c.Merchant, &c.Amount, &c.Currency, &c.Customer, &c.Description, &c.CreatedAt)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, ErrNotFound
	}
	c.CreatedAt = c.CreatedAt.UTC()
	return c, err
}

func (s *postgresStore) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.Pool.Query(ctx, statsSQL(func(sum string) string { return sum + `::bigint` }))
	if err != nil {
		return Stats{}, err
	}
	defer rows.Close()
	return readStats(rows)
}
