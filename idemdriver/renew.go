package idemdriver

import (
	"context"
	"time"
)

// Renewer is implemented by drivers that renew many leases in one
// statement. The core then renews every lease its executions in flight
// hold with one Renew call per tick (every LeaseDuration/3) instead of one
// Heartbeat each, so a process's renewals cost one statement per tick
// however many executions run, and do not queue one by one behind the new
// claims of a burst for the connections of the pool: a driver whose pool
// can be exhausted by claims and business transactions (idempgx, idemmysql
// from Open) sends them on a connection of its own, outside that pool
// (docs/deployment.md, "Leases under load"). Without it the core falls
// back to Heartbeat, one per execution.
type Renewer interface {
	// Renew extends the lease of each of p.Leases that the caller still
	// owns to the database's now (plus p.ClockOffset) + p.LeaseDuration, as
	// Heartbeat does for one: each row is fenced exactly as Heartbeat is
	// (scope, key, fencing token, created_at, state PROCESSING), and a
	// lease not owned any more (taken over, completed, failed, released,
	// purged, or a record of another life) is left untouched. It returns
	// renewed with one entry per lease, in p.Leases' order: true when that
	// lease was extended, false when its ownership was lost. An error means
	// the store did not answer (nothing is known of any lease; some may
	// have been extended); it wraps ErrBusy when a single-writer database's
	// write lock stayed held by another transaction until ctx ended.
	//
	// A driver may send a long list as several statements, and must accept
	// an empty one (no statement, no error). It takes no session state
	// (behind a transaction pooler each statement may run on another
	// server connection), and no lock beyond the rows it updates.
	Renew(ctx context.Context, p RenewParams) (renewed []bool, err error)
}

// RenewParams name the leases one Renew extends.
type RenewParams struct {
	// Leases are the executions whose leases are renewed: Scope, Key,
	// FencingToken and CreatedAt of each, as their claims returned them.
	// Their LeaseDuration, ClockOffset and Notify are not read: the fields
	// below apply to every lease.
	Leases []FenceParams
	// LeaseDuration is the new lease of each: locked_until = database now
	// + LeaseDuration.
	LeaseDuration time.Duration
	// ClockOffset is added to the database's clock (tests only; zero in
	// production).
	ClockOffset time.Duration
}
