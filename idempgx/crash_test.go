package idempgx_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/internal/dbtest"
)

// crashChildEnv names the database URL of the child process that
// TestOneCommitDoKilledMidFn starts and kills (TestMain runs it).
const crashChildEnv = "IDEMPGX_CRASH_CHILD_URL"

func TestMain(m *testing.M) {
	if url := os.Getenv(crashChildEnv); url != "" {
		crashChild(url) // never returns: killed
	}
	os.Exit(m.Run())
}

// crashChild runs one one-commit Do whose fn writes a business row, says
// so on stdout, and waits to be killed.
func crashChild(url string) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		fmt.Println("child:", err)
		os.Exit(2)
	}
	g, err := idem.NewEngineWith(idempgx.New(pool), idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}})
	if err != nil {
		fmt.Println("child:", err)
		os.Exit(2)
	}
	_, err = g.Do(ctx, idem.DoParams{Scope: "acct", Key: "k", Payload: []byte("a")}, func(ctx context.Context) (idem.Result, error) {
		tx, err := idem.Tx[pgx.Tx](ctx)
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('child')`)
		}
		if err != nil {
			return idem.Result{}, err
		}
		fmt.Println("in fn")
		select {} // until killed
	})
	fmt.Println("child:", err)
	os.Exit(2)
}

// A process killed while a one-commit Do's fn runs leaves nothing
// committed: no record (seen from another process while fn runs), no
// lease to wait out, its business write gone; the retry in another process
// runs fn at once and its write is the only one.
func TestOneCommitDoKilledMidFn(t *testing.T) {
	ctx := context.Background()
	url, _ := dbtest.PostgresURL(t)
	pool, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	d := idempgx.New(pool)
	require.NoError(t, d.Migrate(ctx))
	_, err = pool.Exec(ctx, `CREATE TABLE biz (k text NOT NULL)`)
	require.NoError(t, err)

	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), crashChildEnv+"="+url)
	out, err := child.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, child.Start())
	t.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	require.NoError(t, err)
	require.Equal(t, "in fn\n", line)

	_, err = d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "k"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "nothing is committed while fn runs")
	require.NoError(t, child.Process.Kill())
	_ = child.Wait()

	// The row lock goes when PostgreSQL sees the connection closed; the
	// retry waits for it on the row lock, never for a lease.
	g, err := idem.NewEngineWith(d, idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true, Wait: time.Minute}})
	require.NoError(t, err)
	var runs atomic.Int32
	_, err = g.Do(ctx, idem.DoParams{Scope: "acct", Key: "k", Payload: []byte("a")}, func(ctx context.Context) (idem.Result, error) {
		runs.Add(1)
		tx, err := idem.Tx[pgx.Tx](ctx)
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO biz (k) VALUES ('retry')`)
		}
		return idem.Result{Status: 201}, err
	})
	require.False(t, errors.Is(err, idem.ErrInFlight), "no lease holds the key: %v", err)
	require.NoError(t, err)
	require.EqualValues(t, 1, runs.Load())
	var rows []string
	r, err := pool.Query(ctx, `SELECT k FROM biz ORDER BY k`)
	require.NoError(t, err)
	rows, err = pgx.CollectRows(r, pgx.RowTo[string])
	require.NoError(t, err)
	require.Equal(t, []string{"retry"}, rows, "the killed run's write rolled back")
}
