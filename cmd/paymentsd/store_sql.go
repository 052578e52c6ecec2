package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/idemgo/idem/cmd/internal/service"
)

// sqlStore is the Store on database/sql that SQLite (idemsqlite, onSQLite)
// and MySQL or MariaDB (idemmysql, onMySQL) share: the same queries, but
// for how each writes a payment, reads one and sums amounts.
type sqlStore struct {
	*service.DB
	// separateTx are the options of a WriteSeparate transaction.
	separateTx *sql.TxOptions
	// claimTx returns the claim's transaction: idem.Tx[*sql.Tx].
	claimTx func(ctx context.Context) (*sql.Tx, error)
	// insert writes p's row in tx at the database's clock, unless a payment
	// already records p's charge (dup; nothing written). It returns
	// created_at as the value written (stamp, for the ledger entry) and as
	// a time; its error is wrapped for the caller.
	insert func(ctx context.Context, tx *sql.Tx, p NewPayment) (stamp any, at time.Time, dup bool, err error)
	// scan reads a payment selected as paymentColumns.
	scan func(row scanner) (Payment, error)
	// sumAmount is service.SumColumns of amount for the database: two
	// 64-bit sums that make the exact total.
	sumAmount string
}

// scanner is a row of *sql.Row or *sql.Rows.
type scanner interface{ Scan(dest ...any) error }

// paymentColumns are the columns scan reads, in its order.
const paymentColumns = `id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at`

func (s *sqlStore) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	if mode != WriteSeparate {
		tx, err := s.claimTx(ctx)
		if err != nil {
			return Payment{}, err
		}
		return s.write(ctx, tx, p)
	}
	tx, err := s.SQL.BeginTx(ctx, s.separateTx)
	if err != nil {
		return Payment{}, err
	}
	got, err := s.write(ctx, tx, p)
	if err != nil {
		// The write's error is the one to report; the rollback only ends
		// the transaction (its error, if any, joined).
		return Payment{}, errors.Join(err, tx.Rollback())
	}
	return got, tx.Commit()
}

// write writes p and its ledger entry in tx, unless a payment already
// records p's charge: then it returns that payment and writes nothing.
func (s *sqlStore) write(ctx context.Context, tx *sql.Tx, p NewPayment) (Payment, error) {
	stamp, at, dup, err := s.insert(ctx, tx, p)
	if dup {
		// Another execution recorded this charge (READ COMMITTED on MySQL:
		// the statement below sees its committed row).
		return s.scan(tx.QueryRowContext(ctx,
			`SELECT `+paymentColumns+` FROM payments WHERE provider_charge_id = ?`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, err
	}
	if err := insertLedgerEntry(ctx, tx, p, stamp); err != nil {
		return Payment{}, err
	}
	return Payment{NewPayment: p, CreatedAt: at}, nil
}

func (s *sqlStore) Payment(ctx context.Context, merchant, id string) (Payment, error) {
	p, err := s.scan(s.SQL.QueryRowContext(ctx,
		`SELECT `+paymentColumns+` FROM payments WHERE merchant = ? AND id = ?`, merchant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

func (s *sqlStore) Payments(ctx context.Context, merchant string, limit int) ([]Payment, error) {
	rows, err := s.SQL.QueryContext(ctx, `SELECT `+paymentColumns+` FROM payments
		WHERE merchant = ? ORDER BY created_at DESC, id DESC LIMIT ?`, merchant, limit)
	if err != nil {
		return nil, err
	}
	payments := []Payment{}
	for rows.Next() {
		p, err := s.scan(rows)
		if err != nil {
			return nil, errors.Join(err, rows.Close())
		}
		payments = append(payments, p)
	}
	return payments, errors.Join(rows.Err(), rows.Close())
}

func (s *sqlStore) Balance(ctx context.Context, merchant string) (Balance, error) {
	rows, err := s.SQL.QueryContext(ctx, `SELECT currency, COUNT(*), `+s.sumAmount+` FROM ledger_entries
		WHERE merchant = ? GROUP BY currency ORDER BY currency`, merchant)
	if err != nil {
		return Balance{}, err
	}
	b, err := sumBalance(merchant, rows)
	return b, errors.Join(err, rows.Close())
}

// insertLedgerEntry writes p's ledger entry in tx, dated createdAt (as its
// payment's row).
func insertLedgerEntry(ctx context.Context, tx *sql.Tx, p NewPayment, createdAt any) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO ledger_entries (id, payment_id, merchant, amount, currency, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, service.NewID("le"), p.ID, p.Merchant, p.Amount, p.Currency, createdAt)
	if err != nil {
		return fmt.Errorf("insert ledger entry: %w", err)
	}
	return nil
}

// nullString stores an absent optional text as NULL.
func nullString(s string) sql.NullString { return sql.NullString{String: s, Valid: s != ""} }
