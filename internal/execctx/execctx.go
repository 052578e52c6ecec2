// Package execctx carries idem's execution in a handler's context, between
// the core (which puts it there) and package idemdriver (whose
// TxFromContext reads it for the drivers' Tx functions). It is the
// core-only wiring of the seam, kept out of idemdriver's exported API: no
// driver or application sets it.
package execctx

import "context"

type key struct{}

// With returns ctx carrying the execution e.
func With(ctx context.Context, e any) context.Context { return context.WithValue(ctx, key{}, e) }

// From returns the execution ctx carries, or nil.
func From(ctx context.Context) any { return ctx.Value(key{}) }
