package main

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"math/big"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/dburl"
	"github.com/idemgo/idem/cmd/internal/service"
)

// SchemaVersionTable records fakepsp's own migrations, beside idem's
// idem_schema_version.
const SchemaVersionTable = "fakepsp_schema_version"

// DefaultSQLitePath is the database file used when --database-url is empty.
const DefaultSQLitePath = "fakepsp.db"

// ErrNotFound is returned by Store.Charge when the merchant has no charge
// with that id.
var ErrNotFound = errors.New("charge not found")

// NewCharge is a validated charge about to be written; its ID is
// ch_<uuid>.
type NewCharge = service.Payment

// Charge is a stored charge.
type Charge struct {
	NewCharge
	CreatedAt time.Time // database clock, UTC
}

// MerchantStats counts one merchant's charges.
type MerchantStats struct {
	Charges int64 `json:"charges"`
	// Amount maps a currency to the exact sum of the charges' amounts, in
	// minor units: unbounded (1024 charges of MaxAmount pass the largest
	// int64), encoded as an exact JSON number.
	Amount map[string]*big.Int `json:"amount"`
}

// Stats counts the distinct charges made, per merchant and in total: a
// replayed charge is not a new one.
type Stats struct {
	Merchants map[string]*MerchantStats `json:"merchants"`
	Charges   int64                     `json:"charges"`
	// InProgress counts the charge requests being served (their latency
	// included): charges a later read may count, made for a caller that
	// may have stopped waiting.
	InProgress int64 `json:"in_progress"`
}

// Store is fakepsp's storage: the charges table next to idem's idem_keys in
// the same database (sqliteStore, postgresStore). openStore returns it
// migrated.
type Store interface {
	// Idem returns the idempotency driver on the same database.
	Idem() idem.Store
	// CreateCharge writes the charge in the claim's transaction (taken from
	// ctx): it commits together with idem's record of the response, so a
	// charge exists if and only if its key replays it. Outside an execution
	// (handlerConfig.WithoutIdempotency) it commits the charge alone.
	CreateCharge(ctx context.Context, c NewCharge) (Charge, error)
	// Charge returns the merchant's charge id, or ErrNotFound.
	Charge(ctx context.Context, merchant, id string) (Charge, error)
	// Stats counts the charges.
	Stats(ctx context.Context) (Stats, error)
	// Ping checks that the database answers.
	Ping(ctx context.Context) error
	// CheckFile reports an error when the SQLite file at the database's
	// path is not the one open (deleted or replaced); nil on PostgreSQL
	// (service.DB.CheckFile).
	CheckFile() error
	// Close closes the database.
	Close() error
}

//go:embed migrations/*/*.sql
var migrations embed.FS

// schema is fakepsp's table: migrations/<kind>/*.sql, applied by goose
// after idem's and recorded in SchemaVersionTable. --database-url is read
// as paymentsd reads it (service.ParseDatabaseURL), but for MySQL.
var schema = service.Schema{Service: "fakepsp", VersionTable: SchemaVersionTable, Migrations: migrations,
	DefaultSQLitePath: DefaultSQLitePath,
	Unsupported:       map[string]string{dburl.MySQL: "fakepsp keeps its charges in SQLite or PostgreSQL: a mysql:// URL is not supported"}}

// openStore opens the database named by databaseURL (see parseDatabaseURL)
// and migrates it: idem's migrations, then fakepsp's (service.Open).
func openStore(ctx context.Context, databaseURL string) (Store, error) {
	db, err := schema.OpenURL(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	if db.Kind == dburl.Postgres {
		return &postgresStore{db}, nil
	}
	return &sqliteStore{db}, nil
}

// parseDatabaseURL tells which database a --database-url names, as
// paymentsd does: empty is the SQLite file DefaultSQLitePath;
// postgres://... or postgresql://... is PostgreSQL (pgxpool syntax,
// search_path=... picks the schema); sqlite:PATH, file:PATH or a plain PATH
// is an SQLite file. It returns "postgres" or "sqlite" and the URL or path.
func parseDatabaseURL(s string) (kind, target string, err error) { return schema.ParseURL(s) }

// statsSQL counts the charges per merchant and currency, the amounts
// summed exactly in two columns (service.SumColumns); cast wraps each sum
// for the database.
func statsSQL(cast func(sum string) string) string {
	return `SELECT merchant, currency, COUNT(*), ` + service.SumColumns(`amount`, cast) + ` FROM charges
		GROUP BY merchant, currency ORDER BY merchant, currency`
}

// readStats reads the stats from rows of statsSQL: (merchant, currency,
// count, high, low), one per merchant and currency.
func readStats(rows service.Rows) (Stats, error) {
	st := Stats{Merchants: map[string]*MerchantStats{}}
	for rows.Next() {
		var (
			merchant, currency string
			count, high, low   int64
		)
		if err := rows.Scan(&merchant, &currency, &count, &high, &low); err != nil {
			return Stats{}, err
		}
		m := st.Merchants[merchant]
		if m == nil {
			m = &MerchantStats{Amount: map[string]*big.Int{}}
			st.Merchants[merchant] = m
		}
		m.Charges += count
		m.Amount[currency] = service.JoinSum(high, low)
		st.Charges += count
	}
	return st, rows.Err()
}

// postgresStore is the Store on PostgreSQL (idempgx): service.DB's pgx
// pool and idem's driver.
type postgresStore struct{ *service.DB }

func (s *postgresStore) CreateCharge(ctx context.Context, c NewCharge) (Charge, error) {
	var db interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	} = s.Pool
	tx, err := idem.Tx[pgx.Tx](ctx)
	switch {
	case err == nil:
		db = tx
	case !errors.Is(err, idem.ErrNoExecution):
		return Charge{}, err
	}
	var createdAt time.Time
	err = db.QueryRow(ctx, `INSERT INTO charges (id, merchant, amount, currency, customer, description)
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

// sqliteStore is the Store on an embedded SQLite file (idemsqlite):
// service.DB's SQL pool and idem's driver.
type sqliteStore struct{ *service.DB }

// sqliteNow is SQLite's clock in integer microseconds.
const sqliteNow = `CAST(unixepoch('subsec') * 1000000 AS INTEGER)`

func (s *sqliteStore) CreateCharge(ctx context.Context, c NewCharge) (Charge, error) {
	var db interface {
		QueryRowContext(context.Context, string, ...any) *sql.Row
	} = s.SQL
	tx, err := idem.Tx[*sql.Tx](ctx)
	switch {
	case err == nil:
		db = tx
	case !errors.Is(err, idem.ErrNoExecution):
		return Charge{}, err
	}
	var createdAt int64
	err = db.QueryRowContext(ctx, `INSERT INTO charges (id, merchant, amount, currency, customer, description, created_at)
		VALUES (?, ?, ?, ?, ?, ?, `+sqliteNow+`) RETURNING created_at`,
		c.ID, c.Merchant, c.Amount, c.Currency, c.Customer, sql.NullString{String: c.Description, Valid: c.Description != ""},
	).Scan(&createdAt)
	if err != nil {
		return Charge{}, fmt.Errorf("insert charge: %w", err)
	}
	return Charge{NewCharge: c, CreatedAt: time.UnixMicro(createdAt).UTC()}, nil
}

func (s *sqliteStore) Charge(ctx context.Context, merchant, id string) (Charge, error) {
	var (
		c           Charge
		description sql.NullString
		createdAt   int64
	)
	err := s.SQL.QueryRowContext(ctx, `SELECT id, merchant, amount, currency, customer, description, created_at
		FROM charges WHERE merchant = ? AND id = ?`, merchant, id).
		Scan(&c.ID, &c.Merchant, &c.Amount, &c.Currency, &c.Customer, &description, &createdAt)
	if errors.Is(err, sql.ErrNoRows) {
		return c, ErrNotFound
	}
	c.Description, c.CreatedAt = description.String, time.UnixMicro(createdAt).UTC()
	return c, err
}

func (s *sqliteStore) Stats(ctx context.Context) (Stats, error) {
	rows, err := s.SQL.QueryContext(ctx, statsSQL(func(sum string) string { return sum }))
	if err != nil {
		return Stats{}, err
	}
	st, err := readStats(rows)
	return st, errors.Join(err, rows.Close())
}
