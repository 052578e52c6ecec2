package idemdriver

import "context"

// Notifier is implemented by drivers whose database can tell every process
// that an execution ended (PostgreSQL: NOTIFY, sent in the writing
// transaction so that it is delivered at its commit, and LISTEN). The core's
// wait mode (idem.EngineOptions.Waiting.Wait) uses it to wake the duplicates that
// wait for a key in other processes; without it they poll.
type Notifier interface {
	// Notifies reports whether notifications can reach this process: false,
	// for instance, for PostgreSQL behind a transaction pooler, where LISTEN
	// holds on no server connection of its own. When false, the driver still
	// honours FenceParams.Notify (other processes may listen) or ignores it.
	Notifies() bool
	// Listen delivers the payload (FenceParams.Notify) of every notification
	// to deliver, one at a time, until ctx ends; then it returns ctx's error.
	// It calls listening(true) each time it starts listening, after a
	// reconnection too (notifications sent before may have been missed),
	// and listening(false) when its connection is lost. It holds one
	// connection of its own, outside any pool the driver's other methods
	// use, and reconnects after an error.
	Listen(ctx context.Context, listening func(bool), deliver func(payload string)) error
}

// WaitMarker is implemented by Notifiers whose completions can notify only
// when someone waits (FenceParams.NotifyMarked): a waiter marks the record
// it waits for, and an end of the execution (Complete, Fail, Release, in a
// Tx too) that takes effect after the mark notifies.
type WaitMarker interface {
	// MarkWaited marks the record p names (Scope, Key, FencingToken,
	// CreatedAt), still PROCESSING, as waited for, without ever waiting for
	// a lock. It reports true when the record is marked, by this call or an
	// earlier one, so that its end notifies; false when the record has
	// moved on (ended, or taken over under another token) or its row is
	// locked by a write in progress (its owner's end, a heartbeat): then a
	// notification may not come, and the waiter reads the record again and
	// polls. p's ClockOffset, LeaseDuration and Notify are not used.
	MarkWaited(ctx context.Context, p FenceParams) (bool, error)
}
