package main

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/pressly/goose/v3"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemmysql"
)

//go:embed migrations/mysql/*.sql
var mysqlMigrations embed.FS

// mysqlStore is the Store on MySQL or MariaDB (idemmysql).
type mysqlStore struct {
	drv *idemmysql.Driver
	db  *sql.DB
}

var _ Store = (*mysqlStore)(nil)

// openMySQL connects to url (idemmysql.ParseURL's form:
// mysql://user:password@host:port/dbname?params).
func openMySQL(ctx context.Context, url string) (*mysqlStore, error) {
	drv, err := idemmysql.Open(ctx, url)
	if err != nil {
		return nil, err
	}
	return &mysqlStore{drv: drv, db: drv.DB()}, nil
}

func (s *mysqlStore) Idem() idem.Store               { return s.drv }
func (s *mysqlStore) Ping(ctx context.Context) error { return s.db.PingContext(ctx) }
func (s *mysqlStore) Close() error                   { return s.drv.Close() }

// Migrate runs idem's migrations, then the demo's under a named lock
// (GET_LOCK), so replicas starting together migrate once.
func (s *mysqlStore) Migrate(ctx context.Context) error {
	if err := s.drv.Migrate(ctx); err != nil {
		return err
	}
	sub, err := fs.Sub(mysqlMigrations, "migrations/mysql")
	if err != nil {
		return err
	}
	var database sql.NullString
	if err := s.db.QueryRowContext(ctx, `SELECT DATABASE()`).Scan(&database); err != nil || !database.Valid {
		return fmt.Errorf("paymentsd: migrate: no current database: %v", err)
	}
	p, err := goose.NewProvider(goose.DialectMySQL, s.db, sub, goose.WithTableName(SchemaVersionTable),
		goose.WithSessionLocker(mysqlLock{name: "paymentsd_migrations." + database.String}),
		goose.WithDisableGlobalRegistry(true))
	if err != nil {
		return fmt.Errorf("paymentsd: migrations: %w", err)
	}
	if _, err := p.Up(ctx); err != nil {
		return fmt.Errorf("paymentsd: migrate: %w", err)
	}
	return nil
}

// mysqlLock is a goose session locker on GET_LOCK / RELEASE_LOCK, held by
// the one connection goose migrates on (the server releases it if that
// connection dies).
type mysqlLock struct{ name string }

func (l mysqlLock) SessionLock(ctx context.Context, conn *sql.Conn) error {
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, `SELECT GET_LOCK(?, 300)`, l.name).Scan(&got); err != nil {
		return err
	}
	if got.Int64 != 1 {
		return fmt.Errorf("migration lock %q not obtained in 300 s", l.name)
	}
	return nil
}

func (l mysqlLock) SessionUnlock(ctx context.Context, conn *sql.Conn) error {
	_, err := conn.ExecContext(ctx, `DO RELEASE_LOCK(?)`, l.name)
	return err
}

func (s *mysqlStore) CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error) {
	if mode == WriteSeparate {
		tx, err := s.db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return Payment{}, err
		}
		defer tx.Rollback()
		got, err := insertMySQLPayment(ctx, tx, p)
		if err != nil {
			return Payment{}, err
		}
		return got, tx.Commit()
	}
	tx, err := idemmysql.Tx(ctx)
	if err != nil {
		return Payment{}, err
	}
	return insertMySQLPayment(ctx, tx, p)
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
			`SELECT `+mysqlPaymentColumns+` FROM payments WHERE provider_charge_id = ?`, p.ProviderChargeID))
	}
	if err != nil {
		return Payment{}, fmt.Errorf("insert payment: %w", err)
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO ledger_entries (id, payment_id, merchant, amount, currency, created_at)
		VALUES (?, ?, ?, ?, ?, ?)`, newID("le"), p.ID, p.Merchant, p.Amount, p.Currency, createdAt)
	if err != nil {
		return Payment{}, fmt.Errorf("insert ledger entry: %w", err)
	}
	return Payment{NewPayment: p, CreatedAt: createdAt.UTC().Truncate(time.Microsecond)}, nil
}

const mysqlPaymentColumns = `id, merchant, amount, currency, customer, description, status, provider_charge_id, created_at`

func (s *mysqlStore) Payment(ctx context.Context, merchant, id string) (Payment, error) {
	p, err := scanMySQLPayment(s.db.QueryRowContext(ctx,
		`SELECT `+mysqlPaymentColumns+` FROM payments WHERE merchant = ? AND id = ?`, merchant, id))
	if errors.Is(err, sql.ErrNoRows) {
		return p, ErrNotFound
	}
	return p, err
}

func (s *mysqlStore) Payments(ctx context.Context, merchant string, limit int) ([]Payment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+mysqlPaymentColumns+` FROM payments
		WHERE merchant = ? ORDER BY created_at DESC, id DESC LIMIT ?`, merchant, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	payments := []Payment{}
	for rows.Next() {
		p, err := scanMySQLPayment(rows)
		if err != nil {
			return nil, err
		}
		payments = append(payments, p)
	}
	return payments, rows.Err()
}

func (s *mysqlStore) Balance(ctx context.Context, merchant string) (Balance, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT currency, COUNT(*), CAST(SUM(amount) AS SIGNED) FROM ledger_entries
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

func scanMySQLPayment(row interface{ Scan(...any) error }) (Payment, error) {
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
