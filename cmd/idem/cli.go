package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/command"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// globals are the flags every command takes.
type globals struct {
	databaseURL string
	json        bool
	partitioned bool
	timeout     time.Duration
	// sealKeys and keyHashSecret are --seal-key and --key-hash-secret as
	// given; keyring and hashSecret what they parse to.
	sealKeys      []string
	keyHashSecret string
	// hashSecretSet is whether --key-hash-secret was given (empty or not).
	hashSecretSet bool
	keyring       *seal.Keyring
	hashSecret    []byte
	// stderr takes the progress of long commands (and the errors).
	stderr io.Writer
}

// parseSealing reads --seal-key (or IDEM_SEAL_KEYS) and --key-hash-secret
// (or IDEM_KEY_HASH_SECRET).
func (g *globals) parseSealing() error {
	specs := g.sealKeys
	if len(specs) == 0 && os.Getenv("IDEM_SEAL_KEYS") != "" {
		specs = []string{os.Getenv("IDEM_SEAL_KEYS")}
	}
	var keys []seal.Key
	for _, s := range specs {
		if strings.TrimSpace(s) == "" { // an unset variable expanded to nothing: never "no key"
			return usageError{errors.New("--seal-key is empty: give id:base64secret, or leave the flag out")}
		}
		ks, err := seal.ParseKeys(s)
		if err != nil {
			return usageError{fmt.Errorf("--seal-key: %w", err)}
		}
		keys = append(keys, ks...)
	}
	kr, err := seal.NewKeyring(keys)
	if err != nil {
		return usageError{fmt.Errorf("--seal-key: %w", err)}
	}
	g.keyring = kr
	secret := g.keyHashSecret
	if secret == "" && g.hashSecretSet {
		return usageError{errors.New("--key-hash-secret is empty: give the base64 secret, or leave the flag out")}
	}
	if secret == "" {
		secret = os.Getenv("IDEM_KEY_HASH_SECRET")
	}
	if secret != "" {
		if g.hashSecret, err = seal.ParseHashSecret(secret); err != nil { // the minimum idem.New and paymentsd take
			return usageError{fmt.Errorf("--key-hash-secret: %w", err)}
		}
	}
	return nil
}

// storedKey is the key the store holds for the plain key given: its
// seal.HashKey under --key-hash-secret when one is given.
func (g *globals) storedKey(key string) string {
	if len(g.hashSecret) == 0 {
		return key
	}
	return seal.HashKey(g.hashSecret, key)
}

// run runs the command line args (without the program name), writing
// results to stdout and errors to stderr, and returns the exit status: 0, 1
// when the command failed (a failed write to stdout too), 2 for a usage
// error.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	out := command.NewWriter(stdout)
	return command.Exit(execute(ctx, args, out, stderr), out.Err(), stderr, "idem", 1)
}

func execute(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	g := &globals{stderr: stderr}
	root := newRoot(g, stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return 0
	}
	command.Errorf(stderr, "idem: %v", err)
	if missingTable(err) {
		command.Errorf(stderr, "idem: hint: idem's table is not in this database: check the URL's schema "+
			"(PostgreSQL: search_path=... or idem_schema=...; MySQL: the database name; SQLite: the file's path), or run `idem migrate up`")
	}
	var ue usageError
	if errors.As(err, &ue) || cmd == nil || !cmd.Runnable() || isFlagError(err) {
		return 2
	}
	return 1
}

// usageError marks an error in the command line itself.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func isFlagError(err error) bool {
	var fe flagError
	return errors.As(err, &fe)
}

type flagError struct{ error }

func newRoot(g *globals, stdout io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "idem",
		Short: "Operate an idem store: migrations, retention, and the story of a key",
		Long: `idem operates the store of github.com/idemgo/idem: its migrations, the
retention of its records (purge, partitions), and what an operator needs to
see at 3 a.m. without writing SQL (inspect, list, stuck, stats), and
release, which deletes a record: a stuck or FAILED record needs no action
(its next request takes it over under the same relayed key), and releasing
one can make a provider charge again (see ` + "`idem release --help`" + `), and
resolve, which ends an UNKNOWN record once you know what its at-most-once
step did (see ` + "`idem resolve --help`" + `).

Every time is the database's clock. Output is a table, or JSON with --json.

The database comes from --database-url (or IDEM_DATABASE_URL):
  postgres://... or postgresql://...  PostgreSQL (add search_path=... for a schema);
                                      a partitioned idem_keys is detected; behind
                                      pgbouncer add idem_pooler=transaction and
                                      idem_schema=NAME (docs/deployment.md)
  mysql://user:pass@host:port/db      MySQL / MariaDB
  sqlite:PATH, file:PATH or PATH      the SQLite file at PATH

A store whose records are sealed (idem.EngineOptions.Sealing.Keys) opens with
--seal-key id:base64secret (repeatable, or comma-separated; or
IDEM_SEAL_KEYS); one whose keys are hashed (KeyHashSecret) takes
--key-hash-secret base64secret (or IDEM_KEY_HASH_SECRET): --key is then the
client's plain key, and the record is found by its hash (docs/sealing.md).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if g.databaseURL == "" {
				g.databaseURL = os.Getenv("IDEM_DATABASE_URL")
			}
			g.hashSecretSet = cmd.Flags().Changed("key-hash-secret")
			return g.parseSealing()
		},
	}
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return flagError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.databaseURL, "database-url", "", "the database (default: $IDEM_DATABASE_URL); see above")
	pf.BoolVar(&g.json, "json", false, "print JSON instead of a table")
	pf.BoolVar(&g.partitioned, "partitioned", false,
		"PostgreSQL: use the partitioned table (daily partitions by expires_at); needed only for 'migrate up' on a new database")
	pf.StringArrayVar(&g.sealKeys, "seal-key", nil,
		"a sealing key, id:base64secret, to open sealed records (repeatable or comma-separated; default: $IDEM_SEAL_KEYS)")
	pf.StringVar(&g.keyHashSecret, "key-hash-secret", "",
		"the server's KeyHashSecret in base64 (at least 16 bytes): --key is hashed with it to find the record (default: $IDEM_KEY_HASH_SECRET)")
	pf.DurationVar(&g.timeout, "timeout", 10*time.Minute,
		"give up after this long (purge: stops between batches, finishing the one under way, and reports what it did)")

	root.AddCommand(migrateCmd(g, stdout), purgeCmd(g, stdout), partitionsCmd(g, stdout),
		inspectCmd(g, stdout), listCmd(g, stdout), releaseCmd(g, stdout), resolveCmd(g, stdout), stuckCmd(g, stdout), statsCmd(g, stdout))
	return root
}

// withStore opens the store for one command and closes it afterwards. A
// SQLite file must exist already.
func withStore(cmd *cobra.Command, g *globals, f func(ctx context.Context, s *store) error) error {
	return openAnd(cmd, g, false, f)
}

// readStore is withStore for a command that reads one value from the store
// and prints it.
func readStore[T any](cmd *cobra.Command, g *globals, read func(ctx context.Context, s *store) (T, error), print func(T) error) error {
	return withStore(cmd, g, func(ctx context.Context, s *store) error {
		v, err := read(ctx, s)
		if err != nil {
			return err
		}
		return print(v)
	})
}

// partitions is readStore through the store's Partitioner, printing the
// partitions read under verb (printPartitions).
func partitions(cmd *cobra.Command, g *globals, out io.Writer, verb string, read func(ctx context.Context, p idemdriver.Partitioner) ([]idemdriver.Partition, error)) error {
	return readStore(cmd, g, func(ctx context.Context, s *store) ([]idemdriver.Partition, error) {
		p, err := s.partitioner()
		if err != nil {
			return nil, err
		}
		return read(ctx, p)
	}, func(parts []idemdriver.Partition) error { return printPartitions(out, g.json, verb, parts) })
}

// withNewStore is withStore for migrate up, which may create the SQLite file.
func withNewStore(cmd *cobra.Command, g *globals, f func(ctx context.Context, s *store) error) error {
	return openAnd(cmd, g, true, f)
}

// openAnd opens the store, runs f and closes the store: f's error, else the
// close's.
func openAnd(cmd *cobra.Command, g *globals, create bool, f func(ctx context.Context, s *store) error) (err error) {
	ctx, cancel := context.WithTimeout(cmd.Context(), g.timeout)
	defer cancel()
	s, err := openStore(ctx, g.databaseURL, g.partitioned, create)
	if err != nil {
		return err
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing the store: %w", cerr)
		}
	}()
	return f(ctx, s)
}

// recordFlags name one key's record: --scope and --key (the client's key;
// hashed with --key-hash-secret).
type recordFlags struct{ scope, key string }

// add adds --scope (described by scopeUsage) and --key to c.
func (r *recordFlags) add(c *cobra.Command, scopeUsage string) {
	c.Flags().StringVar(&r.scope, "scope", "", scopeUsage)
	c.Flags().StringVar(&r.key, "key", "", "the Idempotency-Key as the client sent it, unquoted or as the header's quoted string (also with --key-hash-secret)")
}

// withRecord is withStore for a command about the record r names: f gets
// the record findRecord found (in every scope unless scoped).
func withRecord(cmd *cobra.Command, g *globals, out io.Writer, r recordFlags, scoped bool,
	f func(ctx context.Context, s *store, rec idemdriver.Record) error) error {
	return withStore(cmd, g, func(ctx context.Context, s *store) error {
		key := g.storedKey(r.key)
		rec, err := findRecord(ctx, s, out, g.json, r.scope, scoped, key)
		if v, perr := idem.ParseKey([]string{r.key}); errors.Is(err, errNoRecord) && perr == nil && v != r.key {
			// The key as the header carried it, quoted (the echoed
			// Idempotency-Key: "abc"): idem stores its value.
			r.key, key = v, g.storedKey(v)
			rec, err = findRecord(ctx, s, out, g.json, r.scope, scoped, key)
		}
		if errors.Is(err, errNoRecord) {
			if hint := notFoundHint(ctx, s, len(g.hashSecret) > 0, r, scoped, key); hint != "" {
				return fmt.Errorf("%w; %s", err, hint)
			}
		}
		if err != nil {
			return err
		}
		return f(ctx, s, rec)
	})
}

// notFoundHint says what the key-hash secret may have to do with finding no
// record for r (stored as key): without a secret, that the table stores
// its keys hashed; with one, that the key is stored as sent, that the
// table holds no hashed key, or else that the secret may not be the
// server's. "" when nothing points to the secret (or the store could not
// tell).
func notFoundHint(ctx context.Context, s *store, secretGiven bool, r recordFlags, scoped bool, key string) string {
	hashed, err := holdsHashedKeys(ctx, s, r.scope, scoped)
	switch {
	case err != nil:
		return ""
	case !secretGiven && hashed && !strings.HasPrefix(key, seal.HashedKeyPrefix):
		return fmt.Sprintf("the table stores its keys hashed (%s...): give --key-hash-secret (the server's KeyHashSecret) "+
			"to find a client's key, or --key the stored key, as the server's request log shows it", seal.HashedKeyPrefix)
	case !secretGiven:
		return ""
	}
	var plain bool
	if scoped {
		_, err = s.Driver.Get(ctx, idemdriver.GetParams{Scope: r.scope, Key: r.key})
		plain = err == nil
	} else {
		recs, lerr := s.Driver.List(ctx, idemdriver.ListParams{Key: r.key, Limit: 1})
		plain = lerr == nil && len(recs) > 0
	}
	switch {
	case plain:
		return fmt.Sprintf("the key %q is stored as sent, not hashed (written by a server without KeyHashSecret): leave out --key-hash-secret", r.key)
	case !hashed:
		return fmt.Sprintf("the table holds no hashed key (%s...): its server does not hash keys; leave out --key-hash-secret", seal.HashedKeyPrefix)
	}
	return fmt.Sprintf("that is the key %q hashed with --key-hash-secret: if a client sent it and its record has not expired, "+
		"--key-hash-secret is not the server's KeyHashSecret", r.key)
}

// errNoRecord is findRecord's error for a key no record holds.
var errNoRecord = errors.New("no record")

// holdsHashedKeys reports whether the table holds keys stored hashed
// (seal.HashKey's form): in scope, the first key after the prefix, one seek
// of the primary key; in every scope, the first record's key, or else the
// first hashed key of its scope.
func holdsHashedKeys(ctx context.Context, s *store, scope string, scoped bool) (bool, error) {
	if !scoped {
		recs, err := s.Driver.List(ctx, idemdriver.ListParams{Limit: 1})
		if err != nil || len(recs) == 0 {
			return false, err
		}
		if strings.HasPrefix(recs[0].Key, seal.HashedKeyPrefix) {
			return true, nil
		}
		scope = recs[0].Scope
	}
	recs, err := s.Driver.List(ctx, idemdriver.ListParams{Scope: scope, AfterScope: scope, AfterKey: seal.HashedKeyPrefix, Limit: 1})
	return err == nil && len(recs) == 1 && strings.HasPrefix(recs[0].Key, seal.HashedKeyPrefix), err
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	return nil
}

func migrateCmd(g *globals, out io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "migrate",
		Short: "Apply, roll back or list the store's schema migrations",
		Args:  noArgs,
	}
	status := func(ctx context.Context, s *store) error {
		list, err := s.Driver.MigrationStatus(ctx)
		if err != nil {
			return err
		}
		return printMigrations(out, g.json, s, list)
	}
	c.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every pending migration (with --partitioned on PostgreSQL: the partitioned table and its partitions ahead)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withNewStore(cmd, g, func(ctx context.Context, s *store) error {
				if err := s.Driver.Migrate(ctx); err != nil {
					return err
				}
				return status(ctx, s)
			})
		},
	}, downCmd(g, out), &cobra.Command{
		Use:   "status",
		Short: "List the migrations and whether each is applied",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, g, status)
		},
	})
	return c
}

// downCmd is `idem migrate down`: it refuses a rollback that drops records
// or steps (idemdriver.ErrDropsRecords) unless --force.
func downCmd(g *globals, out io.Writer) *cobra.Command {
	var force bool
	c := &cobra.Command{
		Use:   "down",
		Short: "Roll back the most recent migration; refused while it would drop records or steps (--force)",
		Long: `Roll back the most recent applied migration.

A rollback that would drop a table holding records or steps is refused:
rolling back the first migration drops idem_keys, the steps' migration
drops idem_steps. So is the rollback of the migration that brought
at-most-once steps, or the UNKNOWN state, while one is started without a
result: it would become an ordinary step, which a retry runs again, or
one whose uncertain call cannot be held. A record keeps its request from running twice, and a
step its call: without them a retry runs again, and an at-most-once step
(a transfer, an SMS) is made a second time. Roll such a table back only
when its rows can be lost (a test database, a table no client retries
against any more), with --force.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return withStore(cmd, g, func(ctx context.Context, s *store) error {
				down := s.Driver.MigrateDown
				if force {
					dropping, ok := s.Driver.(interface {
						MigrateDownDroppingRecords(context.Context) (idemdriver.Migration, error)
					})
					if !ok {
						return fmt.Errorf("--force: the driver %T cannot roll back past its records", s.Driver)
					}
					down = dropping.MigrateDownDroppingRecords
				}
				done, err := down(ctx)
				switch {
				case errors.Is(err, idemdriver.ErrDropsRecords):
					return fmt.Errorf("%w; nothing was rolled back (idem migrate down --help: --force)", err)
				case err != nil && strings.Contains(err.Error(), "idem_keys_state"):
					// PostgreSQL's and MariaDB's CHECK (SQLite names its own).
					return fmt.Errorf("%w; an UNKNOWN record remains: resolve it (idem stuck, idem resolve) before migrating down", err)
				case err != nil:
					return err
				}
				return printLine(out, g.json, fmt.Sprintf("rolled back %d %s", done.Version, done.Name),
					map[string]any{"rolled_back": map[string]any{"version": done.Version, "name": done.Name}})
			})
		},
	}
	c.Flags().BoolVar(&force, "force", false, "roll back even a migration that drops records or steps, and lose them")
	return c
}

func purgeCmd(g *globals, out io.Writer) *cobra.Command {
	var (
		olderThan  time.Duration
		batch      int
		maxBatches int
		dryRun     bool
	)
	c := &cobra.Command{
		Use:   "purge",
		Short: "Delete expired records in bounded batches",
		Long: `Delete expired records in batches of --batch, each batch its own short
transaction that waits for no request (PostgreSQL and MySQL: FOR UPDATE SKIP
LOCKED; SQLite: one DELETE ... LIMIT statement), until none is left or
--max-batches.

While it runs, it shows its progress on stderr: a bar on a terminal, else a
line every 2 s. It stops between batches when --timeout passes or on
SIGINT/SIGTERM (the batch under way is finished first, for up to 10 s more),
prints what it purged, and exits 1: expired records remain, run it again.

--older-than D selects the records whose expires_at is more than D in the
past, by the database's clock: expires_at <= now - D. The default, 0,
selects every expired record. A PROCESSING record whose lease is still live
is never deleted, expired or not.

An expired record is answered as a new request whether it is purged or not:
purging frees space, it does not change what clients get. Purging while an
retention.Maintainer runs is safe. On a partitioned PostgreSQL table prefer
` + "`idem partitions drop`" + `, which removes whole days without a DELETE.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 || batch <= 0 || maxBatches < 0 {
				return usageError{errors.New("--older-than must not be negative, --batch must be positive, --max-batches not negative")}
			}
			return withStore(cmd, g, func(ctx context.Context, s *store) error {
				params := idemdriver.PurgeParams{Limit: batch, OlderThan: olderThan}
				if dryRun {
					n, err := whileRunning(ctx, g.stderr, "purge --dry-run: counting the expired records", func() (int64, error) {
						return s.Driver.CountExpired(ctx, params)
					})
					if err != nil {
						return err
					}
					return printPurge(out, g.json, purgeResult{DryRun: true, OlderThan: olderThan, Batch: batch, Purged: n})
				}
				return purge(ctx, g, s, out, params, maxBatches)
			})
		},
	}
	f := c.Flags()
	f.DurationVar(&olderThan, "older-than", 0, "purge records whose expires_at is more than this in the past (0: every expired record)")
	f.IntVar(&batch, "batch", 1000, "records per batch (one short transaction each)")
	f.IntVar(&maxBatches, "max-batches", 0, "stop after this many batches (0: until no expired record is left)")
	f.BoolVar(&dryRun, "dry-run", false, "count the records that would be purged; delete nothing")
	return c
}

func partitionsCmd(g *globals, out io.Writer) *cobra.Command {
	c := &cobra.Command{
		Use:   "partitions",
		Short: "Create, drop or list the daily partitions (PostgreSQL partitioned mode)",
		Long: `In partitioned mode (idempgx.NewPartitioned; ` + "`idem migrate up --partitioned`" + `),
idem_keys is range partitioned by expires_at, one partition per UTC day
(idem_keys_pYYYYMMDD). Partitions are created ahead and dropped once every
record in them has expired; a retention.Maintainer does both every cycle.`,
		Args: noArgs,
	}
	var daysAhead int
	ensure := &cobra.Command{
		Use:   "ensure",
		Short: "Create the missing partitions of today through today + --days-ahead (UTC days)",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return partitions(cmd, g, out, "created", func(ctx context.Context, p idemdriver.Partitioner) ([]idemdriver.Partition, error) {
				return p.EnsurePartitions(ctx, idemdriver.PartitionParams{DaysAhead: daysAhead})
			})
		},
	}
	ensure.Flags().IntVar(&daysAhead, "days-ahead", 0, "days past today to cover (0: the driver's default, 7)")
	var (
		olderThan time.Duration
		dryRun    bool
	)
	drop := &cobra.Command{
		Use:   "drop",
		Short: "Drop the partitions whose whole range has expired",
		Long: `Drop the partitions whose whole range of expires_at lies more than
--older-than in the past (its end <= now - D, by the database's clock; 0:
every partition whose records have all expired). A partition that still
holds a PROCESSING record under a live lease is kept for a later run. Each
drop is DETACH PARTITION ... CONCURRENTLY then DROP TABLE: no DELETE, no
vacuum, and claims are not blocked.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if olderThan < 0 {
				return usageError{errors.New("--older-than must not be negative")}
			}
			verb := "dropped"
			if dryRun {
				verb = "would drop"
			}
			return partitions(cmd, g, out, verb, func(ctx context.Context, p idemdriver.Partitioner) ([]idemdriver.Partition, error) {
				return whileRunning(ctx, g.stderr, "partitions drop", func() ([]idemdriver.Partition, error) {
					return p.DropPartitions(ctx, idemdriver.PartitionParams{OlderThan: olderThan, DryRun: dryRun})
				})
			})
		},
	}
	drop.Flags().DurationVar(&olderThan, "older-than", 0, "drop only partitions whose end is more than this in the past")
	drop.Flags().BoolVar(&dryRun, "dry-run", false, "list the partitions that would be dropped; drop nothing")
	list := &cobra.Command{
		Use:   "list",
		Short: "List the partitions, oldest first",
		Args:  noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return partitions(cmd, g, out, "", func(ctx context.Context, p idemdriver.Partitioner) ([]idemdriver.Partition, error) {
				return p.Partitions(ctx)
			})
		},
	}
	c.AddCommand(ensure, drop, list)
	return c
}

func inspectCmd(g *globals, out io.Writer) *cobra.Command {
	var (
		rf            recordFlags
		body, request bool
	)
	c := &cobra.Command{
		Use:   "inspect --key K [--scope S] [--body] [--request]",
		Short: "Show one key's record: its state, lease, fencing token, response and what its next request gets",
		Long: `Show one key's record: its state, owner, lease, fencing token, stored
response and what the next request with the key gets.

Without --scope, every scope is searched for the key: one record is shown;
when several scopes hold the key, they are listed and --scope must choose.
--body prints the whole stored response body (the table shows its first
64 bytes): as is when it is UTF-8 text, else as a hex dump; --json adds it
as body (text) and body_base64 (the exact bytes).

--request prints the request kept beside the record for an audit
(idem.EngineOptions.Sealing.KeepRequestBytes; SUCCEEDED records only): its
Content-Type, query string, size and body (its first KeepRequestBytes bytes,
flagged truncated); --json adds it as request.

A sealed record (idem.EngineOptions.Sealing.Keys) shows its response and request
only with the key that sealed it (--seal-key); without it, inspect says which
key id it needs and shows the plain columns. On a table whose keys are
stored hashed (KeyHashSecret), a plain --key without --key-hash-secret finds
nothing, and inspect says the table holds hashed keys; --key also takes the
stored key itself (h1_..., as the server's log shows it). A key that
--key-hash-secret finds nothing for gets a hint too: the secret may not be
the server's, or the table's keys are not hashed.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rf.key == "" {
				return usageError{errors.New("--key is required (--scope too when several scopes hold the key)")}
			}
			return withRecord(cmd, g, out, rf, cmd.Flags().Changed("scope"), func(ctx context.Context, s *store, rec idemdriver.Record) error {
				now, err := s.Driver.Now(ctx, 0)
				if err != nil {
					return err
				}
				note := openRecord(&rec, g.keyring)
				steps, err := stepsOf(ctx, s, g.keyring, rec)
				if err != nil {
					return err
				}
				return printRecord(out, g.json, rec, now, recordView{body: body, request: request, seal: note, steps: steps})
			})
		},
	}
	rf.add(c, "the key's scope (tenant, account); default: search every scope")
	c.Flags().BoolVar(&body, "body", false, "print the whole stored response body")
	c.Flags().BoolVar(&request, "request", false, "print the request kept for an audit (KeepRequestBytes)")
	return c
}

// maxScopesShown bounds the scopes findRecord lists for a key held by
// several.
const maxScopesShown = 20

// findRecord reads the record of key in scope when scoped, else searches
// every scope for it (Lister.List by key): the one record, or an error
// that lists the scopes holding the key when there are several (printed to
// out as a table, or JSON) or says that none does.
func findRecord(ctx context.Context, s *store, out io.Writer, asJSON bool, scope string, scoped bool, key string) (idemdriver.Record, error) {
	if scoped {
		rec, err := s.Driver.Get(ctx, idemdriver.GetParams{Scope: scope, Key: key})
		if errors.Is(err, idemdriver.ErrNotFound) {
			return rec, fmt.Errorf("%w for scope %q and key %q (never seen, or purged after it expired)", errNoRecord, scope, key)
		}
		return rec, err
	}
	recs, err := s.Driver.List(ctx, idemdriver.ListParams{Key: key, Limit: maxScopesShown + 1})
	switch {
	case err != nil:
		return idemdriver.Record{}, err
	case len(recs) == 0:
		return idemdriver.Record{}, fmt.Errorf("%w for key %q in any scope (never seen, or purged after it expired)", errNoRecord, key)
	case len(recs) == 1:
		return recs[0], nil
	}
	more := len(recs) > maxScopesShown
	recs = recs[:min(len(recs), maxScopesShown)]
	now, err := s.Driver.Now(ctx, 0)
	if err != nil {
		return idemdriver.Record{}, err
	}
	if err := printRecords(out, asJSON, recs, now, nil); err != nil {
		return idemdriver.Record{}, err
	}
	n := fmt.Sprint(len(recs))
	if more {
		n = "more than " + n
	}
	return idemdriver.Record{}, usageError{fmt.Errorf("%s scopes hold key %q (listed above): give --scope", n, key)}
}

// maxListLimit bounds --limit of idem list.
const maxListLimit = 10000

func listCmd(g *globals, out io.Writer) *cobra.Command {
	var (
		state, scope, afterScope, afterKey string
		limit                              int
	)
	c := &cobra.Command{
		Use:   "list --state FAILED|PROCESSING|SUCCEEDED|UNKNOWN [--scope S] [--limit N]",
		Short: "List the records in one state (of one scope), a page at a time",
		Long: `List the records in a state (--state; every state when omitted), of one
scope (--scope; every scope when omitted), in (scope, key) order, --limit per
page. A full page ends with the command that lists the next one
(--after-scope and --after-key name the last record shown); with --json,
"next" holds them, null on the last page.

FAILED records run again on their next request; PROCESSING ones are
running, or stuck once their lease ran out (see stuck); SUCCEEDED ones are
replayed. Expired records not purged yet are listed too.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			st, err := parseState(state)
			if err != nil {
				return usageError{err}
			}
			if limit <= 0 || limit > maxListLimit {
				return usageError{fmt.Errorf("--limit must be from 1 to %d", maxListLimit)}
			}
			if afterKey == "" && afterScope != "" {
				return usageError{errors.New("--after-scope needs --after-key (the last record of the previous page)")}
			}
			return withStore(cmd, g, func(ctx context.Context, s *store) error {
				recs, err := s.Driver.List(ctx, idemdriver.ListParams{State: st, Scope: scope,
					AfterScope: afterScope, AfterKey: afterKey, Limit: limit + 1})
				if err != nil {
					return err
				}
				var next *idemdriver.Record
				if len(recs) > limit {
					recs = recs[:limit]
					next = &recs[limit-1]
				}
				now, err := s.Driver.Now(ctx, 0)
				if err != nil {
					return err
				}
				if err := printRecords(out, g.json, recs, now, next); err != nil {
					return err
				}
				if next != nil && !g.json {
					args := []string{"idem", "list"}
					if state != "" {
						args = append(args, "--state", string(st))
					}
					if scope != "" {
						args = append(args, "--scope", shellQuote(scope))
					}
					args = append(args, "--limit", fmt.Sprint(limit),
						"--after-scope", shellQuote(next.Scope), "--after-key", shellQuote(next.Key))
					_, err = fmt.Fprintf(out, "\nnext page: %s\n", strings.Join(args, " "))
				}
				return err
			})
		},
	}
	f := c.Flags()
	f.StringVar(&state, "state", "", "FAILED, PROCESSING, SUCCEEDED or UNKNOWN (any case); default: every state")
	f.StringVar(&scope, "scope", "", "list only this scope's records; default: every scope")
	f.IntVar(&limit, "limit", 50, "records per page")
	f.StringVar(&afterScope, "after-scope", "", "start after this scope's record --after-key (the previous page's last)")
	f.StringVar(&afterKey, "after-key", "", "start after this key (with --after-scope)")
	return c
}

// parseState reads --state: empty, or a state's name in any case.
func parseState(s string) (idemdriver.State, error) {
	if s == "" {
		return "", nil
	}
	for _, st := range []idemdriver.State{idemdriver.StateFailed, idemdriver.StateProcessing, idemdriver.StateSucceeded, idemdriver.StateUnknown} {
		if strings.EqualFold(s, string(st)) {
			return st, nil
		}
	}
	return "", fmt.Errorf("--state must be FAILED, PROCESSING, SUCCEEDED or UNKNOWN, not %q", s)
}

// shellQuote quotes s for a POSIX shell when it is not a plain word.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.:/@+=,") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func releaseCmd(g *globals, out io.Writer) *cobra.Command {
	var (
		rf    recordFlags
		force bool
	)
	c := &cobra.Command{
		Use:   "release --scope S --key K --force",
		Short: "Delete one key's record, so that its next request runs as new (needs --force: a provider may charge again)",
		Long: `Delete one key's record, fenced: only the record as just read (its fencing
token and created_at, and its state) is removed, so a request that claims the
key meanwhile keeps it. The next request with the key then runs as a new one
(a service with idem.Options.Replay.Cache.Bytes set may still replay it from
memory, for up to its ReplayCacheTTL, in each process that had replayed it).

The record is what keeps the key's relayed key stable: idem.DeriveKey mixes
in the record's created_at (docs/crash-semantics.md), so while the record
lives, every execution of the key sends the provider the same relayed key,
and a provider that already charged answers with that charge. A stuck
record (PROCESSING past its lease, see stuck) or a FAILED one needs
nothing: the next request with the key takes it over, or runs again, under
the same relayed key. Released, the next request runs as new, with a new
created_at and so a new relayed key: a provider that already charged will
charge again.

Release a record only when you know no side effect happened (a validation
failure, say, that a client must retry with another body), or when you have
reconciled with the provider. So every record needs --force, and an UNKNOWN
one is never released:

  PROCESSING past its lease       refused unless --force: the next request
                                  takes it over with the same relayed key
  PROCESSING under a live lease   refused unless --force: its owner may still
                                  be running, and the next request would run
                                  a second execution beside it
  PROCESSING with no lease        refused unless --force: a damaged record
                                  (see stuck), answered 500 record-damaged
                                  until released; find out what its
                                  execution did first
  FAILED                          refused unless --force: the next request
                                  runs again with the same relayed key
  SUCCEEDED                       refused unless --force: the next request
                                  would run again instead of being replayed
                                  (without its response, a damaged record,
                                  it is answered 500 response-missing until
                                  released; its side effect did happen)
  UNKNOWN                         refused, even with --force: end it with
                                  idem resolve (see its --help)`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if rf.key == "" || !cmd.Flags().Changed("scope") {
				return usageError{errors.New("--scope and --key are required")}
			}
			return withRecord(cmd, g, out, rf, true, func(ctx context.Context, s *store, rec idemdriver.Record) error {
				if rec.State == idemdriver.StateUnknown {
					return errors.New("not released, even with --force: it is UNKNOWN (an at-most-once step started without a " +
						"result, or the completer could not finish it: idem inspect shows its steps); released, the next request " +
						"would run its steps again. End it with `idem resolve --applied` or `--not-applied` once you know")
				}
				why := releaseRefusal(rec)
				if started := startedSteps(ctx, s, rec); started != "" {
					why += "; and steps of its life started (" + started + "): released, the next request runs them again " +
						"under new relayed keys (idem.ReleaseKey refuses for that reason)"
				}
				if !force {
					return fmt.Errorf("not released: %s. Released, the next request would run as new under a new relayed key, "+
						"and a provider that already charged would charge again; give --force only when you know no side effect "+
						"happened (a validation failure, say) or have reconciled with the provider", why)
				}
				fence := idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt}
				var (
					released bool
					err      error
				)
				if rec.State == idemdriver.StateProcessing {
					released, err = s.Driver.Release(ctx, fence)
				} else {
					released, err = s.Driver.Remove(ctx, idemdriver.RemoveParams{FenceParams: fence, State: rec.State})
				}
				if err != nil {
					return err
				}
				if !released {
					return fmt.Errorf("not released: the record changed since it was read (a request claimed or completed it); inspect it again")
				}
				return printLine(out, g.json,
					fmt.Sprintf("released %s/%s (%s, fencing token %d): its next request runs as new", rec.Scope, rec.Key, rec.State, rec.FencingToken),
					map[string]any{"released": map[string]any{"scope": rec.Scope, "key": rec.Key, "state": rec.State,
						"fencing_token": rec.FencingToken, "owner": rec.Owner}})
			})
		},
	}
	rf.add(c, "the key's scope (tenant, account)")
	c.Flags().BoolVar(&force, "force", false,
		"delete the record: only when no side effect happened or you have reconciled with the provider (see above)")
	return c
}

// startedSteps names the application's steps of rec's life that started
// or have a result ("charge: result recorded, sms: started"), "" for none
// or when they cannot be read.
func startedSteps(ctx context.Context, s *store, rec idemdriver.Record) string {
	views, err := stepsOf(ctx, s, nil, rec)
	if err != nil {
		return ""
	}
	var names []string
	for _, v := range views {
		switch {
		case !idemdriver.StepStarted(v.Step):
		case v.Done:
			names = append(names, v.Name+": result recorded")
		default:
			names = append(names, v.Name+": started")
		}
	}
	return strings.Join(names, ", ")
}

// releaseRefusal says why releasing rec needs --force, which every record
// does: the record keeps the key's relayed key stable (idem.DeriveKey
// mixes in its created_at), so what to do instead depends on its state.
func releaseRefusal(rec idemdriver.Record) string {
	switch {
	case rec.Damaged():
		return "it is damaged (PROCESSING without a lease bound): no request takes it over, each is answered 500 record-damaged, " +
			"and whether its execution ran, or still runs, cannot be told from the record"
	case rec.State == idemdriver.StateProcessing && rec.LeaseLeft > 0:
		owner := ""
		if rec.Owner != "" {
			owner = " (" + rec.Owner + ")"
		}
		return fmt.Sprintf("its lease is live for %s more: its owner%s may still be running, and the next request would run beside it", dur(rec.LeaseLeft), owner)
	case rec.State == idemdriver.StateProcessing:
		return "its lease ran out (its worker died or stalled): there is nothing to release, " +
			"the next request with the key takes it over under the same relayed key"
	case rec.State == idemdriver.StateFailed:
		return "it FAILED with a retryable outcome: there is nothing to release, " +
			"the next request with the key runs again under the same relayed key"
	case rec.Response != nil:
		return fmt.Sprintf("it succeeded and its %d response is replayed; released, the next request would run again", rec.Response.Status)
	default:
		return "it succeeded, but its response is missing (a damaged record, answered 500 response-missing): its side effect happened"
	}
}

func stuckCmd(g *globals, out io.Writer) *cobra.Command {
	var limit int
	c := &cobra.Command{
		Use:   "stuck",
		Short: "List damaged PROCESSING records, those past their lease (owner died or stalled), longest overdue first, then UNKNOWN ones",
		Long: `List the PROCESSING records whose lease ran out (locked_until <= now, by
the database's clock): their worker died or stalled before recording an
outcome. The next request with such a key takes it over and runs again, with
the next fencing token and the same relayed key (the record's created_at is
kept), so a provider that already charged answers with that charge: release
is not needed, and releasing the record would lose that key (see
` + "`idem release --help`" + `).

Damaged records come first ("DAMAGED: no lease"; "damaged": true in --json):
PROCESSING with no lease bound at all (locked_until NULL), which no claim or
renewal writes: a hand edit, or a partial restore. Whether their execution
ran, or still runs, cannot be told, so no request takes them over: each is
answered 500 record-damaged (docs/problems.md) and never run. Find out what
the execution did (the provider, the application's own rows), then release
the key with --force.

UNKNOWN records follow (docs/contract.md section 11.3): an at-most-once step
(idem.AtMostOnce) started and its outcome cannot be known, or the completer
gave up; each is listed with its step and the reason. No request runs them
again; find out from the callee what happened, then run idem resolve.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return usageError{errors.New("--limit must be positive")}
			}
			return readStore(cmd, g, func(ctx context.Context, s *store) (stuckView, error) {
				var v stuckView
				var err error
				if v.stuck, err = s.Driver.Stuck(ctx, idemdriver.StuckParams{Limit: limit}); err != nil {
					return v, err
				}
				v.unknown, err = unknownRecords(ctx, s, limit)
				return v, err
			}, func(v stuckView) error { return printStuck(out, g.json, v) })
		},
	}
	c.Flags().IntVar(&limit, "limit", 50, "list at most this many")
	return c
}

func statsCmd(g *globals, out io.Writer) *cobra.Command {
	var top int
	c := &cobra.Command{
		Use:   "stats",
		Short: "Count the records by state and by scope; the oldest record; expired and stuck counts",
		Long: `Count the records by state and by scope (the --top largest scopes), and
give the oldest record's age, the expired records not purged yet and the
PROCESSING records past their lease. Counts are exact: this reads the whole
table, so on a large store run it on a replica or at a quiet hour.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if top < 0 {
				return usageError{errors.New("--top must not be negative")}
			}
			return readStore(cmd, g, func(ctx context.Context, s *store) (idemdriver.Stats, error) {
				return whileRunning(ctx, g.stderr, "stats: counting the records", func() (idemdriver.Stats, error) {
					return s.Driver.Stats(ctx, idemdriver.StatsParams{TopScopes: top})
				})
			}, func(st idemdriver.Stats) error { return printStats(out, g.json, st) })
		},
	}
	c.Flags().IntVar(&top, "top", 10, "list this many scopes, largest first")
	return c
}
