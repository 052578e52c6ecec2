package idempgx

import (
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// ErrPoolerExecMode reports a pool whose query exec mode cannot work behind
// a transaction pooler (pgbouncer pool_mode=transaction, 1.18 and others
// without prepared statement support): pgx's default, cache_statement,
// prepares named statements on the server connection it happened to get,
// and the next transaction may run on another (SQLSTATE 42P05 "prepared
// statement ... already exists", 26000 "prepared statement ... does not
// exist"); describe_exec describes and executes in two round trips, which
// the pooler may send to two servers. The modes that work are exec,
// simple_protocol and cache_describe: add default_query_exec_mode=exec (or
// one of the others) to the URL, or set pgxpool.Config's
// ConnConfig.DefaultQueryExecMode.
var ErrPoolerExecMode = errors.New("idempgx: the pool's default_query_exec_mode does not work behind a transaction pooler: " +
	"add default_query_exec_mode=exec (or simple_protocol, cache_describe) to the connection URL")

// Options configure NewWithOptions.
type Options struct {
	// TransactionPooler declares that the pool connects through a
	// transaction pooler (pgbouncer pool_mode=transaction). NewWithOptions
	// then refuses a pool whose exec mode cannot work there
	// (ErrPoolerExecMode). Session pooling needs nothing: every lock idem
	// takes is a lease row or transaction-scoped.
	TransactionPooler bool
	// Partitioned, when not nil, makes the store partitioned (as
	// NewPartitioned).
	Partitioned *PartitionConfig
}

// NewWithOptions is New (or NewPartitioned) with the checks of opts. It
// returns an error wrapping ErrPoolerExecMode when opts.TransactionPooler
// is set and the pool's DefaultQueryExecMode is cache_statement or
// describe_exec.
func NewWithOptions(pool *pgxpool.Pool, opts Options) (*Driver, error) {
	if opts.TransactionPooler {
		if err := CheckTransactionPooling(pool.Config().ConnConfig); err != nil {
			return nil, err
		}
	}
	if opts.Partitioned != nil {
		return NewPartitioned(pool, *opts.Partitioned), nil
	}
	return New(pool), nil
}

// CheckTransactionPooling returns an error wrapping ErrPoolerExecMode, and
// naming cfg's mode, when cfg's DefaultQueryExecMode cannot work behind a
// transaction pooler (see ErrPoolerExecMode); nil for exec,
// simple_protocol and cache_describe.
func CheckTransactionPooling(cfg *pgx.ConnConfig) error {
	switch m := cfg.DefaultQueryExecMode; m {
	case pgx.QueryExecModeExec, pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeCacheDescribe:
		return nil
	default:
		return fmt.Errorf("%w (it is %s)", ErrPoolerExecMode, m)
	}
}

// poolerErr wraps ErrPoolerExecMode around an error whose SQLSTATE says
// that a prepared statement did not survive the connection it was prepared
// on (42P05, 26000): the symptom of a statement-caching exec mode behind a
// transaction pooler.
func poolerErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		return fmt.Errorf("%w: %w", ErrPoolerExecMode, err)
	}
	return err
}
