package service

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/idemgo/idem/cmd/internal/command"
	"github.com/idemgo/idem/cmd/internal/dburl"
)

// Flags are the command-line flags every service takes (Flags.FlagSet),
// with their defaults once registered.
type Flags struct {
	// Addr is --addr: the host:port to listen on.
	Addr string
	// DatabaseURL is --database-url: "" (the service's default SQLite
	// file) or what ParseDatabaseURL reads.
	DatabaseURL string
	// Lease is --lease: idem's LeaseDuration, at least 1 s; default 30 s.
	Lease time.Duration
	// ShutdownTimeout is --shutdown-timeout: how long Serve waits for
	// in-flight requests on SIGINT/SIGTERM; default 15 s.
	ShutdownTimeout time.Duration
	// LogFormat is --log-format: "json" (the default) or "text".
	LogFormat string
	// Traces is --otel-traces: TracesNone (the default) or TracesStdout.
	Traces string
}

// FlagSet returns the service's flag set, named schema.Service, writing its
// usage and errors to output, with the shared flags added and stored in f:
// --addr (default addr), --database-url (its usage from schema: the kinds
// the service supports and its default SQLite file), --lease (usage
// leaseHelp; default 30 s), --shutdown-timeout (default 15 s), --log-format
// (default json) and --otel-traces (default none). Parse it, then Check f.
func (f *Flags) FlagSet(output io.Writer, schema Schema, addr, leaseHelp string) *flag.FlagSet {
	fs := flag.NewFlagSet(schema.Service, flag.ContinueOnError)
	fs.SetOutput(output)
	fs.StringVar(&f.Addr, "addr", addr, "address to listen on")
	fs.StringVar(&f.DatabaseURL, "database-url", "", schema.databaseURLHelp())
	fs.DurationVar(&f.Lease, "lease", 30*time.Second, leaseHelp)
	fs.DurationVar(&f.ShutdownTimeout, "shutdown-timeout", 15*time.Second, "how long to wait for in-flight requests on SIGINT/SIGTERM")
	fs.StringVar(&f.LogFormat, "log-format", "json", "log format on stderr: json or text")
	fs.StringVar(&f.Traces, "otel-traces", TracesNone, "OpenTelemetry spans of each request and of idem's claim, execute and complete: none, or stdout (one JSON object each on stdout); metrics are served at GET /metrics either way")
	return fs
}

// databaseURLHelp is --database-url's usage: the URL forms of each kind
// of database s supports, and s.DefaultSQLitePath.
func (s Schema) databaseURLHelp() string {
	help := "database: "
	if _, no := s.Unsupported[dburl.Postgres]; !no {
		help += "postgres://... or postgresql://... for PostgreSQL; "
	}
	if _, no := s.Unsupported[dburl.MySQL]; !no {
		help += "mysql://user:password@host:port/dbname for MySQL or MariaDB; "
	}
	return help + "sqlite:PATH, file:PATH or a PATH for SQLite (default: SQLite file " + s.DefaultSQLitePath + " in the working directory)"
}

// Check validates f once fs, from FlagSet, has parsed
// the command line. The error, the first found, names the flag: arguments
// left over, a --log-format other than json or text, an unknown
// --otel-traces, a --lease under 1 s.
func (f *Flags) Check(fs *flag.FlagSet) error {
	switch {
	case fs.NArg() > 0:
		return fmt.Errorf("unexpected arguments: %q", fs.Args())
	case f.LogFormat != "json" && f.LogFormat != "text":
		return fmt.Errorf("--log-format must be json or text, not %q", f.LogFormat)
	case !ValidTraces(f.Traces):
		return fmt.Errorf("--otel-traces must be none or stdout, not %q", f.Traces)
	case f.Lease < time.Second:
		return errors.New("--lease must be at least 1s")
	}
	return nil
}

// Main runs a service's command as main does, through command.Main (a
// context cancelled on SIGINT or SIGTERM, os.Args[1:], os.Stderr). An error
// is printed on stderr as "<name>: <error>" and exits the process with status
// 1; flag.ErrHelp (the usage was asked for and printed) is a success.
func Main(name string, run func(ctx context.Context, args []string, stderr io.Writer) error) {
	command.Main(func(ctx context.Context, args []string, _, stderr io.Writer) int {
		err := run(ctx, args, stderr)
		if err == nil || errors.Is(err, flag.ErrHelp) {
			return 0
		}
		command.Errorf(stderr, "%s: %v", name, err)
		return 1
	})
}
