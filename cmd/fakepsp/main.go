package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"time"

	"github.com/idemgo/idem/cmd/internal/service"
)

func main() { service.Main("fakepsp", run) }

// options are the command-line flags: the shared ones (service.Flags) and
// fakepsp's own.
type options struct {
	service.Flags
	latency     time.Duration
	failRate    float64
	timeoutRate float64
	hang        time.Duration
	idempotency bool
}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := o.FlagSet(output, schema, "127.0.0.1:8090",
		"idem lease of a charge's Idempotency-Key (at least 1s)")
	fs.DurationVar(&o.latency, "latency", 0, "how long each charge takes before it is made")
	fs.Float64Var(&o.failRate, "fail-rate", 0, "fault injection: probability (0 to 1) that a charge answers 503 without charging")
	fs.Float64Var(&o.timeoutRate, "timeout-rate", 0, "fault injection: probability (0 to 1) that a new charge is made and recorded, then its answer withheld for --hang or until the client hangs up")
	fs.DurationVar(&o.hang, "hang", time.Minute, "how long a withheld answer (--timeout-rate) is held before it is sent anyway")
	fs.BoolVar(&o.idempotency, "idempotency", true, "keep charges' idempotency keys; --idempotency=false charges anew on every call, whatever its Idempotency-Key, as a provider without idempotency does")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := o.Check(fs); err != nil {
		return o, err
	}
	switch {
	case o.latency < 0 || o.hang < 0:
		return o, errors.New("--latency and --hang must not be negative")
	case !(o.failRate >= 0 && o.failRate <= 1) || !(o.timeoutRate >= 0 && o.timeoutRate <= 1):
		return o, errors.New("--fail-rate and --timeout-rate must be probabilities from 0 to 1")
	}
	return o, nil
}

// run starts the provider and blocks until ctx is done or SIGINT/SIGTERM
// arrives, then shuts down: stop accepting, wait for in-flight requests (at
// most --shutdown-timeout), close the database. It returns flag.ErrHelp
// after printing the usage for -h.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	return service.Run(ctx, stderr, service.Process[Store]{
		Flags: o.Flags, Name: "fakepsp",
		Open: func(ctx context.Context) (Store, error) { return openStore(ctx, o.DatabaseURL) },
		Serve: func(_ context.Context, log *slog.Logger, store Store, tel *service.Telemetry) (service.Served, error) {
			handler, err := newHandler(handlerConfig{
				Store: store, Logger: log, Lease: o.Lease, Latency: o.latency,
				FailRate: o.failRate, TimeoutRate: o.timeoutRate, Hang: o.hang, WithoutIdempotency: !o.idempotency,
				Observer: tel.Observer, Metrics: tel.Metrics,
			})
			return service.Served{Handler: handler, Attrs: []any{
				"lease", o.Lease.String(), "latency", o.latency.String(),
				"fail_rate", o.failRate, "timeout_rate", o.timeoutRate, "hang", o.hang.String(), "idempotency", o.idempotency}}, err
		},
	})
}
