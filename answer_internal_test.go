package idem

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/protocol"
)

// Every kind the protocol answers has its row in the one table: an event,
// and, for every kind answered as a problem (all but a recorded, released
// or replayed answer), the sentinel naming its problem type and a detail.
func TestEveryKindHasARow(t *testing.T) {
	for k := protocol.Kind(1); int(k) < protocol.Kinds; k++ {
		row := kinds[k]
		switch k {
		case protocol.KindRan, protocol.KindReleased, protocol.KindReplay:
			require.NotZero(t, row.event, "kind %d", k)
			continue
		case protocol.KindUnstorable: // a server bug answered 500, not observed
		default:
			require.NotZero(t, row.event, "kind %d: its event", k)
		}
		require.NotNil(t, row.err, "kind %d: its problem type", k)
		require.NotNil(t, row.detail, "kind %d: its detail", k)
		pr := problemOf(protocol.Answer{Kind: k}, &EngineOptions{})
		require.NotEmpty(t, pr.Type, "kind %d", k)
		require.GreaterOrEqual(t, pr.Status, 400, "kind %d", k)
	}
}
