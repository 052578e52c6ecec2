package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemclient"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/internal/proctest"
)

// A payment's receipt job exists exactly when its payment commits, with
// real processes killed by SIGKILL on PostgreSQL:
//   - killed before the commit, with the job inserted in the open
//     transaction (the test holds River's INSERT inside it): no job, no
//     payment; the retry, once the dead owner's lease ran out, runs again
//     and commits one of each;
//   - killed after the commit: one job, one payment; the retry gets the
//     replay;
//   - retries and replays, many at once, add no job, nor do concurrent
//     duplicates of a new key;
//   - a worker process then sends one receipt per job and completes them.
//
// The API processes only insert (RECEIPT_WORKERS=0), so no job is left
// running by a kill.
func TestReceiptJobExactlyWhenThePaymentCommits(t *testing.T) {
	t.Parallel()
	url, schema := dbtest.PostgresURL(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	db, err := pgxpool.New(ctx, url)
	require.NoError(t, err)
	t.Cleanup(db.Close)
	count := func(q string, args ...any) (n int) {
		t.Helper()
		require.NoError(t, db.QueryRow(ctx, q, args...).Scan(&n), q)
		return n
	}
	bin := filepath.Join(proctest.Build(t, "."), "river")
	api := func() process { return start(t, bin, url, "RECEIPT_WORKERS=0", "LEASE=1s") }

	p := api()
	client := retryingClient(t)

	// Killed before the commit. An AFTER INSERT trigger on river_job waits
	// for an advisory lock the test holds: River's INSERT has inserted the
	// job in the payment's transaction and waits there, before idem's
	// completion and COMMIT are sent.
	const hold = 3535
	_, err = db.Exec(ctx, fmt.Sprintf(`
		CREATE FUNCTION %[1]s.hold_job() RETURNS trigger LANGUAGE plpgsql AS
			$$ BEGIN PERFORM pg_advisory_xact_lock_shared(%[2]d); RETURN NULL; END $$;
		CREATE TRIGGER hold_job AFTER INSERT ON %[1]s.river_job FOR EACH ROW EXECUTE FUNCTION %[1]s.hold_job()`, schema, hold))
	require.NoError(t, err)
	holder, err := pgx.Connect(ctx, url) // its own connection: closed (the lock released) whatever happens
	require.NoError(t, err)
	t.Cleanup(func() { _ = holder.Close(context.Background()) })
	_, err = holder.Exec(ctx, `SELECT pg_advisory_lock($1)`, hold)
	require.NoError(t, err)
	go func() { _, _ = p.post(context.Background(), "order-1", 1000) }() // the answer never comes
	var backend int
	require.Eventually(t, func() bool {
		return db.QueryRow(ctx, `SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objid = $1 AND NOT granted`, hold).Scan(&backend) == nil
	}, time.Minute, 5*time.Millisecond, "River's insert never came")
	require.Equal(t, 2, count(`
		SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation
		WHERE l.pid = $1 AND l.granted AND l.mode = 'RowExclusiveLock'
		  AND c.relnamespace = (SELECT oid FROM pg_namespace WHERE nspname = $2) AND c.relname IN ('river_job', 'payments')`,
		backend, schema), "River's insert is not in the payment's transaction")
	p.Kill()
	_, err = holder.Exec(ctx, `SELECT pg_advisory_unlock($1)`, hold)
	require.NoError(t, err)
	// The backend of the dead process ends its transaction, rolled back.
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, backend) == 0
	}, time.Minute, 5*time.Millisecond)
	_, err = db.Exec(ctx, `DROP TRIGGER hold_job ON river_job`)
	require.NoError(t, err)
	require.Zero(t, count(`SELECT count(*) FROM river_job`), "killed before the commit: no job")
	require.Zero(t, count(`SELECT count(*) FROM payments`))
	require.Equal(t, "PROCESSING", state(t, db, "order-1"), "claimed, never completed")

	p = api()
	resp := p.send(client, "order-1", 1000)
	require.NoError(t, resp.err)
	require.Equal(t, http.StatusCreated, resp.status, resp.body)
	require.False(t, resp.replayed, "the retry ran the payment, as new: the first attempt left nothing")
	require.Equal(t, 1, count(`SELECT count(*) FROM river_job`))

	// Killed after the commit: the record is SUCCEEDED, so the payment and
	// its job committed with it.
	go func() { _, _ = p.post(context.Background(), "order-2", 2000) }()
	require.Eventually(t, func() bool { return state(t, db, "order-2") == "SUCCEEDED" }, time.Minute, 5*time.Millisecond)
	p.Kill()
	require.Equal(t, 2, count(`SELECT count(*) FROM river_job`), "killed after the commit: its job")

	// Retries and replays, at once, from a new process: no job more. A new
	// key sent many times at once: one job.
	p = api()
	var wg sync.WaitGroup
	results := make(chan answer, 30)
	for i := range 30 {
		wg.Go(func() {
			key, amount := []string{"order-1", "order-2", "order-3"}[i%3], []int64{1000, 2000, 3000}[i%3]
			results <- p.send(client, key, amount)
		})
	}
	wg.Wait()
	close(results)
	ran := map[string]int{}
	for a := range results {
		require.NoError(t, a.err)
		require.Equal(t, http.StatusCreated, a.status, a.body)
		if !a.replayed {
			ran[a.key]++
		}
	}
	require.Equal(t, map[string]int{"order-3": 1}, ran, "only the new key ran, once")
	require.Equal(t, 3, count(`SELECT count(*) FROM river_job`), "one job per payment")
	require.Equal(t, 3, count(`SELECT count(*) FROM payments`))
	require.Equal(t, 3, count(`SELECT count(DISTINCT (args->>'payment_id')::bigint) FROM river_job
		WHERE (args->>'payment_id')::bigint IN (SELECT id FROM payments)`), "each payment's own job")
	require.NoError(t, p.Stop())

	// A worker process sends one receipt per job.
	start(t, bin, url, "RECEIPT_WORKERS=2")
	require.Eventually(t, func() bool {
		return count(`SELECT count(*) FROM river_job WHERE state = 'completed'`) == 3
	}, time.Minute, 10*time.Millisecond, "the receipt jobs were not all worked")
	require.Equal(t, 3, count(`SELECT count(*) FROM receipts r JOIN river_job j ON j.id = r.job_id
		WHERE (j.args->>'payment_id')::bigint = r.payment_id`), "one receipt per payment, from its job")
}

// state is the state of key's record.
func state(t *testing.T, db *pgxpool.Pool, key string) (s string) {
	t.Helper()
	err := db.QueryRow(t.Context(), `SELECT state FROM idem_keys WHERE key = $1`, key).Scan(&s)
	if err != nil {
		return "none: " + err.Error()
	}
	return s
}

// process is one run of the example.
type process struct{ *proctest.Process }

// start runs bin on the database at url on a free port, with env added,
// and waits until it accepts; it is killed when t ends.
func start(t *testing.T, bin, url string, env ...string) process {
	t.Helper()
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), append([]string{"DATABASE_URL=" + url, "ADDR=" + addr}, env...)...)
	return process{proctest.Start(t, cmd, addr)}
}

// post sends one payment with key, once, with a plain client.
func (p process) post(ctx context.Context, key string, amount int64) (*http.Response, error) {
	return http.DefaultClient.Do(p.request(ctx, key, amount))
}

// request is a payment of amount with key.
func (p process) request(ctx context.Context, key string, amount int64) *http.Request {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.Addr+"/v1/payments", // a valid URL: no error
		strings.NewReader(fmt.Sprintf(`{"amount":%d,"currency":"EUR","customer":"cus_42"}`, amount)))
	req.Header.Set(idem.HeaderKey, key)
	return req
}

// retryingClient is a client that retries with the same key, honouring
// Retry-After (idemclient): a 409 while a dead owner's lease runs is
// retried until the key is taken over.
func retryingClient(t *testing.T) *http.Client {
	tr, err := idemclient.New(idemclient.Config{})
	require.NoError(t, err)
	return &http.Client{Transport: tr, Timeout: time.Minute}
}

// answer is what a payment request got.
type answer struct {
	key      string
	status   int
	replayed bool
	body     string
	err      error
}

// send sends one payment with key through client; a transport error is
// in answer.err.
func (p process) send(client *http.Client, key string, amount int64) answer {
	a := answer{key: key}
	resp, err := client.Do(p.request(context.Background(), key, amount))
	if err != nil {
		a.err = err
		return a
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	a.status, a.replayed, a.body, a.err = resp.StatusCode, idemclient.Replayed(resp), string(b), err
	return a
}
