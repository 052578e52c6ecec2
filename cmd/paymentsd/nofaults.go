//go:build !idemfaults

package main

import (
	"context"
	"flag"
	"log/slog"
	"net/http"

	"github.com/idemgo/idem"
)

// Without the build tag idemfaults, paymentsd carries no fault injection:
// no --crash-* or --stall-after-charge flag, and hooks that do nothing (see
// faults.go, built with -tags idemfaults for the crash and storm proofs).

type faultOptions struct{}

func (*faultOptions) register(*flag.FlagSet)     {}
func (*faultOptions) validate() error            { return nil }
func (*faultOptions) build(*slog.Logger) *faults { return nil }
func (*faultOptions) describe() string           { return "" }

type faults struct{}

func (*faults) store(s idem.Store) idem.Store                         { return s }
func (*faults) wrap(next http.Handler) http.Handler                   { return next }
func (*faults) beforeCharge(context.Context)                          {}
func (*faults) inCharge(context.Context, string)                      {}
func (*faults) afterCharge(context.Context, string)                   {}
func (*faults) stall(context.Context)                                 {}
func (*faults) afterWrite(context.Context, string, string, WriteMode) {}
