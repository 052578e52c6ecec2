//go:build !idemfaults

package main

import (
	"io"
	"testing"

	"github.com/stretchr/testify/require"
)

// Built without the tag idemfaults, paymentsd has no fault injection: its
// flags are unknown, so a production binary cannot be told to crash.
func TestNoFaultFlagsWithoutTheTag(t *testing.T) {
	t.Parallel()
	for _, flag := range []string{"--crash-after-charge", "--crash-before-claim", "--stall-after-charge"} {
		_, err := parseFlags([]string{flag, "1"}, io.Discard, nil)
		require.ErrorContains(t, err, "flag provided but not defined", flag)
	}
}
