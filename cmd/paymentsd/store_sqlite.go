package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// onSQLite is the Store on an embedded SQLite file (idemsqlite).
func onSQLite(db *service.DB) *sqlStore {
	return &sqlStore{DB: db, claimTx: idem.Tx[*sql.Tx], insert: insertSQLitePayment, scan: scanSQLitePayment,
		sumAmount: service.SumColumns(`amount`, func(sum string) string { return sum })}
}

// sqliteNow is SQLite's clock in integer microseconds.
const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

// insertSQLitePayment writes p's row in tx at SQLite's clock, unless a
// payment already records p's charge (dup; nothing written): created_at in
// integer microseconds (stamp) and as a time.
func insertSQLitePayment(ctx context.Context, tx *sql.Tx, p NewPayment) (stamp any, at time.Time, dup bool, err error) {
	var createdAt int64
	err = tx.QueryRowContext(ctx, `INSERT INTO payments
		(id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, `+sqliteNow+`)
		ON CONFLICT (provider_charge_id) DO NOTHING
		RETURNING created_at`,
		p.ID, p.Merchant, p.Amount, p.Currency, p.Customer, nullString(p.Description), p.Status, p.ProviderChargeID,
	).Scan(&createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, time.Time{}, true, nil
	}
	if err != nil {
		return nil, time.Time{}, false, fmt.Errorf("insert payment: %w", err)
	}
	return createdAt, time.UnixMicro(createdAt).UTC(), false, nil
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
