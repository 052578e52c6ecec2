package idemmysql

import (
	"context"
	"io/fs"
	"sync"
	"sync/atomic"
)

// Test hooks, visible to this package's tests only.

// hooks are one Driver's test hooks, kept apart from the Driver (see
// claimHooks): keyed by driver, so that parallel tests count their own
// drivers' claims only.
type hooks struct {
	resolved    [numKinds]atomic.Int64
	beforeWrite atomic.Pointer[func()]
}

var driverHooks sync.Map // *Driver -> *hooks

func hooksOf(d *Driver) *hooks {
	h, _ := driverHooks.LoadOrStore(d, new(hooks))
	return h.(*hooks)
}

func init() {
	claimHooks.resolved = func(d *Driver, k kind) { hooksOf(d).resolved[k].Add(1) }
	claimHooks.beforeWrite = func(d *Driver) {
		if f := hooksOf(d).beforeWrite.Load(); f != nil {
			(*f)()
		}
	}
}

// Resolved returns how many lost races and lock conflicts d's claims have
// resolved by reading again, by kind name (duplicate, deadlock, lock-wait,
// changed, raced).
func Resolved(d *Driver) map[string]int64 {
	m := map[string]int64{}
	h := hooksOf(d)
	for k := kindDuplicate; k < numKinds; k++ {
		m[k.String()] = h.resolved[k].Load()
	}
	return m
}

// SetBeforeWrite makes f run in every claim of d between its read and its
// write; nil removes it.
func SetBeforeWrite(d *Driver, f func()) {
	if f == nil {
		hooksOf(d).beforeWrite.Store(nil)
		return
	}
	hooksOf(d).beforeWrite.Store(&f)
}

// MigrateFS runs the migrations of fsys instead of the embedded ones, in
// idem's version table and under idem's lock.
func MigrateFS(d *Driver, ctx context.Context, fsys fs.FS) error {
	return d.MigrateFS(ctx, fsys, SchemaVersionTable)
}

// Classify exposes the error mapping as kind names.
func Classify(err error) string { return classify(err).String() }

// EmbeddedMigrations are the package's migration files.
func EmbeddedMigrations() fs.FS {
	sub, err := fs.Sub(migrations, "migrations")
	if err != nil {
		panic(err)
	}
	return sub
}

// OpenWrapped is Open with the connector wrapped by wrap.
var OpenWrapped = open

// EmbeddedPresent is the Config.Present of the embedded migrations.
var EmbeddedPresent = embeddedPresent
