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

// onSQLite is the Store on an embedded SQLite file (idemsqlite).
func onSQLite(db *service.DB) *sqlStore {
	return &sqlStore{DB: db, claimTx: idemsqlite.Tx, insert: insertSQLitePayment, scan: scanSQLitePayment,
		sumAmount: service.SumColumns(`amount`, func(sum string) string { return sum })}
}

// sqliteNow is SQLite's clock in integer microseconds.
const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

// insertSQLitePayment writes p and its ledger entry in tx, unless a payment
// already records p's charge: then it returns that payment and writes nothing.
func insertSQLitePayment(ctx context.Context, tx *sql.Tx, p NewPayment) (Payment, error) {
	var createdAt int64
	err := tx.QueryRowContext(ctx, `INSERT INTO payments
		(id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, `+sqliteNow+`)
		ON CONFLICT (provider_charge_id) DO NOTHING
		RETURNING created_at`,
		p.ID, p.Merchant, p.Amount, p.Currency, p.Customer, nullString(p.Description), p.Status, p.ProviderChargeID,
	).Scan(&createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		// Another execution recorded this charge.
		return scanSQLitePayment(tx.QueryRowContext(ctx,
			`SELECT `+paymentColumns+` FROM payments WHERE provider_charge_id = ?`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", err)
	}
	if err := insertLedgerEntry(ctx, tx, p, createdAt); err != nil {
		return Payment{}, err
	}
	return Payment{NewPayment: p, CreatedAt: time.UnixMicro(createdAt).UTC()}, nil
}

// scanSQLitePayment reads paymentColumns: created_at in microseconds.
func scanSQLitePayment(row scanner) (Payment, error) {
	var (
		p           Payment
		description sql.NullString
		createdAt   int64
	)
	err := row.Scan(&p.ID, &p.Merchant, &p.Amount, &p.Currency, &p.Customer, &description,
		&p.Status, &p.ProviderChargeID, &createdAt)
	p.Description = description.String
	p.CreatedAt = time.UnixMicro(createdAt).UTC()
	return p, err
}
