package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"golang.org/x/term"

	"github.com/idemgo/idem/cmd/internal/command"
)

// Exit statuses.
const (
	exitOK     = 0 // every logical payment succeeded exactly once
	exitFailed = 1 // a double, lost, unanswered or stuck payment
	exitError  = 2 // the storm could not run (flags, servers, reconciliation)
)

func main() { command.Main(run) }

// options are the command-line flags.
type options struct {
	urls         []string
	paymentsdBin string
	databaseURL  string
	servers      int
	chaos        bool
	killEvery    time.Duration
	pspURL       string
	lease        time.Duration
	naive        bool
	redisURL     string
	payments     int
	duplicates   int
	// burst sends each payment once, all at once (runBurst).
	burst     bool
	merchants int
	loadShape
	report   string
	logDir   string
	progress bool
	// paymentsdArgs are the arguments after "--", passed to every paymentsd
	// started.
	paymentsdArgs []string
}

// urlList is a repeatable, comma-separated --url.
type urlList []string

func (l *urlList) String() string { return strings.Join(*l, ",") }

func (l *urlList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimRight(strings.TrimSpace(s), "/")
		u, err := url.Parse(s)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("%q is not a base URL such as http://127.0.0.1:8080", s)
		}
		*l = append(*l, s)
	}
	return nil
}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("idemstorm", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.Usage = func() {
		command.Errorf(output, "%s", "usage: idemstorm [flags] [-- paymentsd flags...]\n\nStorms cmd/paymentsd with duplicated, retried, cancelled payments (and SIGKILLs with --chaos),\nthen checks that each succeeded exactly once. See `go doc ./cmd/idemstorm`.\n\nflags:")
		fs.PrintDefaults()
	}
	fs.Var((*urlList)(&o.urls), "url", "base URL of a running paymentsd (repeatable or comma-separated); default: start --servers paymentsd processes")
	fs.StringVar(&o.paymentsdBin, "paymentsd-bin", "", "paymentsd binary to start; default: build ./cmd/paymentsd with go build into a temporary directory")
	fs.StringVar(&o.databaseURL, "database-url", "", "paymentsd's --database-url (postgres://..., mysql://..., sqlite:PATH); default: a new SQLite file in a temporary directory. With --url: optional, for the check of idem's records")
	fs.IntVar(&o.servers, "servers", 1, "paymentsd processes to start, all on one database")
	fs.BoolVar(&o.chaos, "chaos", false, "kill a random paymentsd with SIGKILL every --kill-every (on average) and restart it on the same address")
	fs.DurationVar(&o.killEvery, "kill-every", time.Second, "mean time between two --chaos kills (each drawn uniformly from half to one and a half of it)")
	fs.StringVar(&o.pspURL, "psp-url", "", "payment provider (cmd/fakepsp) base URL: passed to paymentsd, and its GET /v1/charges/stats is reconciled")
	fs.DurationVar(&o.lease, "lease", 3*time.Second, "paymentsd's --lease for the servers started (a SIGKILLed claim blocks its key this long); 0: paymentsd's default")
	fs.BoolVar(&o.naive, "naive", false, "start paymentsd with --naive (the Redis response cache instead of idem), to count its double charges")
	fs.StringVar(&o.redisURL, "redis-url", "", "paymentsd's --redis-url with --naive (default: paymentsd's, redis://127.0.0.1:6379/0)")
	fs.IntVar(&o.payments, "payments", 1000, "logical payments")
	fs.IntVar(&o.duplicates, "duplicates", 4, "concurrent copies of each logical payment, all with its Idempotency-Key")
	fs.BoolVar(&o.burst, "burst", false, "send every logical payment once, all at the same moment, with no retry (--duplicates, --concurrency, "+
		"--timeout-rate and --cancel-rate do not apply): each must complete (201) or be refused before its claim (503 overloaded, paymentsd --max-in-flight), "+
		"and nothing may be charged without a booked payment (docs/deployment.md, \"Leases under load\")")
	fs.IntVar(&o.merchants, "merchants", 0, "merchants (idempotency scopes); 0: one per 20 payments, at least 4")
	fs.IntVar(&o.concurrency, "concurrency", 32, "logical payments in flight at once (each with --duplicates copies)")
	fs.Float64Var(&o.timeoutRate, "timeout-rate", 0.1, "probability that a send gets a short deadline (up to --short-timeout)")
	fs.Float64Var(&o.cancelRate, "cancel-rate", 0.05, "probability that a send is cancelled at a random moment (within --short-timeout)")
	fs.DurationVar(&o.shortTimeout, "short-timeout", 500*time.Millisecond, "longest short deadline or cancellation delay")
	fs.DurationVar(&o.maxRetryAfter, "max-retry-after", time.Second, "cap on the Retry-After the client honours (a 409 says the whole lease left)")
	fs.DurationVar(&o.deadline, "deadline", 10*time.Minute, "global deadline: a logical payment still unanswered then is reported as unfinished")
	fs.StringVar(&o.report, "report", "", "write the JSON report to this file")
	fs.StringVar(&o.logDir, "log-dir", "", "keep the paymentsd logs in this directory; default: a temporary one, removed unless the storm fails")
	fs.BoolVar(&o.progress, "progress", true, "show a progress bar (only when standard output is a terminal)")
	fs.Uint64Var(&o.seed, "seed", 0, "random seed (0: random)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	o.paymentsdArgs = fs.Args()
	if len(args) > 0 && len(o.paymentsdArgs) > 0 && !containsDashDash(args, len(o.paymentsdArgs)) {
		return o, fmt.Errorf("unexpected arguments %q: put paymentsd's flags after --", o.paymentsdArgs)
	}
	return o, o.validate()
}

// containsDashDash reports whether the last n arguments follow a "--".
func containsDashDash(args []string, n int) bool {
	i := len(args) - n - 1
	return i >= 0 && args[i] == "--"
}

func (o *options) validate() error {
	var errs []error
	check := func(ok bool, msg string) {
		if !ok {
			errs = append(errs, errors.New(msg))
		}
	}
	check(o.payments >= 1, "--payments must be at least 1")
	check(o.duplicates >= 1, "--duplicates must be at least 1")
	check(o.merchants >= 0, "--merchants must not be negative")
	check(o.concurrency >= 1, "--concurrency must be at least 1")
	check(o.servers >= 1, "--servers must be at least 1")
	check(o.timeoutRate >= 0 && o.timeoutRate <= 1, "--timeout-rate must be a probability from 0 to 1")
	check(o.cancelRate >= 0 && o.cancelRate <= 1, "--cancel-rate must be a probability from 0 to 1")
	check(o.timeoutRate+o.cancelRate <= 1, "--timeout-rate plus --cancel-rate must not exceed 1")
	check(o.shortTimeout >= 10*time.Millisecond, "--short-timeout must be at least 10ms")
	check(o.maxRetryAfter > 0, "--max-retry-after must be positive")
	check(o.deadline > 0, "--deadline must be positive")
	check(o.killEvery >= 10*time.Millisecond, "--kill-every must be at least 10ms")
	check(o.lease == 0 || o.lease >= time.Second, "--lease must be 0 or at least 1s")
	check(!o.burst || !o.chaos || o.pspURL != "", "--burst with --chaos needs --psp-url: a burst's payments are sent once, its clients never retry, "+
		"and only the provider's charges say what paymentsd's completer must book")
	check(!o.burst || !o.chaos || !o.naive, "--burst with --chaos relies on paymentsd's completer, which --naive has not")
	if len(o.urls) > 0 {
		check(!o.chaos, "--chaos kills the servers it starts: it cannot be used with --url")
		check(o.paymentsdBin == "" && len(o.paymentsdArgs) == 0, "--paymentsd-bin and paymentsd flags apply to servers idemstorm starts, not to --url")
		check(!o.naive && o.redisURL == "", "--naive and --redis-url start paymentsd: start it yourself with --naive, and pass its --url")
	}
	check(o.redisURL == "" || o.naive, "--redis-url is for --naive")
	if o.pspURL != "" {
		u, err := url.Parse(o.pspURL)
		check(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "--psp-url must be a base URL such as http://127.0.0.1:8090")
		o.pspURL = strings.TrimRight(o.pspURL, "/")
	}
	if o.merchants == 0 {
		o.merchants = max(4, (o.payments+19)/20)
	}
	o.merchants = min(o.merchants, o.payments)
	return errors.Join(errs...)
}

// newRunID returns a short random run identifier, used in the merchant
// names so that runs on one database never meet.
func newRunID() string {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// run is the whole command; it returns the exit status.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	if err != nil {
		command.Errorf(stderr, "idemstorm: %v", err)
		return exitError
	}
	rep, err := storm(ctx, o, stdout, stderr)
	if err != nil {
		command.Errorf(stderr, "idemstorm: %v", err)
		return exitError
	}
	printErr := printSummary(stdout, rep)
	if o.report != "" {
		if err := writeReport(o.report, rep); err != nil {
			command.Errorf(stderr, "idemstorm: %v", err)
			return exitError
		}
	}
	code := exitOK
	if !rep.Verdict.OK {
		code = exitFailed
	}
	return command.Exit(code, printErr, stderr, "idemstorm", exitError)
}

// storm runs the whole storm: servers, load, chaos, reconciliation.
func storm(ctx context.Context, o options, stdout, stderr io.Writer) (*Report, error) {
	if o.pspURL != "" {
		if err := checkProvider(ctx, o.pspURL); err != nil {
			return nil, err
		}
	}
	runID := newRunID()
	if o.burst {
		o.duplicates, o.concurrency, o.timeoutRate, o.cancelRate = 1, o.payments, 0, 0
	}
	rep := newReport(o, runID)
	plan := newPlan(runID, o.payments, o.duplicates, o.merchants)

	hosts := o.urls
	var fl *fleet
	if len(hosts) == 0 {
		var cleanup func(failed bool)
		var err error
		fl, cleanup, err = startFleet(ctx, &o, stderr)
		if err != nil {
			return nil, err
		}
		failed := true
		defer func() { cleanup(failed) }()
		defer func() { failed = !rep.Verdict.OK }()
		hosts = fl.urls()
		rep.Config.DatabaseURL = redactURL(o.databaseURL)
		rep.Config.LogDir = fl.logDir
	}
	rep.Config.Servers = hosts

	// The load stops early when the fleet fails (a server that cannot be
	// restarted).
	loadCtx, stopLoad := context.WithCancelCause(ctx)
	defer stopLoad(nil)
	stopChaos := func() {}
	if fl != nil {
		chaosCtx, cancel := context.WithCancel(ctx)
		chaosDone := make(chan struct{})
		go func() {
			defer close(chaosDone)
			fl.supervise(chaosCtx, o.chaos, o.killEvery, func(err error) { stopLoad(errFleet{err}) })
		}()
		stopChaos = func() { cancel(); <-chaosDone }
	}

	var bar progressBar = noProgress{}
	if o.progress && isTerminal(stdout) {
		bar = newProgressBar(stdout, o.payments)
	}
	started := time.Now()
	lc := loadConfig{hosts: hosts, plan: plan, loadShape: o.loadShape, progress: bar}
	var res *loadResult
	if o.burst {
		res = runBurst(loadCtx, lc)
	} else {
		res = runLoad(loadCtx, lc)
	}
	bar.Finish()
	rep.Load = res.summary(time.Since(started))
	rep.Config.Seed = res.seed
	stopChaos()
	var fe errFleet
	if errors.As(context.Cause(loadCtx), &fe) {
		return nil, fe.err
	}
	if fl != nil {
		if err := fl.waitAllHealthy(ctx, time.Minute); err != nil {
			return nil, err
		}
		rep.Servers = fl.summary()
	}
	if ctx.Err() != nil {
		return nil, fmt.Errorf("interrupted: %w", ctx.Err())
	}

	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if o.burst && o.chaos {
		// The clients never retry: the completer books what the kills
		// left, and the books are read once it has.
		if err := settleBooks(rctx, newAPIClient(hosts), o.pspURL, o.databaseURL, plan, res.outcomes, completerSettle); err != nil {
			return nil, err
		}
	}
	rec, err := reconcile(rctx, newAPIClient(hosts), o.pspURL, plan, res.outcomes)
	if err != nil {
		return nil, fmt.Errorf("reconciliation: %w", err)
	}
	rep.Reconciliation = rec
	if o.burst {
		rep.Burst = burstSummary(plan, res.outcomes)
	}
	if o.databaseURL != "" {
		if o.naive {
			rep.Records = &RecordsCheck{Skipped: "naive mode keeps no idem records"}
		} else {
			rc, err := checkRecords(rctx, o.databaseURL, plan)
			if err != nil {
				return nil, fmt.Errorf("checking idem's records: %w", err)
			}
			rep.Records = rc
		}
	}
	rep.finish()
	return rep, nil
}

// checkProvider asks the provider for its stats before the storm starts, so
// that a wrong --psp-url fails at once rather than after the whole run (the
// reconciliation needs the stats; paymentsd's charges would all fail).
func checkProvider(ctx context.Context, pspURL string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var stats pspStats
	if err := newAPIClient(nil).getURL(ctx, func(int) string { return pspURL + "/v1/charges/stats" }, "", &stats); err != nil {
		return fmt.Errorf("--psp-url %s: the provider does not answer GET /v1/charges/stats (is cmd/fakepsp running there?): %w", redactURL(pspURL), err)
	}
	return nil
}

// errFleet is the cause of a load stopped by the fleet's failure.
type errFleet struct{ err error }

func (e errFleet) Error() string { return e.err.Error() }

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// redactURL hides a password in a database URL for the report.
func redactURL(s string) string {
	if u, err := url.Parse(s); err == nil && u.Scheme != "" && u.User != nil {
		return u.Redacted()
	}
	return s
}
