package httpwrite

import "context"

type raisePanicsKey struct{}

// Raised is where idem's middleware leaves the stack of a handler's panic
// it raises again under RaisePanics (runtime/debug.Stack of the goroutine
// that panicked), for the front's log: the stack at its recover is the
// raise's, not the handler's. Nil until then.
type Raised struct{ Stack []byte }

// RaisePanics marks a request's context as one whose front recovers a
// handler's panic itself, in its framework's way (the adapters: gin, echo,
// connect-go): idem's middleware then raises the panic again once it is
// recorded, instead of answering it 500, and leaves its stack in the
// returned Raised.
func RaisePanics(ctx context.Context) (context.Context, *Raised) {
	r := &Raised{}
	return context.WithValue(ctx, raisePanicsKey{}, r), r
}

// RaisedOf is the Raised of a context marked by RaisePanics, nil for
// another.
func RaisedOf(ctx context.Context) *Raised {
	r, _ := ctx.Value(raisePanicsKey{}).(*Raised)
	return r
}

// StackOr is r's stack, or fallback's when r holds none.
func (r *Raised) StackOr(fallback func() []byte) []byte {
	if r != nil && r.Stack != nil {
		return r.Stack
	}
	return fallback()
}
