package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
)

// onMySQL is the Store on MySQL or MariaDB (idemmysql); a payment written
// on its own commits in READ COMMITTED.
func onMySQL(db *service.DB) *sqlStore {
	return &sqlStore{DB: db, separateTx: &sql.TxOptions{Isolation: sql.LevelReadCommitted}, claimTx: idem.Tx[*sql.Tx],
		insert: insertMySQLPayment, scan: scanMySQLPayment, sumAmount: service.SumColumns(`amount`, func(sum string) string { return `CAST(` + sum + ` AS SIGNED)` })}
}

// insertMySQLPayment writes p's row in tx (READ COMMITTED) at the
// database's clock, unless a payment already records p's charge (dup;
// nothing written): created_at as the DATETIME(6) written (stamp) and as a
// time. A failed statement does not abort a MySQL transaction, so the
// duplicate is read in the same one.
func insertMySQLPayment(ctx context.Context, tx *sql.Tx, p NewPayment) (stamp any, at time.Time, dup bool, err error) {
	var createdAt time.Time
	if err := tx.QueryRowContext(ctx, `SELECT UTC_TIMESTAMP(6)`).Scan(&createdAt); err != nil {
		return nil, time.Time{}, false, fmt.Errorf("database clock: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO payments
		(id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`,
		p.ID, p.Merchant, p.Amount, p.Currency, p.Customer, nullString(p.Description), p.Status, p.ProviderChargeID, createdAt)
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == 1062 && strings.Contains(me.Message, "payments_provider_charge_id") {
		return nil, time.Time{}, true, nil
	}
	if err != nil {
		return nil, time.Time{}, false, fmt.Errorf("insert payment: %w", err)
	}
	return createdAt, createdAt.UTC().Truncate(time.Microsecond), false, nil
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
