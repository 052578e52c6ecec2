// Command idembench measures what idem costs per request, side by side with
// the same handler unprotected, on PostgreSQL, MariaDB and embedded SQLite.
//
// Every variant serves the same POST of a payment (an 80-byte JSON body)
// whose handler inserts a payment row and a ledger row in one transaction
// and answers 201 with 176 bytes of JSON; no provider call:
//
//   - bare: the handler alone, no idempotency (the denominator of every
//     ratio);
//   - idem-tx: idem's first execution in durable-claim mode, the rows
//     written in the claim's transaction (idem.Tx[pgx.Tx] or
//     idem.Tx[*sql.Tx]) and committed with the completion;
//   - idem-wait: idem-tx with the wait mode on (Waiting.Wait 10 s, as
//     cmd/paymentsd runs), nobody waiting: what the wait mode costs a first
//     execution (its ratio to idem-tx in the same round);
//   - idem-own: idem's first execution, the handler committing its own
//     transaction (the completion is a statement of its own);
//   - floor: no middleware, the statements idem needs sent by hand with the
//     raw driver (a claim INSERT committed on its own, then the business
//     transaction with the completion UPDATE by primary key): what a first
//     execution with a durable claim cannot go below;
//   - floor-1c: the one-commit mode's floor, the same statements by hand in
//     one transaction (the claim INSERT first, then the business writes and
//     the completion, one COMMIT): what a first execution in the one-commit
//     mode cannot go below;
//   - floor-replay: the replay floor, no middleware: the request hashed, the
//     key's record read with one prepared SELECT by primary key through the
//     raw driver, its stored response sent (what answering an existing key
//     cannot go below; replay, 409 and 422 are measured against it);
//   - floor-contract: the contract floor, the replay floor with what the
//     contract asks of every answer from a record, by hand: the key parsed,
//     idem's fingerprint (RFC 8785 form), the read bounded and detached from
//     the hang-up, an expired record not replayed, the key and its expiry
//     echoed (replay, 409 and 422 are measured against it too);
//   - replay, 409, 422: idem answering a completed key, a key in flight
//     (held by a request parked in its handler) and a completed key sent
//     with another body;
//   - naive-first, naive-replay: the article's naive Redis response cache
//     (GET, run, SET; no lock) on a miss and on a hit, for comparison.
//
// The load is real HTTP on loopback (an httptest server in the same
// process), closed loop at each concurrency, every variant alternated
// within each round and the ratios taken per round. The command prints the
// tables (markdown); with --docs it also writes them into the block of
// docs/benchmarks.md between the idembench markers and draws one PNG per
// database into docs/img (throughput and p99 per concurrency).
//
// Usage, from cmd/idembench (in the cmd module, so gonum/plot stays out of
// the library's go.mod):
//
//	go run . --docs ../../docs                      # the full run: ~15 minutes
//	go run . --quick --db sqlite                    # under a minute, prints only
//	go run . --db postgres --variants bare,idem-tx --concurrency 32 \
//	    --duration 20s --rounds 1 --cpuprofile cpu.out   # a CPU profile of one cell
//
// The PostgreSQL schema and the MariaDB database named by --place are
// dropped and created afresh at the start and dropped at the end; the
// SQLite file lives in a temporary directory.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/internal/command"
)

func main() { command.Main(run) }

// options are the command-line flags.
type options struct {
	dbs           []string
	concurrency   []int
	variants      []string
	rounds        int
	duration      time.Duration
	warmup        time.Duration
	maxRequests   int
	allocRequests int
	pgURL         string
	mysqlURL      string
	redisURL      string
	place         string
	docs          string
	cpuprofile    string
	quick         bool
	records       int // completed records written before the run (PostgreSQL)
	inFlight      int // PROCESSING records written before the run (PostgreSQL)
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type stringList []string

func (l *stringList) String() string { return strings.Join(*l, ",") }
func (l *stringList) Set(v string) error {
	*l = nil
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

type intList []int

func (l *intList) String() string {
	s := make([]string, len(*l))
	for i, n := range *l {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}
func (l *intList) Set(v string) error {
	*l = nil
	for _, s := range strings.Split(v, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n < 1 {
			return fmt.Errorf("%q is not a positive integer", s)
		}
		*l = append(*l, n)
	}
	return nil
}

func variantIDs() []string {
	ids := make([]string, len(allVariants))
	for i, v := range allVariants {
		ids[i] = v.id
	}
	return ids
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	o := options{
		dbs:         slices.Clone(allDatabases),
		concurrency: []int{1, 8, 32},
		variants:    variantIDs(),
	}
	fs := flag.NewFlagSet("idembench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Var((*stringList)(&o.dbs), "db", "databases to measure, comma-separated: "+strings.Join(allDatabases, ","))
	fs.Var((*intList)(&o.concurrency), "concurrency", "concurrent clients, comma-separated (default 1,8,32)")
	fs.Var((*stringList)(&o.variants), "variants", "variants to measure, comma-separated (default all: "+strings.Join(variantIDs(), ",")+"); ratios need bare")
	fs.IntVar(&o.rounds, "rounds", 3, "rounds: each runs every variant at every concurrency on every database once")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "how long each cell (variant x concurrency x database x round) runs")
	fs.DurationVar(&o.warmup, "warmup", time.Second, "an unrecorded run of every variant at the highest concurrency before the rounds")
	fs.IntVar(&o.maxRequests, "max-requests", 0, "stop a cell after this many requests (0: only --duration bounds it)")
	fs.IntVar(&o.allocRequests, "alloc-requests", 500, "requests per variant for the allocation count (0: skip it)")
	fs.StringVar(&o.pgURL, "pg-url", envOr("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"), "PostgreSQL server (default $TEST_DATABASE_URL or the local test server)")
	fs.StringVar(&o.mysqlURL, "mysql-url", envOr("TEST_MYSQL_URL", "mysql://root@127.0.0.1:3306/test"), "MariaDB / MySQL server (default $TEST_MYSQL_URL or the local test server)")
	fs.StringVar(&o.redisURL, "redis-url", envOr("TEST_REDIS_URL", "redis://127.0.0.1:6379/0"), "Redis server of the naive cache; \"\" leaves the naive variants out")
	fs.StringVar(&o.place, "place", "idembench", "the PostgreSQL schema, MariaDB database and SQLite file name the run owns (dropped first)")
	fs.StringVar(&o.docs, "docs", "", "the docs directory to write: its benchmarks.md block and img/idembench-<db>.png (default: print only)")
	fs.StringVar(&o.cpuprofile, "cpuprofile", "", "write a CPU profile of the measured rounds (server, driver and load generator: one process)")
	fs.IntVar(&o.records, "records", 0, "completed records to write into PostgreSQL's idem_keys before the run (growth: the same ratios on a full table)")
	fs.IntVar(&o.inFlight, "in-flight", 0, "PROCESSING records, under a live lease, to write into PostgreSQL's idem_keys before the run")
	fs.BoolVar(&o.quick, "quick", false, "a smoke run in under a minute: 1 round of 300ms cells at concurrency 1 and 8, 30 requests per allocation count (flags given explicitly win)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if o.quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
		if !set["rounds"] {
			o.rounds = 1
		}
		if !set["duration"] {
			o.duration = 300 * time.Millisecond
		}
		if !set["warmup"] {
			o.warmup = 100 * time.Millisecond
		}
		if !set["concurrency"] {
			o.concurrency = []int{1, 8}
		}
		if !set["alloc-requests"] {
			o.allocRequests = 30
		}
	}
	for _, d := range o.dbs {
		if !slices.Contains(allDatabases, d) {
			return o, fmt.Errorf("--db: unknown database %q (want %s)", d, strings.Join(allDatabases, ","))
		}
	}
	for _, v := range o.variants {
		if !slices.Contains(variantIDs(), v) {
			return o, fmt.Errorf("--variants: unknown variant %q (want %s)", v, strings.Join(variantIDs(), ","))
		}
	}
	switch {
	case len(o.dbs) == 0 || len(o.concurrency) == 0 || len(o.variants) == 0:
		return o, errors.New("--db, --concurrency and --variants need at least one value each")
	case o.rounds < 1:
		return o, errors.New("--rounds must be at least 1")
	case o.duration <= 0:
		return o, errors.New("--duration must be positive")
	case o.records < 0 || o.inFlight < 0:
		return o, errors.New("--records and --in-flight must not be negative")
	case (o.records > 0 || o.inFlight > 0) && !slices.Equal(o.dbs, []string{dbPostgres}):
		return o, errors.New("--records and --in-flight fill PostgreSQL only: give --db postgres")
	case o.place == "" || strings.ContainsAny(o.place, "/\\`\""):
		return o, errors.New("--place must be a plain name")
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		command.Errorf(stderr, "idembench: %v", err)
		return 2
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rep, err := bench(ctx, o, strings.TrimSpace("cd cmd/idembench && go run . "+strings.Join(args, " ")), stderr, log)
	if err != nil {
		command.Errorf(stderr, "idembench: %v", err)
		return 1
	}
	if _, err := io.WriteString(stdout, rep.markdown(false)); err != nil {
		command.Errorf(stderr, "idembench: writing the tables: %v", err)
		return 1
	}
	if errs := rep.errors(); len(errs) > 0 {
		command.Errorf(stderr, "idembench: unexpected answers; docs not written:\n  %s", strings.Join(errs, "\n  "))
		return 1
	}
	if o.docs != "" {
		if err := rep.writeDocs(o.docs); err != nil {
			command.Errorf(stderr, "idembench: %v", err)
			return 1
		}
		command.Errorf(stderr, "idembench: wrote %s/benchmarks.md and its plots", o.docs)
	}
	return 0
}

// bench runs the whole measurement and returns its report; progress goes to
// progress, one line per cell.
func bench(ctx context.Context, o options, cmdLine string, progress io.Writer, log *slog.Logger) (*report, error) {
	rep := &report{started: time.Now(), command: cmdLine, machine: describeMachine(), opts: o}
	var nonce [4]byte
	_, _ = rand.Read(nonce[:])
	tag := hex.EncodeToString(nonce[:])

	var naive *naiveCache
	if o.redisURL != "" && slices.ContainsFunc(o.variants, func(id string) bool { return id == vNaiveMiss || id == vNaiveHit }) {
		var err error
		var version string
		naive, version, err = openNaiveCache(ctx, o.redisURL, "idembench:"+tag+":")
		if err != nil {
			return nil, fmt.Errorf("%w (--redis-url \"\" leaves the naive variants out)", err)
		}
		defer func() {
			if err := naive.close(); err != nil {
				log.Warn("idembench: removing the naive cache's entries", "err", err)
			}
		}()
		rep.redis = version
	}
	for _, v := range allVariants {
		if slices.Contains(o.variants, v.id) && (!v.redis || naive != nil) {
			rep.variants = append(rep.variants, v)
		}
	}

	dir, err := os.MkdirTemp("", "idembench")
	if err != nil {
		return nil, err
	}
	defer func() {
		if err := os.RemoveAll(dir); err != nil {
			log.Warn("idembench: removing the temporary directory", "err", err)
		}
	}()
	var runs []*running
	defer func() {
		for _, r := range runs {
			r.close()
			if err := r.t.close(); err != nil {
				log.Warn("idembench: closing and dropping the database", "db", r.t.slug, "err", err)
			}
		}
	}()
	for _, slug := range o.dbs {
		t, err := openTarget(ctx, slug, o, dir)
		if err != nil {
			return nil, err
		}
		if o.records > 0 || o.inFlight > 0 {
			log.Info("idembench: filling idem_keys", "db", slug, "records", o.records, "in_flight", o.inFlight)
			if t.filled, err = t.fill(ctx, o.records, o.inFlight); err != nil {
				return nil, errors.Join(err, t.close())
			}
		}
		a, err := newApp(t, naive, log)
		if err != nil {
			return nil, errors.Join(err, t.close())
		}
		r := startRunning(t, a, tag+"-"+slug) // keys unique across databases: Redis is shared
		runs = append(runs, r)
		rep.targets = append(rep.targets, t)
		if err := r.setup(ctx); err != nil {
			return nil, err
		}
	}

	if o.allocRequests > 0 {
		for _, r := range runs {
			for _, v := range rep.variants {
				a, err := r.measureAllocs(ctx, v, o.allocRequests)
				if err != nil {
					return nil, err
				}
				rep.allocs = append(rep.allocs, a)
			}
		}
	}

	if o.warmup > 0 {
		top := slices.Max(o.concurrency)
		for _, r := range runs {
			for _, v := range rep.variants {
				c, err := r.measure(ctx, v, top, 0, o.warmup, o.maxRequests)
				if err != nil {
					return nil, err
				}
				if c.errs > 0 {
					return nil, fmt.Errorf("warm-up of %s on %s: %d unexpected answers (first: %s)", v.id, r.t.name, c.errs, c.firstErr)
				}
			}
		}
	}

	if o.cpuprofile != "" {
		f, err := os.Create(o.cpuprofile)
		if err != nil {
			return nil, err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return nil, errors.Join(err, f.Close())
		}
		defer func() {
			pprof.StopCPUProfile()
			if err := f.Close(); err != nil { // the profile may be incomplete
				log.Warn("idembench: writing the CPU profile", "path", o.cpuprofile, "err", err)
			}
		}()
	}
	total := o.rounds * len(runs) * len(o.concurrency) * len(rep.variants)
	done := 0
	for round := 1; round <= o.rounds; round++ {
		for _, r := range runs {
			for _, conc := range o.concurrency {
				// Rotate the order from round to round, so that no variant
				// always runs first (a cold cache) or after the same one,
				// and run each variant in two halves, the order forward
				// then backward (A B C ... C B A), so that a drift of the
				// machine within the round weighs on every variant alike.
				order := slices.Clone(rep.variants)
				k := (round - 1) % len(order)
				order = append(order[k:], order[:k]...)
				half, halfMax := o.duration/2, (o.maxRequests+1)/2
				first := map[string]cell{}
				for _, v := range order {
					c, err := r.measure(ctx, v, conc, round, half, halfMax)
					if err != nil {
						return nil, err
					}
					first[v.id] = c
				}
				for _, v := range slices.Backward(order) {
					c, err := r.measure(ctx, v, conc, round, o.duration-half, halfMax)
					if err != nil {
						return nil, err
					}
					c = first[v.id].merge(c)
					rep.cells = append(rep.cells, c)
					done++
					command.Errorf(progress, "idembench: [%d/%d] round %d %s c=%d %-12s %7.0f req/s  p50 %s ms  p99 %s ms  (%d requests, %d unexpected)",
						done, total, round, r.t.slug, conc, v.id, c.rps, ms(c.p50), ms(c.p99), c.n, c.errs)
				}
			}
		}
	}
	rep.elapsed = time.Since(rep.started)
	rep.machine.loadEnd = loadAverage()
	rep.sums = summarize(rep.cells)
	return rep, nil
}
