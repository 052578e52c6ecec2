package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/idemgo/idem/internal/service"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "fakepsp:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	addr            string
	databaseURL     string
	lease           time.Duration
	latency         time.Duration
	failRate        float64
	timeoutRate     float64
	hang            time.Duration
	shutdownTimeout time.Duration
	logFormat       string
	otelTraces      string
}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("fakepsp", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8090", "address to listen on")
	fs.StringVar(&o.databaseURL, "database-url", "",
		"database: postgres://... or postgresql://... for PostgreSQL; sqlite:PATH, file:PATH or a PATH for SQLite (default: SQLite file "+DefaultSQLitePath+" in the working directory)")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "idem lease of a charge's Idempotency-Key (at least 1s)")
	fs.DurationVar(&o.latency, "latency", 0, "how long each charge takes before it is made")
	fs.Float64Var(&o.failRate, "fail-rate", 0, "fault injection: probability (0 to 1) that a charge answers 503 without charging")
	fs.Float64Var(&o.timeoutRate, "timeout-rate", 0, "fault injection: probability (0 to 1) that a new charge is made and recorded, then its answer withheld for --hang or until the client hangs up")
	fs.DurationVar(&o.hang, "hang", time.Minute, "how long a withheld answer (--timeout-rate) is held before it is sent anyway")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long to wait for in-flight requests on SIGINT/SIGTERM")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format on stderr: json or text")
	fs.StringVar(&o.otelTraces, "otel-traces", service.TracesNone, "OpenTelemetry spans of each request and of idem's claim, execute and complete: none, or stdout (one JSON object each on stdout); metrics are served at GET /metrics either way")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case o.logFormat != "json" && o.logFormat != "text":
		return o, fmt.Errorf("--log-format must be json or text, not %q", o.logFormat)
	case !service.ValidTraces(o.otelTraces):
		return o, fmt.Errorf("--otel-traces must be none or stdout, not %q", o.otelTraces)
	case o.lease < time.Second:
		return o, errors.New("--lease must be at least 1s")
	case o.latency < 0 || o.hang < 0:
		return o, errors.New("--latency and --hang must not be negative")
	case !(o.failRate >= 0 && o.failRate <= 1) || !(o.timeoutRate >= 0 && o.timeoutRate <= 1):
		return o, errors.New("--fail-rate and --timeout-rate must be probabilities from 0 to 1")
	}
	return o, nil
}

// run starts the provider and blocks until ctx is done or SIGINT/SIGTERM
// arrives, then shuts down: stop accepting, wait for in-flight requests (at
// most --shutdown-timeout), close the database.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	return service.Run(ctx, stderr, service.Process[Store]{
		LogFormat: o.logFormat, Addr: o.addr, ShutdownTimeout: o.shutdownTimeout, Name: "fakepsp", Traces: o.otelTraces,
		Open: func(ctx context.Context) (Store, error) { return openStore(ctx, o.databaseURL) },
		Serve: func(_ context.Context, log *slog.Logger, store Store, tel *service.Telemetry) (service.Served, error) {
			handler, err := newHandler(handlerConfig{
				Store: store, Logger: log, Lease: o.lease, Latency: o.latency,
				FailRate: o.failRate, TimeoutRate: o.timeoutRate, Hang: o.hang,
				Observer: tel.Observer, Metrics: tel.Metrics,
			})
			kind, target, _ := parseDatabaseURL(o.databaseURL) // openStore took it
			return service.Served{Handler: handler, Attrs: []any{"database", service.DescribeDatabase(kind, target),
				"lease", o.lease.String(), "latency", o.latency.String(),
				"fail_rate", o.failRate, "timeout_rate", o.timeoutRate, "hang", o.hang.String()}}, err
		},
	})
}
