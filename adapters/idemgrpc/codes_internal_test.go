package idemgrpc

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

// Each row names the problem idem's HTTP front answers for its error
// (docs/problems.md), so idem-problem-type and ErrorInfo say the same on
// both fronts. A timed-out execution has no problem of its own: HTTP answers
// it store-unavailable, as the row does.
func TestKindsNameIdemProblems(t *testing.T) {
	t.Parallel()
	for _, k := range kinds {
		if k.err == idem.ErrExecutionTimeout {
			require.Equal(t, "store-unavailable", k.problem)
			continue
		}
		require.Equal(t, idem.ProblemTypeBase+k.problem, idem.ProblemFor(k.err, "").Type, "%v", k.err)
	}
}
