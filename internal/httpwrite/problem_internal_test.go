package httpwrite

import (
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// A problem's body is kept for the next one only when it is short: a
// client chooses the path a detail may quote.
func TestLongProblemBodiesAreNotKept(t *testing.T) {
	require.Less(t, problemBodiesKept.Load(), int64(maxProblemBodies-2), "the package's tests filled problemBodies: this test measures nothing")
	long := Problem{Status: 422, Title: "t", Type: "about:blank", Detail: strings.Repeat("p", 2*maxProblemBodyBytes)}
	short := Problem{Status: 422, Title: "t", Type: "about:blank", Detail: "TestLongProblemBodiesAreNotKept"}
	for _, p := range []Problem{long, short} {
		rec := httptest.NewRecorder()
		p.Write(rec)
		require.Contains(t, rec.Body.String(), p.Detail)
	}
	_, kept := problemBodies.Load(problemMembers{long.Detail, long.Instance, long.keySafeMember(), long.Status, long.Title, long.Type})
	require.False(t, kept, "a body over maxProblemBodyBytes was kept")
	_, kept = problemBodies.Load(problemMembers{short.Detail, short.Instance, short.keySafeMember(), short.Status, short.Title, short.Type})
	require.True(t, kept, "a short body was not kept")
}
