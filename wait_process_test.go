package idem_test

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// The wait mode across two processes: this test binary serves one
// Middleware and starts itself again as a second (TestMain runs it when
// waitChildEnv is set), both on one database through a pool of
// waitPoolSize connections.

const (
	waitChildEnv = "IDEM_WAIT_CHILD" // "<kind> <url>": run as the second process
	waitPoolSize = 4
)

func TestMain(m *testing.M) {
	if spec := os.Getenv(waitChildEnv); spec != "" {
		os.Exit(runWaitChild(spec))
	}
	os.Exit(m.Run())
}

// waitNode is one process's server: a Middleware with a server default
// wait on a pool of waitPoolSize; its handler counts runs and holds the
// request whose key is held until release is closed.
type waitNode struct {
	mw      *idem.Middleware
	runs    atomic.Int64
	inUse   func() int // pool connections in use
	close   func()
	held    string
	started chan struct{}
	release chan struct{}
}

func openWaitNode(kind, url string) (*waitNode, error) {
	ctx := context.Background()
	n := &waitNode{}
	var store idem.Store
	switch kind {
	case "postgres":
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = waitPoolSize
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return nil, err
		}
		store, n.close = idempgx.New(pool), pool.Close
		n.inUse = func() int { return int(pool.Stat().AcquiredConns()) }
	case "mysql", "sqlite":
		var db interface {
			idem.Store
			DB() *sql.DB
			Close() error
		}
		var err error
		if kind == "mysql" {
			db, err = idemmysql.Open(ctx, url)
		} else {
			db, err = idemsqlite.Open(ctx, url)
		}
		if err != nil {
			return nil, err
		}
		db.DB().SetMaxOpenConns(waitPoolSize)
		store, n.close = db, func() { _ = db.Close() }
		n.inUse = func() int { return db.DB().Stats().InUse }
	default:
		return nil, fmt.Errorf("kind %q", kind)
	}
	if err := store.Migrate(ctx); err != nil {
		n.close()
		return nil, err
	}
	mw, err := idem.NewMiddleware(store, idem.Options{
		Engine: idem.EngineOptions{Waiting: idem.WaitOptions{Wait: 30 * time.Second}, Logger: slog.New(slog.DiscardHandler)},
		Scope:  idem.SingleTenant,
	})
	if err != nil {
		n.close()
		return nil, err
	}
	n.mw = mw
	closeStore := n.close
	n.close = func() { _ = mw.Engine().Close(); closeStore() }
	return n, nil
}

func (n *waitNode) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n.runs.Add(1)
	if key := r.Header.Get(idem.HeaderKey); key == n.held {
		close(n.started)
		<-n.release
	}
	w.Header().Set("Content-Type", "text/plain")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, "paid "+r.Header.Get(idem.HeaderKey))
}

// waitStats is what the second process reports at GET /stats.
type waitStats struct{ Waiters, Runs, InUse int }

func (n *waitNode) stats() waitStats {
	return waitStats{Waiters: n.mw.Engine().Waiters(), Runs: int(n.runs.Load()), InUse: n.inUse()}
}

func (n *waitNode) handler() http.Handler {
	mux := http.NewServeMux()
	mux.Handle("POST /pay", n.mw.Handler(n))
	mux.HandleFunc("GET /stats", func(w http.ResponseWriter, _ *http.Request) {
		_ = json.NewEncoder(w).Encode(n.stats())
	})
	return mux
}

// runWaitChild serves a waitNode until its stdin closes; its first line of
// output is its address.
func runWaitChild(spec string) int {
	kind, url, _ := strings.Cut(spec, " ")
	n, err := openWaitNode(kind, url)
	if err != nil {
		fmt.Fprintln(os.Stderr, "wait child:", err)
		return 1
	}
	defer n.close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, "wait child:", err)
		return 1
	}
	go func() { _ = http.Serve(ln, n.handler()) }()
	fmt.Println(ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return 0
}

// waitPair is the two processes of kind: this one's server and the
// second's address.
type waitPair struct {
	local  *waitNode
	urls   [2]string
	client *http.Client
}

func startWaitPair(t testing.TB, kind string) *waitPair {
	t.Helper()
	var url string
	switch kind {
	case "postgres":
		url, _ = dbtest.PostgresURL(t)
	case "mysql":
		url, _ = dbtest.MySQLURL(t)
	case "sqlite":
		url = dbtest.SQLitePath(t)
	}
	local, err := openWaitNode(kind, url)
	require.NoError(t, err)
	t.Cleanup(local.close)
	srv := httptest.NewServer(local.handler())
	t.Cleanup(srv.Close)

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), waitChildEnv+"="+kind+" "+url)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	})
	addr, err := bufio.NewReader(stdout).ReadString('\n')
	require.NoError(t, err, "the second process's address")
	tr := &http.Transport{MaxIdleConnsPerHost: 1000}
	t.Cleanup(tr.CloseIdleConnections)
	return &waitPair{local: local, urls: [2]string{srv.URL, "http://" + strings.TrimSpace(addr)}, client: &http.Client{Transport: tr}}
}

func (p *waitPair) post(url, key string) (*http.Response, string, error) {
	req, err := http.NewRequest(http.MethodPost, url+"/pay", strings.NewReader(`{"amount":100}`))
	if err != nil {
		return nil, "", err
	}
	req.Header.Set(idem.HeaderKey, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	return resp, string(body), err
}

func (p *waitPair) remote(t testing.TB) waitStats {
	t.Helper()
	resp, err := p.client.Get(p.urls[1] + "/stats")
	require.NoError(t, err)
	defer func() { _ = resp.Body.Close() }()
	var s waitStats
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&s))
	return s
}

// storm holds key's first execution in this process while perProcess
// duplicates wait in each process, checks that no connection is held for
// them and that another key's request is served meanwhile, then lets the
// owner commit and returns every duplicate's delay from the release to its
// answer, each a replay of the owner's.
func (p *waitPair) storm(t testing.TB, key string, perProcess int) []time.Duration {
	t.Helper()
	n := p.local
	n.held, n.started, n.release = key, make(chan struct{}), make(chan struct{})
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(n.release) }) }
	defer release() // a failed check must not leave the owner held
	before := [2]int{int(n.runs.Load()), p.remote(t).Runs}
	owner := make(chan error, 1)
	go func() {
		resp, _, err := p.post(p.urls[0], key)
		if err == nil && resp.StatusCode != http.StatusCreated {
			err = fmt.Errorf("the owner got %d", resp.StatusCode)
		}
		owner <- err
	}()
	<-n.started
	var released atomic.Int64
	delays := make(chan time.Duration, 2*perProcess)
	errs := make(chan error, 2*perProcess)
	var wg sync.WaitGroup
	for _, url := range p.urls {
		for range perProcess {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, body, err := p.post(url, key)
				delays <- time.Since(time.Unix(0, released.Load()))
				switch {
				case err != nil:
				case resp.StatusCode != http.StatusCreated || resp.Header.Get(idem.HeaderReplayed) != "true" || body != "paid "+key:
					err = fmt.Errorf("a duplicate got %d, %s %q, %q", resp.StatusCode, idem.HeaderReplayed, resp.Header.Get(idem.HeaderReplayed), body)
				}
				errs <- err
			}()
		}
	}
	deadline := time.Now().Add(time.Minute)
	for n.mw.Engine().Waiters() < perProcess || p.remote(t).Waiters < perProcess {
		require.True(t, time.Now().Before(deadline), "the duplicates wait: %d here, %d there", n.mw.Engine().Waiters(), p.remote(t).Waiters)
		time.Sleep(time.Millisecond) // a poll of the state, not a wait for it
	}
	// Polling, the waiters of a key in a process share one read at a time;
	// the owner's lease renewal may hold one too.
	require.LessOrEqual(t, p.remote(t).InUse, 1, "the 250 waiters of the second process hold no connection but their one shared read")
	require.LessOrEqual(t, n.inUse(), 2, "the 250 waiters of this process hold no connection but their one shared read")
	for i, url := range p.urls {
		resp, body, err := p.post(url, fmt.Sprintf("%s-other-%d", key, i))
		require.NoError(t, err)
		require.Equal(t, http.StatusCreated, resp.StatusCode, "another key is served while the duplicates wait: %s", body)
	}
	released.Store(time.Now().UnixNano())
	release()
	require.NoError(t, <-owner)
	wg.Wait()
	close(errs)
	close(delays)
	for err := range errs {
		require.NoError(t, err)
	}
	require.EqualValues(t, before[0]+2, n.runs.Load(), "this process ran the owner and one other key")
	require.Equal(t, before[1]+1, p.remote(t).Runs, "the second process ran its other key only")
	out := slices.Collect(func(yield func(time.Duration) bool) {
		for d := range delays {
			if !yield(d) {
				return
			}
		}
	})
	slices.Sort(out)
	return out
}

func percentile(sorted []time.Duration, q float64) time.Duration {
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

var waitKinds = []string{"postgres", "mysql", "sqlite"}

// 500 duplicates over two processes on a pool of 4 connections each wait
// for the owner, holding no connection, and all get its replay.
func TestWaitAcrossProcesses(t *testing.T) {
	for _, kind := range waitKinds {
		t.Run(kind, func(t *testing.T) {
			p := startWaitPair(t, kind)
			d := p.storm(t, "pay-1", 250)
			t.Logf("%s: %d duplicates answered after the owner's release in p50 %s, p99 %s, max %s",
				kind, len(d), percentile(d, 0.5), percentile(d, 0.99), d[len(d)-1])
		})
	}
}

// BenchmarkWaitAcrossProcesses measures the delay from the owner's release
// (its handler returns; the commit follows) to the answer of each of 500
// duplicates waiting over two processes (docs/benchmarks.md).
func BenchmarkWaitAcrossProcesses(b *testing.B) {
	for _, kind := range waitKinds {
		b.Run(kind, func(b *testing.B) {
			p := startWaitPair(b, kind)
			var all []time.Duration
			for i := 0; b.Loop(); i++ {
				all = append(all, p.storm(b, fmt.Sprintf("pay-%d", i), 250)...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(percentile(all, 0.5).Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(percentile(all, 0.99).Microseconds())/1000, "p99-ms")
			b.ReportMetric(float64(all[len(all)-1].Microseconds())/1000, "max-ms")
		})
	}
}
