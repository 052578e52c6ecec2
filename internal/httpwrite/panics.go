package httpwrite

import "context"

type raisePanicsKey struct{}

// RaisePanics marks a request's context as one whose front recovers a
// handler's panic itself, in its framework's way (the adapters: gin, echo,
// connect-go): idem's middleware then raises the panic again once it is
// recorded, instead of answering it 500.
func RaisePanics(ctx context.Context) context.Context {
	return context.WithValue(ctx, raisePanicsKey{}, true)
}

// RaisesPanics reports whether ctx was marked by RaisePanics.
func RaisesPanics(ctx context.Context) bool {
	raise, _ := ctx.Value(raisePanicsKey{}).(bool)
	return raise
}
