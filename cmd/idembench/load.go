package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
)

// keyKind says which Idempotency-Key a variant's requests carry.
type keyKind int

const (
	keyFresh    keyKind = iota // a new key per request (first executions)
	keyReplay                  // one of the keys completed in setup (replay, 422)
	keyHeld                    // the key held PROCESSING by the hold route (409)
	keyNaive                   // one of the keys cached by the naive cache in setup
	keyCached                  // one of the keys completed in setup on the replay-cache route
	keyFloor                   // one of the keys completed in setup by the floor (its fingerprint the floor's hash)
	keyContract                // one of the keys completed in setup by the contract floor (its fingerprint idem's)
)

// variant is one way of serving the request, measured in every cell.
type variant struct {
	id       string // short name (--variants, file names)
	label    string // the row of the report
	route    string
	body     []byte
	key      keyKind
	want     int  // the status every response must have
	replayed bool // the response must carry Idempotent-Replayed: true
	redis    bool // needs the naive cache
}

// Variant ids.
const (
	vBare      = "bare"
	vClaimTx   = "idem-tx"
	vOwnTx     = "idem-own"
	vOneCommit = "idem-1c"
	vWait      = "idem-wait"
	vFloor     = "floor"
	vFloor1c   = "floor-1c"
	vFloorRead = "floor-replay"
	vContract  = "floor-contract"
	vReplay    = "replay"
	vInFlight  = "409"
	vKeyReused = "422"
	vCached    = "replay-cached"
	vCached422 = "422-cached"
	vNaiveMiss = "naive-first"
	vNaiveHit  = "naive-replay"
	vStep      = "idem-step"
	vStepKept  = "idem-step-kept"
)

// allVariants in the order of the report. bare is the denominator of every
// ratio.
var allVariants = []variant{
	{id: vBare, label: "bare handler (no idempotency)", route: routeBare, body: paymentBody, want: http.StatusCreated},
	{id: vClaimTx, label: "idem first execution, durable-claim mode (idem…Tx)", route: routeClaimTx, body: paymentBody, want: http.StatusCreated},
	{id: vWait, label: "idem first execution, durable-claim mode in wait mode (Waiting.Wait), nobody waiting", route: routeWait, body: paymentBody, want: http.StatusCreated},
	{id: vStep, label: "idem first execution, durable-claim mode, one step (idem.Step) before the writes", route: routeStep, body: paymentBody, want: http.StatusCreated},
	{id: vStepKept, label: "idem first execution, durable-claim mode, one step, the request kept for a re-drive (Request.KeepForRedrive)", route: routeStepKept, body: paymentBody, want: http.StatusCreated},
	{id: vOneCommit, label: "idem first execution, one-commit mode (OneCommit.Enabled)", route: routeOneCommit, body: paymentBody, want: http.StatusCreated},
	{id: vOwnTx, label: "idem first execution, handler commits its own transaction", route: routeOwnTx, body: paymentBody, want: http.StatusCreated},
	{id: vFloor, label: "the floor: idem's statements sent by hand (raw driver)", route: routeFloor, body: paymentBody, want: http.StatusCreated},
	{id: vFloor1c, label: "the one-commit floor: its statements sent by hand in one transaction (raw driver)", route: routeFloor1c, body: paymentBody, want: http.StatusCreated},
	{id: vFloorRead, label: "the replay floor: the record read by hand by primary key, its response sent (raw driver)", route: routeFloorRead, body: paymentBody, key: keyFloor, want: http.StatusCreated, replayed: true},
	{id: vContract, label: "the contract floor: the replay floor and what the contract asks of an answer (raw driver)", route: routeContract, body: paymentBody, key: keyContract, want: http.StatusCreated, replayed: true},
	{id: vReplay, label: "idem replay", route: routeClaimTx, body: paymentBody, key: keyReplay, want: http.StatusCreated, replayed: true},
	{id: vInFlight, label: "idem 409 (key in flight)", route: routeHold, body: paymentBody, key: keyHeld, want: http.StatusConflict},
	{id: vKeyReused, label: "idem 422 (key reused, other body)", route: routeClaimTx, body: otherPaymentBody, key: keyReplay, want: http.StatusUnprocessableEntity},
	{id: vCached, label: "idem replay, replay cache (Replay.Cache.Bytes)", route: routeCached, body: paymentBody, key: keyCached, want: http.StatusCreated, replayed: true},
	{id: vCached422, label: "idem 422, replay cache (Replay.Cache.Bytes)", route: routeCached, body: otherPaymentBody, key: keyCached, want: http.StatusUnprocessableEntity},
	{id: vNaiveMiss, label: "the article's naive Redis cache, first execution", route: routeNaive, body: paymentBody, want: http.StatusCreated, redis: true},
	{id: vNaiveHit, label: "the article's naive Redis cache, replay", route: routeNaive, body: paymentBody, key: keyNaive, want: http.StatusCreated, replayed: true, redis: true},
}

// setupKeys is how many keys setup completes for the replay and 422
// variants (and caches for the naive replay): requests cycle over them.
const setupKeys = 32

// running is one target served over loopback HTTP.
type running struct {
	t            *target
	app          *app
	handler      http.Handler
	srv          *httptest.Server
	client       *http.Client
	nonce        string
	replayKeys   []string
	cachedKeys   []string
	floorKeys    []string
	contractKeys []string
	naiveKeys    []string
	seq          atomic.Int64
}

func startRunning(t *target, a *app, nonce string) *running {
	h := a.routes()
	srv := httptest.NewServer(h)
	tr := &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 256, DisableCompression: true, IdleConnTimeout: time.Minute}
	return &running{t: t, app: a, handler: h, srv: srv, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, nonce: nonce}
}

func (r *running) close() {
	r.client.CloseIdleConnections()
	r.srv.Close()
}

// newKey returns a key never sent before in this run.
func (r *running) newKey(tag string) string {
	return r.nonce + "-" + tag + "-" + strconv.FormatInt(r.seq.Add(1), 10)
}

func newRequest(ctx context.Context, base, route, key string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+route, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer sk_test_"+merchant)
	req.Header.Set(idem.HeaderKey, key)
	return req, nil
}

// send posts one request over HTTP and reads the whole answer.
func (r *running) send(ctx context.Context, route, key string, body []byte) (int, bool, error) {
	req, err := newRequest(ctx, r.srv.URL, route, key, body)
	if err != nil {
		return 0, false, err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return 0, false, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return resp.StatusCode, resp.Header.Get(idem.HeaderReplayed) == "true", err
}

// setup completes the replay keys through idem (and through the middleware
// with a replay cache), the replay floor's keys through the floor, the
// contract floor's through it, and caches the naive keys.
func (r *running) setup(ctx context.Context) error {
	for range setupKeys {
		k := r.newKey("replay")
		if st, _, err := r.send(ctx, routeClaimTx, k, paymentBody); err != nil || st != http.StatusCreated {
			return fmt.Errorf("%s: completing replay key: status %d, %v", r.t.name, st, err)
		}
		r.replayKeys = append(r.replayKeys, k)
		// Completed, then replayed once: that replay, read from the store,
		// is what the replay cache keeps.
		k = r.newKey("cached")
		for _, want := range []bool{false, true} {
			if st, replayed, err := r.send(ctx, routeCached, k, paymentBody); err != nil || st != http.StatusCreated || replayed != want {
				return fmt.Errorf("%s: completing replay-cache key: status %d, replayed %v, %v", r.t.name, st, replayed, err)
			}
		}
		r.cachedKeys = append(r.cachedKeys, k)
		k = r.newKey("floor")
		if st, _, err := r.send(ctx, routeFloor, k, paymentBody); err != nil || st != http.StatusCreated {
			return fmt.Errorf("%s: completing replay floor key: status %d, %v", r.t.name, st, err)
		}
		r.floorKeys = append(r.floorKeys, k)
		k = r.newKey("contract")
		if st, _, err := r.send(ctx, routeContract, k, paymentBody); err != nil || st != http.StatusCreated {
			return fmt.Errorf("%s: completing contract floor key: status %d, %v", r.t.name, st, err)
		}
		r.contractKeys = append(r.contractKeys, k)
		if r.app.naive == nil {
			continue
		}
		k = r.newKey("naive")
		if st, _, err := r.send(ctx, routeNaive, k, paymentBody); err != nil || st != http.StatusCreated {
			return fmt.Errorf("%s: caching naive key: status %d, %v", r.t.name, st, err)
		}
		r.naiveKeys = append(r.naiveKeys, k)
	}
	return nil
}

// hold starts a request on the hold route and returns once its handler runs
// (its key PROCESSING under a live lease); release ends it.
func (r *running) hold(ctx context.Context) (key string, release func() error, err error) {
	entered, rel := r.app.hold.arm()
	key = r.newKey("held")
	done := make(chan error, 1)
	go func() {
		st, _, err := r.send(context.WithoutCancel(ctx), routeHold, key, paymentBody)
		if err == nil && st != http.StatusNoContent {
			err = fmt.Errorf("the held request ended with status %d", st)
		}
		done <- err
	}()
	select {
	case <-entered:
	case err := <-done:
		return "", nil, fmt.Errorf("%s: the held request did not reach its handler: %v", r.t.name, err)
	case <-time.After(30 * time.Second):
		return "", nil, fmt.Errorf("%s: the held request did not reach its handler in 30s", r.t.name)
	}
	return key, func() error { close(rel); return <-done }, nil
}

// holdFor holds a key for v when its requests need one in flight (the 409
// variant), and returns it with the function that ends the hold.
func (r *running) holdFor(ctx context.Context, v variant) (string, func(), error) {
	if v.key != keyHeld {
		return "", func() {}, nil
	}
	key, release, err := r.hold(ctx)
	if err != nil {
		return "", nil, err
	}
	return key, func() {
		if err := release(); err != nil {
			r.app.log.Error("idembench: the held request", "err", err)
		}
	}, nil
}

// cell is one measurement: one variant at one concurrency in one round.
type cell struct {
	db, variant string
	conc, round int
	n, errs     int
	firstErr    string
	elapsed     time.Duration
	rps         float64
	p50, p99    time.Duration
	// lat holds every request's latency until the cell is final (see merge).
	lat []time.Duration
}

// merge adds b's requests (the same variant, concurrency and round,
// measured at another moment) to c and computes the throughput and the
// percentiles of the whole. The result keeps no latencies.
func (c cell) merge(b cell) cell {
	c.n += b.n
	c.errs += b.errs
	if c.firstErr == "" {
		c.firstErr = b.firstErr
	}
	c.elapsed += b.elapsed
	c.lat = append(c.lat, b.lat...)
	return c.final()
}

// final computes the throughput and the percentiles of c's latencies and
// drops them.
func (c cell) final() cell {
	c.rps, c.p50, c.p99 = 0, 0, 0
	if len(c.lat) > 0 {
		slices.Sort(c.lat)
		c.rps = float64(len(c.lat)) / c.elapsed.Seconds()
		c.p50, c.p99 = percentile(c.lat, 0.50), percentile(c.lat, 0.99)
	}
	c.lat = nil
	return c
}

// keyFor returns the key of worker w's i-th request.
func (r *running) keyFor(v variant, held string, w, i int) string {
	switch v.key {
	case keyReplay:
		return r.replayKeys[(w*7+i)%len(r.replayKeys)]
	case keyNaive:
		return r.naiveKeys[(w*7+i)%len(r.naiveKeys)]
	case keyCached:
		return r.cachedKeys[(w*7+i)%len(r.cachedKeys)]
	case keyFloor:
		return r.floorKeys[(w*7+i)%len(r.floorKeys)]
	case keyContract:
		return r.contractKeys[(w*7+i)%len(r.contractKeys)]
	case keyHeld:
		return held
	}
	return r.nonce + "-" + v.id + "-" + strconv.Itoa(w) + "-" + strconv.FormatInt(r.seq.Add(1), 10)
}

// measure runs v with conc workers for d (and at most max requests when max
// is above 0), each sending its next request as soon as the last is
// answered, and checks every answer's status. The cell keeps its latencies
// for merge; call final when it is complete.
func (r *running) measure(ctx context.Context, v variant, conc, round int, d time.Duration, max int) (cell, error) {
	c := cell{db: r.t.slug, variant: v.id, conc: conc, round: round}
	held, release, err := r.holdFor(ctx, v)
	if err != nil {
		return c, err
	}
	defer release()
	var (
		mu       sync.Mutex
		all      []time.Duration
		errs     int
		firstErr string
		issued   atomic.Int64
		wg       sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			lat := make([]time.Duration, 0, 4096)
			bad, why := 0, ""
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				if max > 0 && issued.Add(1) > int64(max) {
					break
				}
				t0 := time.Now()
				st, replayed, err := r.send(ctx, v.route, r.keyFor(v, held, w, i), v.body)
				lat = append(lat, time.Since(t0))
				switch {
				case err != nil:
					bad++
					why = err.Error()
				case st != v.want || replayed != v.replayed:
					bad++
					why = fmt.Sprintf("status %d replayed=%v, want %d replayed=%v", st, replayed, v.want, v.replayed)
				}
			}
			mu.Lock()
			all = append(all, lat...)
			errs += bad
			if why != "" && firstErr == "" {
				firstErr = why
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	c.elapsed = time.Since(start)
	c.n, c.errs, c.firstErr, c.lat = len(all), errs, firstErr, all
	return c, ctx.Err()
}

// percentile of sorted (nearest rank).
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// allocs is what one request of a variant allocates in the server: the
// handler behind http.Handler.ServeHTTP, no network, one goroutine.
type allocs struct {
	db, variant string
	perReq      float64 // allocations
	bytesPerReq float64
}

// measureAllocs serves n requests of v in process, one at a time, and
// divides the runtime's malloc counters by n. Requests and recorders are
// made before the count starts; background goroutines (the pools' health
// checks) add a little noise.
func (r *running) measureAllocs(ctx context.Context, v variant, n int) (allocs, error) {
	a := allocs{db: r.t.slug, variant: v.id}
	held, release, err := r.holdFor(ctx, v)
	if err != nil {
		return a, err
	}
	defer release()
	serve := func(count int) error {
		reqs := make([]*http.Request, count)
		recs := make([]*httptest.ResponseRecorder, count)
		for i := range reqs {
			req, err := newRequest(ctx, "http://idembench", v.route, r.keyFor(v, held, 0, i), v.body)
			if err != nil {
				return err
			}
			req.RemoteAddr = "127.0.0.1:1"
			reqs[i], recs[i] = req, httptest.NewRecorder()
		}
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := range reqs {
			r.handler.ServeHTTP(recs[i], reqs[i])
		}
		runtime.ReadMemStats(&after)
		for _, rec := range recs {
			if rec.Code != v.want {
				return fmt.Errorf("%s %s: status %d, want %d: %s", r.t.name, v.id, rec.Code, v.want, rec.Body)
			}
		}
		a.perReq = float64(after.Mallocs-before.Mallocs) / float64(count)
		a.bytesPerReq = float64(after.TotalAlloc-before.TotalAlloc) / float64(count)
		return nil
	}
	if err := serve(max(n/10, 5)); err != nil { // warm the statement caches
		return a, err
	}
	return a, serve(n)
}
