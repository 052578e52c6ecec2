package idemdriver

import (
	"context"
	"errors"
	"time"
)

// ErrLockWait is wrapped by the error TxClaimer.ClaimTx returns when the
// key's row (or, on a single-writer database, the write lock) stayed held by
// another transaction for the whole wait bound: most often another
// one-commit execution of the same key, still running its handler. Nothing
// was written. The core answers 409 request-in-flight (CONTRACT section 3).
var ErrLockWait = errors.New("idemdriver: the key's record stayed locked by another transaction past the wait bound")

// TxClaimer is implemented by drivers that can run the claim inside the
// business transaction: the one-commit mode (idem.Options.Engine.OneCommit.Enabled,
// docs/contract.md "Modes", CONTRACT section 10). The claim, the handler's
// writes and the completion then commit together, in one COMMIT; nothing of
// the claim is visible to anyone before it, so a crash or a rollback leaves
// no record and no lease behind, and the next request with the key runs at
// once.
//
// A request of the same key that arrives meanwhile waits on the key's row
// lock (the uncommitted claim holds it) for at most wait, then gets
// ErrLockWait; when the owner commits first, its claim sees the committed
// record (a replay, or 422 for another payload); when the owner rolls back,
// it claims.
type TxClaimer interface {
	// ClaimTx begins a transaction and runs Claim's decision in it (the
	// rows of Driver.Claim and Decide), waiting at most wait for a row lock
	// another transaction holds on the key. A single-writer database
	// (SingleWriter) waits for its write lock as every transaction does
	// instead, and never returns ErrLockWait.
	//
	// When the result is Claimed, tx is open: the record is PROCESSING in
	// it, uncommitted, and the caller writes in tx, completes with
	// tx.Complete and commits, or rolls tx back, which restores the record
	// as it was before the claim (none for a new key). When the result is
	// not Claimed, tx is nil (the driver has ended it) and Record is the
	// committed record the claim lost to. ErrUnstorable and ErrLockWait are
	// wrapped as named; any other error means the store could not answer.
	ClaimTx(ctx context.Context, p ClaimParams, wait time.Duration) (res ClaimResult, tx Tx, err error)
}
