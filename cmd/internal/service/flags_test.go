package service

import (
	"flag"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/dburl"
)

func TestFlagSet(t *testing.T) {
	t.Parallel()
	noMySQL := Schema{Service: "svc", DefaultSQLitePath: "svc.db", Unsupported: map[string]string{dburl.MySQL: "no mysql"}}
	var f Flags
	fs := f.FlagSet(io.Discard, noMySQL, "127.0.0.1:1", "the lease")
	require.Equal(t, "svc", fs.Name())
	require.NoError(t, fs.Parse(nil))
	require.NoError(t, f.Check(fs))
	require.Equal(t, Flags{Addr: "127.0.0.1:1", Lease: 30 * time.Second, ShutdownTimeout: 15 * time.Second, LogFormat: "json", Traces: TracesNone}, f)
	require.NotContains(t, fs.Lookup("database-url").Usage, "mysql://")
	require.Contains(t, (&Flags{}).FlagSet(io.Discard, Schema{}, "", "").Lookup("database-url").Usage, "mysql://")

	for _, bad := range [][]string{{"x"}, {"--log-format", "xml"}, {"--otel-traces", "otlp"}, {"--lease", "999ms"}} {
		var f Flags
		fs := f.FlagSet(io.Discard, noMySQL, "", "")
		require.NoError(t, fs.Parse(bad))
		require.Error(t, f.Check(fs), "%v", bad)
	}
	require.ErrorIs(t, (&Flags{}).FlagSet(io.Discard, noMySQL, "", "").Parse([]string{"-h"}), flag.ErrHelp)

	kind, target, err := noMySQL.ParseURL("")
	require.NoError(t, err)
	require.Equal(t, [2]string{dburl.SQLite, "svc.db"}, [2]string{kind, target})
	_, _, err = noMySQL.ParseURL("mysql://root@h/db")
	require.EqualError(t, err, "no mysql")
}
