package idemdriver_test

import (
	"testing"
	"time"

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
		idemdriver.DecisionDamaged: "damaged", idemdriver.DecisionUnknown: "unknown",
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
		idemdriver.DecisionReclaim: true, idemdriver.DecisionNewLife: true, idemdriver.DecisionDamaged: false,
		idemdriver.DecisionUnknown: false,
	}, claims)
	require.Equal(t, "Decision(0)", idemdriver.Decision(0).String())
	require.Equal(t, idemdriver.DecisionNew, idemdriver.Decide(nil, true, idemdriver.ClaimParams{}))
}

// A PROCESSING record without a lease bound is damaged for every request,
// expired or not, before any other row of the table; no other record is.
func TestDecideDamaged(t *testing.T) {
	t.Parallel()
	p := idemdriver.ClaimParams{Method: "POST", Path: "/p", Fingerprint: []byte("fp")}
	lockedUntil := time.Now()
	for _, tc := range []struct {
		state  idemdriver.State
		locked *time.Time
		left   time.Duration
		want   bool
	}{
		{idemdriver.StateProcessing, nil, 0, true},
		{idemdriver.StateProcessing, nil, time.Minute, true}, // a driver's lease left cannot save it
		{idemdriver.StateProcessing, &lockedUntil, 0, false},
		{idemdriver.StateSucceeded, nil, 0, false},
		{idemdriver.StateFailed, nil, 0, false},
	} {
		for _, expired := range []bool{false, true} {
			for _, fp := range [][]byte{p.Fingerprint, []byte("other")} {
				rec := idemdriver.Record{Method: p.Method, Path: p.Path, Fingerprint: fp, State: tc.state, LockedUntil: tc.locked, LeaseLeft: tc.left}
				require.Equal(t, tc.want, rec.Damaged(), "%s locked %v", tc.state, tc.locked)
				d := idemdriver.Decide(&rec, expired, p)
				require.Equal(t, tc.want, d == idemdriver.DecisionDamaged, "%s locked %v expired %v: %s", tc.state, tc.locked, expired, d)
			}
		}
	}
}

// An UNKNOWN record is never claimed, expired or not (CONTRACT section
// 11.3): the same request is DecisionUnknown, another DecisionKeyReused.
func TestDecideUnknown(t *testing.T) {
	t.Parallel()
	p := idemdriver.ClaimParams{Method: "POST", Path: "/p", Fingerprint: []byte("fp")}
	for _, expired := range []bool{false, true} {
		rec := idemdriver.Record{Method: p.Method, Path: p.Path, Fingerprint: p.Fingerprint, State: idemdriver.StateUnknown}
		require.Equal(t, idemdriver.DecisionUnknown, idemdriver.Decide(&rec, expired, p), "expired %v", expired)
		for _, other := range []idemdriver.ClaimParams{
			{Method: "PUT", Path: p.Path, Fingerprint: p.Fingerprint},
			{Method: p.Method, Path: "/q", Fingerprint: p.Fingerprint},
			{Method: p.Method, Path: p.Path, Fingerprint: []byte("other")},
		} {
			require.Equal(t, idemdriver.DecisionKeyReused, idemdriver.Decide(&rec, expired, other), "expired %v", expired)
		}
	}
}
