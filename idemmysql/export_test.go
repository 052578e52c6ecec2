package idemmysql

import (
	"context"
	"io/fs"
)

// Test hooks, visible to this package's tests only.

// Resolved returns how many lost races and lock conflicts d's claims have
// resolved by reading again, by kind name (duplicate, deadlock, lock-wait,
// changed, raced).
func Resolved(d *Driver) map[string]int64 {
	m := map[string]int64{}
	for k := kindDuplicate; k < numKinds; k++ {
		m[k.String()] = d.resolved[k].Load()
	}
	return m
}

// SetBeforeWrite makes f run in every claim between its read and its write.
func SetBeforeWrite(d *Driver, f func()) { d.beforeWrite = f }

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
