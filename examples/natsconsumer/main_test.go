package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

// natsURL is the JetStream server of the test: NATS_URL, else the
// machine's 127.0.0.1:4222. Under CI a missing server fails the test.
func natsConn(t *testing.T) *nats.Conn {
	t.Helper()
	url := env("NATS_URL", nats.DefaultURL)
	nc, err := nats.Connect(url, nats.Timeout(2*time.Second))
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("NATS JetStream at %s: %v (CI needs nats-server -js running)", url, err)
		}
		t.Skipf("NATS JetStream at %s: %v (set CI to fail instead)", url, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// Each message is processed exactly once while the consumer process is
// SIGKILLed mid-message (twice), restarted, messages are redelivered (a
// short AckWait) and published twice: one effect per message id, none
// lost, and the killed executions were taken over.
func TestExactlyOnceUnderKillAndRedelivery(t *testing.T) {
	nc := natsConn(t)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	stream := fmt.Sprintf("IDEMTEST%d", time.Now().UnixNano())
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })

	dir := t.TempDir()
	bin := filepath.Join(dir, "natsconsumer")
	build := exec.Command("go", "build", "-o", bin, ".")
	build.Stderr = os.Stderr
	require.NoError(t, build.Run())
	db := filepath.Join(dir, "consumer.db")
	start := func() *exec.Cmd {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), "STREAM="+stream, "DB="+db, "ACK_WAIT=1s", "WORK=150ms",
			"NATS_URL="+env("NATS_URL", nats.DefaultURL))
		cmd.Stderr = os.Stderr
		require.NoError(t, cmd.Start())
		return cmd
	}
	cmd := start()
	t.Cleanup(func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	})
	// The consumer creates the stream; wait for it.
	require.Eventually(t, func() bool { _, err := js.Stream(ctx, stream); return err == nil }, 20*time.Second, 50*time.Millisecond)

	const n = 40
	for i := range n {
		id := fmt.Sprintf("m-%d", i)
		data := []byte(fmt.Sprintf(`{"id":%q,"amount":%d}`, id, 100+i))
		_, err := js.Publish(ctx, stream+".orders", data, jetstream.WithMsgID(id))
		require.NoError(t, err)
		// A duplicate that JetStream's own deduplication cannot catch (no
		// Nats-Msg-Id): the consumer keys it by the payload's id.
		_, err = js.Publish(ctx, stream+".orders", data)
		require.NoError(t, err)
	}

	store, err := idemsqlite.Open(ctx, db)
	require.NoError(t, err)
	defer store.Close()
	count := func(q string) (c int) {
		if err := store.DB().QueryRowContext(ctx, q).Scan(&c); err != nil {
			return -1 // the consumer has not created its tables yet
		}
		return c
	}
	// Kill it twice, each time while a message is mid-flight: claimed by
	// this process (the record's owner is "<host>/<pid>"), PROCESSING, its
	// work running and its transaction open.
	for kill := range 2 {
		// In its stride: it has completed messages of its own already.
		done := fmt.Sprintf(`SELECT count(*) FROM effects WHERE pid = %d`, cmd.Process.Pid)
		mine := fmt.Sprintf(`SELECT count(*) FROM idem_keys WHERE state = 'PROCESSING' AND owner LIKE '%%/%d'`, cmd.Process.Pid)
		require.Eventually(t, func() bool { return count(done) >= 3 && count(mine) > 0 }, time.Minute, time.Millisecond, "kill %d", kill)
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
		cmd = start()
	}
	require.Eventually(t, func() bool {
		return count(`SELECT count(DISTINCT msg_id) FROM effects`) == n &&
			count(`SELECT count(*) FROM idem_keys WHERE state = 'SUCCEEDED'`) == n
	}, 2*time.Minute, 100*time.Millisecond)
	// Let redeliveries and the duplicates drain: the durable's pending and
	// unacked messages reach zero.
	require.Eventually(t, func() bool {
		c, err := js.Consumer(ctx, stream, "natsconsumer")
		if err != nil {
			return false
		}
		info, err := c.Info(ctx)
		return err == nil && info.NumPending == 0 && info.NumAckPending == 0
	}, time.Minute, 100*time.Millisecond)

	require.Equal(t, n, count(`SELECT count(*) FROM effects`), "exactly one effect per message id")
	require.Zero(t, count(`SELECT count(*) FROM (SELECT msg_id FROM effects GROUP BY msg_id HAVING count(*) > 1)`))
	require.Equal(t, n, count(`SELECT count(*) FROM idem_keys WHERE state = 'SUCCEEDED'`), "none lost")
	require.GreaterOrEqual(t, count(`SELECT sum(attempts - 1) FROM idem_keys`), 2,
		"both messages killed mid-flight were taken over after their lease ran out")
	require.GreaterOrEqual(t, count(`SELECT count(DISTINCT pid) FROM effects`), 2, "effects came from more than one process")
}

// The route of every decision (Event.Route, a metric attribute) is one
// bounded value, the consumer's subject filter, whatever the messages'
// subjects: messages on three subjects (one per customer) give one route.
// Regression (issue 20): the route was the message's subject, one metric
// series per customer.
func TestRouteIsBoundedAcrossSubjects(t *testing.T) {
	natsConn(t) // skips (or fails under CI) without a server
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream := fmt.Sprintf("IDEMROUTE%d", time.Now().UnixNano())
	store := consumerStore(t)

	var (
		mu     sync.Mutex
		routes = map[string]int{}
		events int
	)
	observer := idem.ObserverFunc(func(_ context.Context, e idem.Event) {
		mu.Lock()
		defer mu.Unlock()
		routes[e.Route]++
		events++
	})
	js := startConsumer(t, ctx, stream, "routetest", store, observer)

	subjects := []string{stream + ".orders.cust-1", stream + ".orders.cust-2", stream + ".orders.cust-3"}
	const perSubject = 3
	for _, subject := range subjects {
		for i := range perSubject {
			id := fmt.Sprintf("%s-%d", subject, i)
			_, err := js.Publish(ctx, subject, []byte(fmt.Sprintf(`{"id":%q}`, id)), jetstream.WithMsgID(id))
			require.NoError(t, err)
		}
	}
	n := len(subjects) * perSubject
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return events >= n }, 30*time.Second, 10*time.Millisecond)

	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, map[string]int{stream + ".>": events}, routes, "one route, the subject filter, for every decision")
	var distinct int
	require.NoError(t, store.DB().QueryRowContext(ctx, `SELECT count(DISTINCT subject) FROM effects`).Scan(&distinct))
	require.Equal(t, len(subjects), distinct, "the messages came on %d subjects", len(subjects))
}

// Regression (a fresh user's try): a message whose id is not a valid
// Idempotency-Key as it is (300 characters, or a space) was refused and
// terminated: JetStream had taken it, and it was never processed. Each is
// now processed once, under a key hashed from its id, and so is a message
// with no id at all, under its stream sequence and publish time. A number
// as the payload's id (a third fresh user's reading) names one message.
func TestEveryMessageIsProcessedWhateverItsID(t *testing.T) {
	natsConn(t) // skips (or fails under CI) without a server
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	stream := fmt.Sprintf("IDEMIDS%d", time.Now().UnixNano())
	store := consumerStore(t)
	js := startConsumer(t, ctx, stream, "idstest", store, nil)

	spaced := sha256.Sum256([]byte("has space"))
	// Each its own message, whatever its shape, and whichever id looks like
	// another's key (a second fresh user's try: "seq-2" and "sha256-<hex>"
	// took the keys made up for a message without an id and for "has space").
	ids := []string{"order-ok-1", strings.Repeat("x", 300), "order 2", `"quoted"`,
		"has space", "id#" + hex.EncodeToString(spaced[:]), "sha256-" + hex.EncodeToString(spaced[:]), "x", "id:x",
		"seq-11", "seq-12"} // the stream sequences of the two messages without an id, published next
	for _, id := range ids {
		for range 2 { // a duplicate publish, deduplicated by JetStream or by idem
			_, err := js.Publish(ctx, stream+".orders", []byte(`{"n":1}`), jetstream.WithMsgID(id))
			require.NoError(t, err)
		}
	}
	for i := range 2 { // no id at all: each its own message
		_, err := js.Publish(ctx, stream+".orders", []byte(fmt.Sprintf(`{"n":%d}`, i+2)))
		require.NoError(t, err)
	}
	for range 2 { // a number in the payload's id, published twice: one message
		_, err := js.Publish(ctx, stream+".orders", []byte(`{"id":42}`))
		require.NoError(t, err)
	}
	// Every stored message acked: then count.
	st, err := js.Stream(ctx, stream)
	require.NoError(t, err)
	cons, err := js.Consumer(ctx, stream, "idstest")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		si, err1 := st.Info(ctx)
		ci, err2 := cons.Info(ctx)
		return err1 == nil && err2 == nil && ci.NumAckPending == 0 && ci.AckFloor.Stream == si.State.LastSeq
	}, 30*time.Second, 20*time.Millisecond)
	var n int
	require.NoError(t, store.DB().QueryRowContext(ctx, `SELECT count(*) FROM effects`).Scan(&n))
	require.Equal(t, len(ids)+3, n, "each message once")
}

// consumerStore is a migrated SQLite store with the effects table, in a
// temporary directory of t.
func consumerStore(t *testing.T) *idemsqlite.Driver {
	t.Helper()
	store, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "consumer.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = store.Close() })
	require.NoError(t, store.Migrate(t.Context()))
	_, err = store.DB().ExecContext(t.Context(), schema)
	require.NoError(t, err)
	return store
}

// startConsumer starts the consumer durable of stream (every subject of
// it) on store, with observer, until t ends, and returns JetStream, the
// stream deleted when t ends.
func startConsumer(t *testing.T, ctx context.Context, stream, durable string, store *idemsqlite.Driver, observer idem.Observer) jetstream.JetStream {
	t.Helper()
	c := consumerConfig{natsURL: env("NATS_URL", nats.DefaultURL), stream: stream, subject: stream + ".>",
		durable: durable, ackWait: 5 * time.Second}
	cc, err := start(ctx, c, store, observer, slog.New(slog.NewTextHandler(os.Stderr, nil)))
	require.NoError(t, err)
	t.Cleanup(cc.stop)
	js, err := jetstream.New(natsConn(t))
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })
	return js
}
