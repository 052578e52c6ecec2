package idemdriver

import "errors"

// The errors of the seam, which drivers return (or wrap) and the core
// branches on with errors.Is.
var (
	// The claim protocol (Driver).

	// ErrNotFound is returned by Driver.Get when no record exists for (scope, key).
	ErrNotFound = errors.New("idemdriver: record not found")

	// ErrUnstorable is wrapped by the error a driver returns for a scope, key,
	// path or owner that its database cannot store or compare: a NUL byte or
	// invalid UTF-8 in a PostgreSQL text column (SQLSTATE 22021 or 22P05), or a
	// value longer than its column (idemmysql.ErrTooLong wraps it too). Nothing
	// was written. It is a server fault, not an outage: running the same request
	// again meets the same refusal, so the core answers 500 once instead of the
	// 503 that invites retries. Drivers whose columns hold any
	// bytes (MySQL's VARBINARY, SQLite's TEXT) store such values as sent and
	// never return it for them.
	ErrUnstorable = errors.New("idemdriver: the database cannot store this scope, key, path or owner")

	// ErrBusy is wrapped by the error of a write that waited for a
	// single-writer database's write lock (SingleWriter: SQLite) until its
	// context ended, because another transaction held it: the write was queued,
	// not refused, and the database is healthy. While that lock is held no claim
	// can take any key over either (a takeover is a write), so the core does not
	// count a Heartbeat that fails with ErrBusy against the lease.
	ErrBusy = errors.New("idemdriver: the database's write lock is held by another transaction")

	// ErrLockWait is wrapped by the error TxClaimer.ClaimTx returns when the
	// key's row (or, on a single-writer database, the write lock) stayed held by
	// another transaction for the whole wait bound: most often another
	// one-commit execution of the same key, still running its handler. Nothing
	// was written. The core answers 409 request-in-flight (CONTRACT section 3).
	ErrLockWait = errors.New("idemdriver: the key's record stayed locked by another transaction past the wait bound")

	// The claim's business transaction (Tx, TxFromContext, NativeTx).

	// ErrNoExecution is returned by TxFromContext and NativeTx when the context
	// does not belong to a handler that idem is running under a claim.
	ErrNoExecution = errors.New("idem: no idempotent execution in this context (is the handler behind idem's middleware, with an Idempotency-Key?)")

	// ErrTxDone is wrapped by Tx.Complete when the handler committed or rolled
	// back the claim's transaction itself: the completion could not ride in it.
	ErrTxDone = errors.New("idem: the claim's transaction was already committed or rolled back by the handler")

	// ErrTxAborted is wrapped by Tx.Complete when the claim's transaction had
	// aborted before the completion (PostgreSQL: a statement of the handler
	// failed, SQLSTATE 25P02 "current transaction is aborted"): nothing more can
	// be written in it and its business writes are gone. The core then rolls it
	// back and records the handler's answer on its own; a 2xx answer is a
	// handler bug, recorded FAILED (CONTRACT section 6).
	ErrTxAborted = errors.New("idem: the claim's transaction had aborted before its completion")

	// Retention and operations (MaintenanceLocker, Partitioner).

	// ErrLockHeld is returned by MaintenanceLocker.TryLockMaintenance when
	// another process (or another lock value in this one) holds the
	// maintenance lock.
	ErrLockHeld = errors.New("idemdriver: the maintenance lock is held by another process")

	// ErrLockLost is returned by MaintenanceLock methods once the lock is no
	// longer held: its lease ran out and another process took it, or it was
	// released. The holder must stop maintaining and try to lock again.
	ErrLockLost = errors.New("idemdriver: the maintenance lock was lost")

	// ErrNotPartitioned is returned by the Partitioner methods of a store whose
	// idem_keys table is not partitioned.
	ErrNotPartitioned = errors.New("idemdriver: idem_keys is not partitioned")
)
