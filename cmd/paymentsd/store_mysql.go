package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/internal/service"
)

// onMySQL is the Store on MySQL or MariaDB (idemmysql); a payment written
// on its own commits in READ COMMITTED.
func onMySQL(db *service.DB) *sqlStore {
	return &sqlStore{DB: db, separateTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, claimTx: idemmysql.Tx,
		insert: insertMySQLPayment, scan: scanMySQLPayment, sumAmount: service.SumColumns(`amount`, func(sum string) string { return `CAST(` + sum + ` AS SIGNED)` })}
}

// insertMySQLPayment writes p and its ledger entry in tx (READ COMMITTED),
// unless a payment already records p's charge: then it returns that payment
// and writes nothing. A failed statement does not abort a MySQL transaction,
// so the duplicate is read in the same one.
func insertMySQLPayment(ctx context.Context, tx *sql.Tx, p NewPayment) (Payment, error) {
	var createdAt time.Time
	if err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6)`).Scan(&createdAt); err != nil {
		return Payment{}, fmt.Errorf("database clock: %w", err)
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO payments
		(id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		p.ID, p.Merchant, p.Amount, p.Currency, p.Customer, nullString(p.Description), p.Status, p.ProviderChargeID, createdAt)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 && strings.Contains(me.Message, "payments_provider_charge_id") {
		// Another execution recorded this charge (READ COMMITTED: the
		// statement below sees its committed row).
		return scanMySQLPayment(tx.QueryRowContext(ctx,
			`SELECT `+paymentColumns+` FROM payments WHERE provider_charge_id = ?`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", err)
	}
	if err := insertLedgerEntry(ctx, tx, p, createdAt); err != nil {
		return Payment{}, err
	}
	return Payment{NewPayment: p, CreatedAt: createdAt.UTC().Truncate(time.Microsecond)}, nil
}

// scanMySQLPayment reads paymentColumns: created_at a DATETIME(6).
func scanMySQLPayment(row scanner) (Payment, error) {
	var (
		p           Payment
		description sql.NullString
	)
	err := row.Scan(&p.ID, &p.Merchant, &p.Amount, &p.Currency, &p.Customer, &description,
		&p.Status, &p.ProviderChargeID, &p.CreatedAt)
	p.Description = description.String
	p.CreatedAt = p.CreatedAt.UTC()
	return p, err
}
