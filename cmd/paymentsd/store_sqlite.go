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

// openSQLite opens (creating if needed) the SQLite file at path.
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
	p, err := goose.NewProvider(goose.DialectSQLite3, s.db, sub, goose.WithTableName(SchemaVersionTable))
	if err != nil {
		return fmt.Errorf("paymentsd: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("paymentsd: migrate: %w", err)
	}
	return nil
}

// sqliteNow is SQLite's clock in integer microseconds.
const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

func (s *sqliteStore) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	if mode == WriteSeparate {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return Payment{}, err
		}
		defer tx.Rollback()
		got, err := insertSQLitePayment(ctx, tx, p)
		if err != nil {
			return Payment{}, err
		}
		return got, tx.Commit()
	}
	tx, err := idemsqlite.Tx(ctx)
	if err != nil {
		return Payment{}, err
	}
	return insertSQLitePayment(ctx, tx, p)
}

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
			`SELECT `+sqlitePaymentColumns+` FROM payments WHERE provider_charge_id = ?`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO ledger_entries (id, payment_id, merchant, amount, currency, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, newID("le"), p.ID, p.Merchant, p.Amount, p.Currency, createdAt)
	if err != nil {
		return Payment{}, fmt.Errorf("insert ledger entry: %w", err)
	}
	return Payment{NewPayment: p, CreatedAt: time.UnixMicro(createdAt).UTC()}, nil
}

const sqlitePaymentColumns = `id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at`

func (s *sqliteStore) Payment(ctx context.Context, merchant, id string) (Payment, error) {
	p, err := scanSQLitePayment(s.db.QueryRowContext(ctx,
		`SELECT `+sqlitePaymentColumns+` FROM payments WHERE merchant = ? AND id = ?`, merchant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

func (s *sqliteStore) Payments(ctx context.Context, merchant string, limit int) ([]Payment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+sqlitePaymentColumns+` FROM payments
		WHERE merchant = ? ORDER BY created_at DESC, id DESC LIMIT ?`, merchant, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	payments := []Payment{}
	for rows.Next() {
		p, err := scanSQLitePayment(rows)
		if err != nil {
			return nil, err
		}
		payments = append(payments, p)
	}
	return payments, rows.Err()
}

func (s *sqliteStore) Balance(ctx context.Context, merchant string) (Balance, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT currency, COUNT(*), SUM(amount) FROM ledger_entries
		WHERE merchant = ? GROUP BY currency ORDER BY currency`, merchant)
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

func scanSQLitePayment(row interface{ Scan(...any) error }) (Payment, error) {
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

// nullString stores an absent optional text as NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
