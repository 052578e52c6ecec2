package idemdriver_test

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

func TestDecisionNames(t *testing.T) {
	t.Parallel()
	claims := map[idemdriver.Decision]bool{}
	for d, name := range map[idemdriver.Decision]string{
		idemdriver.DecisionNew: "new", idemdriver.DecisionReplay: "replay", idemdriver.DecisionInFlight: "in-flight",
		idemdriver.DecisionKeyReused: "key-reused", idemdriver.DecisionTakeOver: "take-over",
		idemdriver.DecisionReclaim: "reclaim", idemdriver.DecisionNewLife: "new-life",
	} {
		require.Equal(t, name, d.String())
		claims[d] = d.Claims()
		if d.Continues() {
			require.True(t, d.Claims(), "%s continues a life, so it claims", d)
		}
	}
	require.Equal(t, map[idemdriver.Decision]bool{
		idemdriver.DecisionNew: true, idemdriver.DecisionReplay: false, idemdriver.DecisionInFlight: false,
		idemdriver.DecisionKeyReused: false, idemdriver.DecisionTakeOver: true,
		idemdriver.DecisionReclaim: true, idemdriver.DecisionNewLife: true,
	}, claims)
	require.Equal(t, "Decision(0)", idemdriver.Decision(0).String())
	require.Equal(t, idemdriver.DecisionNew, idemdriver.Decide(nil, true, idemdriver.ClaimParams{}))
}
