package idemmysql_test

import (
	"testing"

	"github.com/idemgo/idem/idemdriver/idemdrivertest"
)

// BenchmarkDriver runs the shared per-request benchmarks (CONTRACT section
// 10): ClaimComplete (a new key claimed and completed: SELECT, INSERT,
// UPDATE), Replay and InFlight (one SELECT each), and the middleware end to
// end. Set TEST_MYSQL_URL.
func BenchmarkDriver(b *testing.B) { idemdrivertest.Benchmark(b, newDriver) }
