package service

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

// Server is a service's HTTP server; Serve runs it.
type Server struct {
	// Addr is the host:port to listen on (port 0: any free port).
	Addr    string
	Handler http.Handler
	// Log receives "listening" and "shutting down" (Info), a shutdown that
	// times out, and net/http's own errors (Warn).
	Log *slog.Logger
	// ShutdownTimeout is how long Serve waits for in-flight requests once
	// ctx is done, before it closes their connections.
	ShutdownTimeout time.Duration
	// Stop, when not nil, is called as soon as ctx is done: give it the stop
	// function of signal.NotifyContext, so that a second SIGINT or SIGTERM
	// during the shutdown kills the process the default way.
	Stop func()
}

// Serve listens on s.Addr, logs "listening" with addr (the address bound)
// followed by attrs (slog's key-value pairs), and serves s.Handler until ctx
// is done. Then it calls s.Stop, logs "shutting down" with its timeout,
// stops accepting, and waits up to s.ShutdownTimeout for in-flight requests;
// past it, it logs "shutdown timed out; closing connections" and closes
// them. Requests are read with a 10 s header timeout and a 1 min timeout,
// idle connections closed after 2 min.
//
// It returns nil after a shutdown, or the error of listening or serving.
func (s Server) Serve(ctx context.Context, attrs ...any) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return err
	}
	srv := &http.Server{
		Handler:           s.Handler,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       time.Minute,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.Log.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	s.Log.Info("listening", append([]any{"addr", ln.Addr().String()}, attrs...)...)

	select {
	case err := <-served:
		return err
	case <-ctx.Done():
	}
	if s.Stop != nil {
		s.Stop()
	}
	s.Log.Info("shutting down", "timeout", s.ShutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), s.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		// Requests still running lose their connection; their claims stay
		// PROCESSING until the lease runs out and a retry takes them over.
		s.Log.Warn("shutdown timed out; closing connections", "err", err)
		_ = srv.Close()
	}
	return nil
}

// CloseDatabase closes db at the end of a service's run, and logs it: Warn
// "closing the database" with the error if Close fails, then Info
// "database closed" in any case.
func CloseDatabase(log *slog.Logger, db io.Closer) {
	if err := db.Close(); err != nil {
		log.Warn("closing the database", "err", err)
	}
	log.Info("database closed")
}

// Process is a service's run once its flags are parsed (Run).
type Process[S io.Closer] struct {
	// Flags are the service's shared flags: LogFormat (NewLogger, on
	// stderr), Addr and ShutdownTimeout (Server), Traces (NewTelemetry).
	Flags Flags
	// Name is the service's name in its telemetry (NewTelemetry).
	Name string
	// Open opens and migrates the service's store.
	Open func(ctx context.Context) (S, error)
	// Serve builds the handler on the open store; tel's Observer and Metrics
	// are for the handler, which Run wraps in tel.Handler.
	Serve func(ctx context.Context, log *slog.Logger, store S, tel *Telemetry) (Served, error)
}

// Served is what Process.Serve returns.
type Served struct {
	Handler http.Handler
	// Attrs follow "addr" in the "listening" line (slog's key-value pairs),
	// after "database" when the store has a Describe method (DB.Describe).
	Attrs []any
	// Close, when not nil, runs after the shutdown, before the store is
	// closed; its error is logged (Warn "closing the handler's resources").
	Close func() error
}

// Run runs p until ctx is done or SIGINT/SIGTERM arrives: it opens the
// store, starts the telemetry (NewTelemetry, traces to stdout), builds the
// handler and serves it (Server.Serve), then shuts down cleanly: stop
// accepting, wait for in-flight requests (at most p.Flags.ShutdownTimeout), run
// Served.Close, shut the telemetry down, close the store (CloseDatabase). It
// returns the first error of opening, building or serving.
func Run[S io.Closer](ctx context.Context, stderr io.Writer, p Process[S]) error {
	log := NewLogger(stderr, p.Flags.LogFormat)

	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	store, err := p.Open(ctx)
	if err != nil {
		return err
	}
	defer CloseDatabase(log, store)
	tel, err := NewTelemetry(p.Name, p.Flags.Traces, os.Stdout)
	if err != nil {
		return err
	}
	defer ShutdownTelemetry(log, tel)
	served, err := p.Serve(ctx, log, store, tel)
	if err != nil {
		return err
	}
	if served.Close != nil {
		defer func() {
			if err := served.Close(); err != nil {
				log.Warn("closing the handler's resources", "err", err)
			}
		}()
	}
	attrs := served.Attrs
	if d, ok := any(store).(interface{ Describe() string }); ok {
		attrs = append([]any{"database", d.Describe()}, attrs...)
	}
	srv := Server{Addr: p.Flags.Addr, Handler: tel.Handler(served.Handler), Log: log, ShutdownTimeout: p.Flags.ShutdownTimeout, Stop: stop}
	return srv.Serve(ctx, attrs...)
}
