package idempgx_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
)

// A one-commit execution whose process dies mid-transaction (its backend
// terminated, as when the process is killed and its connection drops)
// leaves nothing behind: no record, no lease to wait out; the retry
// claims at once.
func TestOneCommitCrashLeavesNothing(t *testing.T) {
	ctx := context.Background()
	d := openDriver(t, false, nil)
	p := idemdriver.ClaimParams{Scope: "acct", Key: "k", Method: "POST", Path: "/v1/payments",
		Fingerprint: make([]byte, 32), LeaseDuration: time.Minute, Retention: time.Hour}
	res, tx, err := d.ClaimTx(ctx, p, time.Second)
	require.NoError(t, err)
	require.True(t, res.Claimed)
	pid := tx.Native().(pgx.Tx).Conn().PgConn().PID()

	// A duplicate waits on the key's row lock meanwhile.
	dup := make(chan idemdriver.ClaimResult, 1)
	go func() {
		r, dtx, err := d.ClaimTx(ctx, p, 20*time.Second)
		if err == nil && dtx != nil {
			defer dtx.Rollback(ctx)
		}
		if err != nil {
			t.Errorf("duplicate: %v", err)
		}
		dup <- r
	}()
	var killed bool
	require.NoError(t, d.Pool().QueryRow(ctx, `SELECT pg_terminate_backend($1)`, pid).Scan(&killed))
	require.True(t, killed)
	got := <-dup
	require.Error(t, tx.Rollback(ctx), "the owner's connection is gone") // and goes back to the pool, closed
	require.True(t, got.Claimed, "the duplicate claims as soon as the dead owner's transaction is gone")
	require.EqualValues(t, 1, got.Record.Attempts, "a new record: the dead claim left nothing")
}
