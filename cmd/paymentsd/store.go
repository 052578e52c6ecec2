package main

import (
	"context"
	"embed"
	"errors"
	"math/big"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/dburl"
	"github.com/idemgo/idem/cmd/internal/service"
)

// SchemaVersionTable is the table in which the demo's own migrations are
// recorded, beside idem's idem_schema_version.
const SchemaVersionTable = "paymentsd_schema_version"

// DefaultSQLitePath is the database file used when --database-url is empty.
const DefaultSQLitePath = "paymentsd.db"

// ErrNotFound is returned by Store.Payment when the merchant has no payment
// with that id.
var ErrNotFound = errors.New("payment not found")

// NewPayment is a validated payment about to be written: its ID is
// pay_<uuid> (or pi_<uuid> from POST /v1/payment_intents).
type NewPayment struct {
	service.Payment
	Status           string
	ProviderChargeID string
}

// Payment is a stored payment.
type Payment struct {
	NewPayment
	CreatedAt time.Time // database clock, UTC
}

// Balance sums a merchant's ledger.
type Balance struct {
	Merchant string
	Payments int64 // ledger entries (one per payment)
	// Totals maps a currency to the exact sum of its amounts, in minor
	// units: unbounded (1024 payments of MaxAmount already pass the largest
	// int64), so it is never wrapped or clamped.
	Totals map[string]*big.Int
}

// WriteMode says where POST /v1/payments writes its rows (--write-mode).
type WriteMode string

const (
	// WriteInClaim writes the rows in the claim's transaction: they commit
	// with idem's record of the outcome, atomically (CONTRACT section 6).
	// The default.
	WriteInClaim WriteMode = "claim"
	// WriteSeparate commits the rows in a transaction of their own; idem
	// then records the outcome in a statement of its own. A crash between
	// the two leaves committed rows under a PROCESSING key, which the
	// takeover runs again: only the uniqueness of the provider's charge id
	// keeps the ledger from counting the payment twice. For comparison
	// (docs/crash-semantics.md).
	WriteSeparate WriteMode = "separate"
)

// Store is the demo's storage: one implementation per database (onSQLite,
// onMySQL, postgresStore), all with the same tables (payments, ledger_entries) next
// to idem's idem_keys in the same database. openStore returns it migrated.
type Store interface {
	// Idem returns the idempotency driver on the same database.
	Idem() idem.Store
	// CreatePayment writes the payment and its ledger entry. In WriteInClaim
	// mode they are written in the claim's transaction (taken from ctx, begun
	// on first use) and commit together with idem's record of the response,
	// or not at all; in WriteSeparate mode they are committed in a
	// transaction of their own before it returns. Either way the write is
	// idempotent on ProviderChargeID: when a payment already records that
	// charge, nothing is written and that payment is returned.
	CreatePayment(ctx context.Context, p NewPayment, mode WriteMode) (Payment, error)
	// Payment returns the merchant's payment id, or ErrNotFound.
	Payment(ctx context.Context, merchant, id string) (Payment, error)
	// Payments returns at most limit of the merchant's payments, newest first.
	Payments(ctx context.Context, merchant string, limit int) ([]Payment, error)
	// Balance sums the merchant's ledger entries per currency.
	Balance(ctx context.Context, merchant string) (Balance, error)
	// CheckFile reports an error when the SQLite file at the database's
	// path is not the one open (deleted or replaced); nil on the servers
	// (service.DB.CheckFile).
	CheckFile() error
	// Close closes the database.
	Close() error
}

//go:embed migrations/*/*.sql
var migrations embed.FS

// schema is the demo's tables: migrations/<kind>/*.sql, applied by goose
// after idem's and recorded in SchemaVersionTable.
var schema = service.Schema{Service: "paymentsd", VersionTable: SchemaVersionTable, Migrations: migrations,
	DefaultSQLitePath: DefaultSQLitePath}

// openStore opens the database named by databaseURL (see parseDatabaseURL)
// and migrates it: idem's migrations, then the demo's (service.Open).
func openStore(ctx context.Context, databaseURL string) (Store, error) {
	db, err := schema.OpenURL(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	switch db.Kind {
	case dburl.Postgres:
		return &postgresStore{db}, nil
	case dburl.MySQL:
		return onMySQL(db), nil
	default:
		return onSQLite(db), nil
	}
}

// sumBalance reads merchant's balance from rows of (currency, count, high,
// low), one per currency, where high and low sum the amounts' high and low
// 32 bits (service.SumColumns).
func sumBalance(merchant string, rows service.Rows) (Balance, error) {
	b := Balance{Merchant: merchant, Totals: map[string]*big.Int{}}
	for rows.Next() {
		var (
			currency         string
			count, high, low int64
		)
		if err := rows.Scan(&currency, &count, &high, &low); err != nil {
			return Balance{}, err
		}
		b.Payments += count
		b.Totals[currency] = service.JoinSum(high, low)
	}
	return b, rows.Err()
}

// parseDatabaseURL tells which database a --database-url names:
//   - empty: SQLite, the file DefaultSQLitePath in the working directory;
//   - postgres://... or postgresql://...: PostgreSQL, the URL as given
//     (pgxpool syntax: search_path=... and other run-time parameters allowed);
//   - mysql://... or mariadb://...: MySQL or MariaDB, the URL as given
//     (idemmysql.ParseURL's form: mysql://user:password@host:port/dbname?params);
//   - sqlite:PATH, sqlite://PATH, file:PATH, file://PATH or a plain PATH:
//     SQLite, the file at PATH. SQLite URLs take no query parameters: idem
//     sets its own (WAL, busy timeout, BEGIN IMMEDIATE).
//
// It returns "postgres", "mysql" or "sqlite" and the URL or path.
func parseDatabaseURL(s string) (kind, target string, err error) { return schema.ParseURL(s) }
