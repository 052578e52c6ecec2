package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// postgresStore is the Store on PostgreSQL (idempgx): service.DB's pgx
// pool and idem's driver.
type postgresStore struct{ *service.DB }

func (s *postgresStore) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	if mode == WriteSeparate {
		tx, err := s.Pool.Begin(ctx)
		if err != nil {
			return Payment{}, err
		}
		got, err := insertPostgresPayment(ctx, tx, p)
		if err != nil {
			// The write's error is the one to report; the rollback only
			// ends the transaction (its error, if any, joined).
			return Payment{}, errors.Join(err, tx.Rollback(ctx))
		}
		return got, tx.Commit(ctx)
	}
	tx, err := idem.Tx[pgx.Tx](ctx)
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
		VALUES ($1, $2, $3, $4, $5, $6)`, service.NewID("le"), p.ID, p.Merchant, p.Amount, p.Currency, createdAt)
	if err != nil {
		return Payment{}, fmt.Errorf("insert ledger entry: %w", err)
	}
	return Payment{NewPayment: p, CreatedAt: createdAt.UTC()}, nil
}

const postgresPaymentColumns = `id, merchant, amount, currency, customer, coalesce(description, ''), status, provider_charge_id, created_at`

func (s *postgresStore) Payment(ctx context.Context, merchant, id string) (Payment, error) {
	p, err := scanPostgresPayment(s.Pool.QueryRow(ctx,
		`SELECT `+postgresPaymentColumns+` FROM payments WHERE merchant = $1 AND id = $2`, merchant, id))
	if errors.Is(err, pgx.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

func (s *postgresStore) Payments(ctx context.Context, merchant string, limit int) ([]Payment, error) {
	rows, err := s.Pool.Query(ctx, `SELECT `+postgresPaymentColumns+` FROM payments
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
	rows, err := s.Pool.Query(ctx, `SELECT currency, COUNT(*), `+service.SumColumns(`amount`, func(sum string) string { return sum + `::bigint` })+` FROM ledger_entries
		WHERE merchant = $1 GROUP BY currency ORDER BY currency`, merchant)
	if err != nil {
		return Balance{}, err
	}
	defer rows.Close()
	return sumBalance(merchant, rows)
}

func scanPostgresPayment(row pgx.Row) (Payment, error) {
	var p Payment
	err := row.Scan(&p.ID, &p.Merchant, &p.Amount, &p.Currency, &p.Customer, &p.Description,
		&p.Status, &p.ProviderChargeID, &p.CreatedAt)
	p.CreatedAt = p.CreatedAt.UTC()
	return p, err
}
