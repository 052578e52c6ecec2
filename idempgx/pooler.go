package idempgx

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"testing/fstest"

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
	// ListenConfig, when not nil, is the connection the wait mode's LISTEN
	// uses (idemdriver.Notifier; idem.EngineOptions.Waiting.Wait): one per process,
	// outside the pool. Behind a transaction pooler (TransactionPooler),
	// LISTEN needs a direct connection to the server or a session pooler;
	// without ListenConfig, waiters there poll. Default: the pool's
	// configuration, none with TransactionPooler.
	ListenConfig *pgx.ConnConfig
	// Schema, when not empty, is the schema of idem's tables (idem_keys,
	// idem_locks and the version table), named in every statement
	// (schema.idem_keys) instead of found through search_path: for poolers
	// that refuse or drop search_path as a startup parameter (pgbouncer
	// does one or the other, per ignore_startup_parameters). It must exist
	// (CREATE SCHEMA) and be a plain lower-case identifier
	// ([a-z_][a-z0-9_]*, at most 63 bytes). Not available with
	// Partitioned. Default: the search_path schema.
	Schema string
	// ClaimOrder is the order of a claim's read and INSERT (see
	// ClaimOrder): the same decisions either way, a statement fewer for
	// new keys (INSERT first) or for retries (read first). Pin it when the
	// traffic is known, or for a fixed statement count per claim. Ignored
	// with Partitioned. Default: ClaimAdaptive.
	ClaimOrder ClaimOrder
}

var schemaRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

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
	if opts.Schema != "" {
		if !schemaRE.MatchString(opts.Schema) {
			return nil, fmt.Errorf("idempgx: Options.Schema %q is not a plain lower-case identifier ([a-z_][a-z0-9_]*, at most 63 bytes)", opts.Schema)
		}
		if opts.Partitioned != nil {
			return nil, errors.New("idempgx: Options.Schema is not available for a partitioned store (its partitions are created in the search_path schema)")
		}
	}
	if opts.ClaimOrder < ClaimAdaptive || opts.ClaimOrder > ClaimInsertFirst {
		return nil, fmt.Errorf("idempgx: Options.ClaimOrder %d is not one of ClaimAdaptive, ClaimReadFirst, ClaimInsertFirst", opts.ClaimOrder)
	}
	var d *Driver
	if opts.Partitioned != nil {
		d = NewPartitioned(pool, *opts.Partitioned)
	} else {
		d = New(pool)
	}
	d.schema = opts.Schema
	d.listen, d.pooled = opts.ListenConfig, opts.TransactionPooler
	d.order.pinned = opts.ClaimOrder
	return d, nil
}

// Schema is the schema of idem's tables named in every statement
// (Options.Schema), or "" when they are found through search_path.
func (d *Driver) Schema() string { return d.schema }

// idemKeysRE finds the table names idem_keys and idem_steps in a statement
// (not the names of their indexes or partitions, idem_keys_...).
var idemKeysRE = regexp.MustCompile(`\bidem_(keys|steps)\b`)

// dropIndexRE finds the index a migration drops (DROP INDEX
// [CONCURRENTLY] [IF EXISTS] idem_...), whose name qualifiedFS qualifies
// too: an index is created in its table's schema, and found through
// search_path otherwise.
var dropIndexRE = regexp.MustCompile(`(DROP INDEX (?:CONCURRENTLY )?(?:IF EXISTS )?)(idem_\w+)`)

// q returns query with idem's table qualified by the driver's schema
// (Options.Schema); query itself when there is none. The rewritten text is
// computed once per statement.
func (d *Driver) q(query string) string {
	if d.schema == "" {
		return query
	}
	if v, ok := d.qualified.Load(query); ok {
		return v.(string)
	}
	v := idemKeysRE.ReplaceAllString(query, d.schema+".$0")
	d.qualified.Store(query, v)
	return v
}

// table qualifies one of idem's table names by the driver's schema.
func (d *Driver) table(name string) string {
	if d.schema == "" {
		return name
	}
	return d.schema + "." + name
}

// qualifiedFS is fsys with idem's table names qualified (see q) in every
// migration file: a copy in memory (a few kilobytes).
func (d *Driver) qualifiedFS(fsys fs.FS) (fs.FS, error) {
	if d.schema == "" {
		return fsys, nil
	}
	out := fstest.MapFS{}
	err := fs.WalkDir(fsys, ".", func(name string, e fs.DirEntry, err error) error {
		if err != nil || e.IsDir() {
			return err
		}
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		q := dropIndexRE.ReplaceAllString(d.q(string(b)), "${1}"+d.schema+".$2")
		out[name] = &fstest.MapFile{Data: []byte(q), Mode: 0o444}
		return nil
	})
	return out, err
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
	if errors.Is(err, ErrPoolerExecMode) {
		return err
	}
	if errors.As(err, &pgErr) && (pgErr.Code == "42P05" || pgErr.Code == "26000") {
		return fmt.Errorf("%w: %w", ErrPoolerExecMode, err)
	}
	return err
}
