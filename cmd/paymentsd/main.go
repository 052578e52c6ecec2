package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "paymentsd:", err)
		os.Exit(1)
	}
}

// options are the command-line flags.
type options struct {
	addr            string
	databaseURL     string
	pspLatency      time.Duration
	lease           time.Duration
	shutdownTimeout time.Duration
	logFormat       string
}

func parseFlags(args []string, output io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("paymentsd", flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&o.addr, "addr", "127.0.0.1:8080", "address to listen on")
	fs.StringVar(&o.databaseURL, "database-url", "",
		"database: postgres://... or postgresql://... for PostgreSQL; sqlite:PATH, file:PATH or a PATH for SQLite (default: SQLite file "+DefaultSQLitePath+" in the working directory)")
	fs.DurationVar(&o.pspLatency, "psp-latency", 300*time.Millisecond, "how long the fake payment provider takes per charge")
	fs.DurationVar(&o.lease, "lease", 30*time.Second, "idem lease: how long a request owns its Idempotency-Key before another may take it over")
	fs.DurationVar(&o.shutdownTimeout, "shutdown-timeout", 15*time.Second, "how long to wait for in-flight requests on SIGINT/SIGTERM")
	fs.StringVar(&o.logFormat, "log-format", "json", "log format on stderr: json or text")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	switch {
	case fs.NArg() > 0:
		return o, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case o.logFormat != "json" && o.logFormat != "text":
		return o, fmt.Errorf("--log-format must be json or text, not %q", o.logFormat)
	case o.pspLatency < 0:
		return o, errors.New("--psp-latency must not be negative")
	case o.lease < time.Second:
		return o, errors.New("--lease must be at least 1s")
	}
	return o, nil
}

// run starts the service and blocks until ctx is done or SIGINT/SIGTERM
// arrives, then shuts down cleanly: stop accepting, wait for in-flight
// requests (at most --shutdown-timeout), close the database.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return nil
	}
	if err != nil {
		return err
	}
	var h slog.Handler = slog.NewJSONHandler(stderr, nil)
	if o.logFormat == "text" {
		h = slog.NewTextHandler(stderr, nil)
	}
	log := slog.New(h)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	store, err := openStore(ctx, o.databaseURL)
	if err != nil {
		return err
	}
	defer func() {
		if err := store.Close(); err != nil {
			log.Warn("closing the database", "err", err)
		}
		log.Info("database closed")
	}()

	handler, err := newHandler(handlerConfig{
		Store: store, Provider: NewFakeProvider(o.pspLatency), Logger: log, Lease: o.lease,
	})
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", o.addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(h, slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	log.Info("listening", "addr", ln.Addr().String(), "database", describeDatabase(o.databaseURL),
		"psp_latency", o.pspLatency.String(), "lease", o.lease.String())

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	stop() // a second signal kills the process the default way
	log.Info("shutting down", "timeout", o.shutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), o.shutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running lose their connection; their claims stay
		// PROCESSING until the lease runs out and a retry takes them over.
		log.Warn("shutdown timed out; closing connections", "err", err)
		_ = srv.Close()
	}
	return nil
}

// describeDatabase names the database for the log, without credentials.
func describeDatabase(databaseURL string) string {
	kind, target, err := parseDatabaseURL(databaseURL)
	if err != nil {
		return "?"
	}
	if kind == "postgres" {
		if u, err := url.Parse(target); err == nil {
			return u.Redacted()
		}
		return "postgres"
	}
	return "sqlite:" + target
}
