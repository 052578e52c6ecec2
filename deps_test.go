package idem_test

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The library packages (the core, the seam, the drivers, the client) import
// no OpenTelemetry or Prometheus package: those are for idemotel (its own
// module) and the commands.
func TestLibraryImportsNoTelemetry(t *testing.T) {
	t.Parallel()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("go list needs the go command: %v", err)
	}
	cmd := exec.Command(goBin, "list", "-deps", "-f", "{{.ImportPath}}",
		".", "./idemdriver/...", "./idemsqlite/...", "./idempgx/...", "./idemmysql/...", "./idemclient/...")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	deps := strings.Fields(string(out))
	require.Contains(t, deps, "github.com/idemgo/idem/idemdriver", "go list listed the library's dependencies")
	for _, d := range deps {
		for _, banned := range []string{"go.opentelemetry.io/", "github.com/prometheus/", "github.com/idemgo/idem/idemotel"} {
			require.False(t, strings.HasPrefix(d, banned), "a library package depends on %s", d)
		}
	}
}
