package idem

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/httpwrite"
)

// Every problem type idem answers is documented under its own heading of
// docs/problems.md, the page its type URI points into (CONTRACT section 8).
func TestEveryProblemKindIsDocumented(t *testing.T) {
	page, err := os.ReadFile("docs/problems.md")
	require.NoError(t, err)
	for _, k := range problemKinds {
		require.True(t, strings.HasPrefix(ProblemTypeBase, "https://github.com/idemgo/idem/blob/main/docs/problems.md#"))
		require.Equal(t, ProblemTypeBase, httpwrite.TypeBase, "httpwrite tells idem's problems by it (new_key_safe)")
		require.Contains(t, string(page), "\n## "+k.slug+"\n", "%v: the #%s heading of docs/problems.md", k.err, k.slug)
		// The table's row ends with the kind's new_key_safe (key-reused's
		// says when it is false: the same method and path).
		require.Regexp(t, `\n\| \[`+k.slug+`\]\(#`+k.slug+`\) \| `+strconv.Itoa(k.status)+` \| [^\n]* \| `+strconv.FormatBool(k.newKeySafe)+`[^|\n]* \|\n`,
			string(page), "%v: its row in docs/problems.md's table", k.err)
	}
}
