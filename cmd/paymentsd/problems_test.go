package main

import (
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/service"
)

// Every problem type the demo answers is documented under its own heading
// of the README its type URI points into (CONTRACT section 8).
func TestEveryProblemKindIsDocumented(t *testing.T) {
	t.Parallel()
	page, err := os.ReadFile("README.md")
	require.NoError(t, err)
	kinds := []string{service.ProblemUnauthorized, service.ProblemInvalidRequest, service.ProblemUnsupportedMedia,
		service.ProblemNotFound, service.ProblemUnavailable, service.ProblemInternal}
	for kind := range svc.ProblemTitles {
		kinds = append(kinds, kind)
	}
	for _, kind := range kinds {
		require.Contains(t, string(page), "\n### "+kind+"\n", "the #%s heading of cmd/paymentsd/README.md", kind)
	}
}
