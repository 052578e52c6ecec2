package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem/idemclient"
)

// maxSendsPerCopy bounds the sends of one copy of a logical payment (the
// global deadline bounds them in time).
const maxSendsPerCopy = 1000

// loadShape is how the clients send: the flags of the same names
// (--concurrency, --timeout-rate, ...).
type loadShape struct {
	concurrency   int
	timeoutRate   float64
	cancelRate    float64
	shortTimeout  time.Duration
	maxRetryAfter time.Duration
	deadline      time.Duration
	seed          uint64 // 0: random
}

// loadConfig shapes runLoad.
type loadConfig struct {
	hosts []string // base URLs; each attempt goes to a random one
	plan  *plan
	loadShape
	progress progressBar
	// transport is the HTTP transport under the retrying client (tests);
	// nil: a new http.Transport.
	transport http.RoundTripper
}

// outcome is what the clients of one logical payment saw.
type outcome struct {
	// Finished is true when at least one copy was answered 201.
	Finished bool `json:"finished"`
	// PaymentIDs are the distinct payment ids the 201s carried, in order:
	// exactly one when every copy got the same payment.
	PaymentIDs []string `json:"payment_ids,omitempty"`
	// Answers counts the 201s (one per copy that finished), Replayed those
	// marked Idempotent-Replayed.
	Answers  int `json:"answers"`
	Replayed int `json:"replayed"`
	// Rejected lists final answers that are neither 201 nor retryable
	// (status and problem type), for example "422 ...#key-reused".
	Rejected []string `json:"rejected,omitempty"`
	// Latency is from the first send to the first 201.
	Latency time.Duration `json:"-"`
}

// loadResult is everything runLoad measured.
type loadResult struct {
	outcomes []outcome
	seed     uint64

	requests         atomic.Int64 // attempts sent by the retrying client
	transportRetries atomic.Int64 // retries decided by the retrying client
	resends          atomic.Int64 // sends of a copy after the previous one ended unanswered
	attemptErrors    atomic.Int64 // attempts without an HTTP answer (refused, reset, cut by a deadline)
	clientTimeouts   atomic.Int64 // sends ended by their short deadline
	cancellations    atomic.Int64 // sends cancelled mid-flight
	gaveUp           atomic.Int64 // sends the retrying client gave up on (bounds reached)

	mu               sync.Mutex
	statuses         map[int]int64   // attempts per HTTP status
	attemptLatencies []time.Duration // answered attempts: send to response headers
}

// sendKind says how a send's context was shaped.
type sendKind int

const (
	sendNormal   sendKind = iota
	sendDeadline          // a short deadline
	sendCancel            // cancelled after a random delay
)

// lockedRand is a random source safe for concurrent use.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) float() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// duration returns a duration drawn uniformly from [lo, hi).
func (l *lockedRand) duration(lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return lo + time.Duration(l.r.Int64N(int64(hi-lo)))
}

func (l *lockedRand) intN(n int) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.IntN(n)
}

func newLockedRand(seed uint64) *lockedRand {
	return &lockedRand{r: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
}

// spreadTransport sends each attempt to a random host: a retry after a
// killed server lands on another one.
type spreadTransport struct {
	base  http.RoundTripper
	hosts []string // host:port
	rnd   *lockedRand
}

func (s *spreadTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	u := *r.URL
	u.Host = s.hosts[s.rnd.intN(len(s.hosts))]
	r2 := new(http.Request)
	*r2 = *r
	r2.URL = &u
	r2.Host = ""
	return s.base.RoundTrip(r2)
}

func (s *spreadTransport) CloseIdleConnections() {
	if c, ok := s.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// newBaseTransport is the HTTP transport of the storm's client: many idle
// connections (the storm keeps concurrency × duplicates requests in flight),
// no proxy (loopback only).
func newBaseTransport(maxConns int) *http.Transport {
	return &http.Transport{
		DialContext:           (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          maxConns,
		MaxIdleConnsPerHost:   maxConns,
		IdleConnTimeout:       30 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute,
	}
}

// load is one run of runLoad.
type load struct {
	cfg    loadConfig
	client *http.Client
	rnd    *lockedRand
	res    *loadResult
}

// runLoad sends every logical payment of cfg.plan, each as its copies, and
// returns what the clients saw. It returns when every logical payment is
// answered or the deadline (or ctx) ends.
func runLoad(ctx context.Context, cfg loadConfig) *loadResult {
	seed := cfg.seed
	if seed == 0 {
		seed = rand.Uint64() | 1
	}
	if cfg.progress == nil {
		cfg.progress = noProgress{}
	}
	res := &loadResult{outcomes: make([]outcome, len(cfg.plan.payments)), seed: seed, statuses: map[int]int64{}}
	l := &load{cfg: cfg, rnd: newLockedRand(seed), res: res}
	base := cfg.transport
	if base == nil {
		bt := newBaseTransport(cfg.concurrency*cfg.plan.duplicates + 16)
		defer bt.CloseIdleConnections()
		base = bt
	}
	var hostPorts []string
	for _, h := range cfg.hosts {
		if u, err := url.Parse(h); err == nil {
			hostPorts = append(hostPorts, u.Host)
		}
	}
	tr, err := idemclient.New(idemclient.Config{
		Transport:     &spreadTransport{base: base, hosts: hostPorts, rnd: l.rnd},
		MaxAttempts:   100,
		BaseDelay:     20 * time.Millisecond,
		MaxDelay:      500 * time.Millisecond,
		MaxRetryAfter: cfg.maxRetryAfter,
		MaxElapsed:    time.Minute,
		OnAttempt:     l.onAttempt,
		OnRetry:       func(idemclient.RetryInfo) { res.transportRetries.Add(1) },
	})
	if err != nil {
		panic(err) // the configuration above is valid
	}
	l.client = &http.Client{Transport: tr}

	ctx, cancel := context.WithTimeout(ctx, cfg.deadline)
	defer cancel()
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range cfg.concurrency {
		wg.Go(func() {
			for i := range jobs {
				res.outcomes[i] = l.pay(ctx, &cfg.plan.payments[i])
				cfg.progress.Add(1)
			}
		})
	}
feed:
	for i := range cfg.plan.payments {
		select {
		case jobs <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(jobs)
	wg.Wait()
	return res
}

// onAttempt counts one attempt of the retrying client.
func (l *load) onAttempt(ai idemclient.AttemptInfo) {
	l.res.requests.Add(1)
	if ai.Err != nil {
		l.res.attemptErrors.Add(1)
		return
	}
	l.res.mu.Lock()
	l.res.statuses[ai.Status]++
	l.res.attemptLatencies = append(l.res.attemptLatencies, ai.Duration)
	l.res.mu.Unlock()
}

// pay sends the copies of one logical payment at once (each starting within
// 20 ms of the first) and waits for all of them.
func (l *load) pay(ctx context.Context, lp *logical) outcome {
	start := time.Now()
	var (
		mu sync.Mutex
		o  outcome
		wg sync.WaitGroup
	)
	for c := range l.cfg.plan.duplicates {
		wg.Go(func() {
			if c > 0 {
				if !sleepCtx(ctx, l.rnd.duration(0, 20*time.Millisecond)) {
					return
				}
			}
			a := l.sendUntilDone(ctx, lp)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case a.paymentID != "":
				if !o.Finished {
					o.Finished, o.Latency = true, a.at.Sub(start)
				}
				o.Answers++
				if a.replayed {
					o.Replayed++
				}
				if !slices.Contains(o.PaymentIDs, a.paymentID) {
					o.PaymentIDs = append(o.PaymentIDs, a.paymentID)
				}
			case a.rejected != "":
				o.Rejected = append(o.Rejected, a.rejected)
			}
		})
	}
	wg.Wait()
	return o
}

// answer is how one copy of a logical payment ended.
type answer struct {
	paymentID string    // the 201's payment id
	replayed  bool      // Idempotent-Replayed: true
	at        time.Time // when the 201 came
	rejected  string    // a final answer that is not a 201
}

// sendUntilDone sends one copy until it is answered 201 (or a final
// error), with the same key every time: the retrying client retries 409s,
// 429s, 502-504s and network errors itself; a send that ends without a
// 201 (a short deadline, a cancellation, the client's bounds, a 500) is sent
// again after a short pause, until ctx ends.
func (l *load) sendUntilDone(ctx context.Context, lp *logical) answer {
	for range maxSendsPerCopy {
		if ctx.Err() != nil {
			return answer{}
		}
		a, retry := l.send(ctx, lp)
		if !retry {
			return a
		}
		l.res.resends.Add(1)
		if !sleepCtx(ctx, l.rnd.duration(10*time.Millisecond, 100*time.Millisecond)) {
			return answer{}
		}
	}
	return answer{}
}

// send makes one send of a copy; retry reports that it should be sent again.
func (l *load) send(ctx context.Context, lp *logical) (answer, bool) {
	kind := sendNormal
	switch r := l.rnd.float(); {
	case r < l.cfg.timeoutRate:
		kind = sendDeadline
	case r < l.cfg.timeoutRate+l.cfg.cancelRate:
		kind = sendCancel
	}
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	switch kind {
	case sendDeadline:
		var c2 context.CancelFunc
		sctx, c2 = context.WithTimeout(sctx, l.rnd.duration(5*time.Millisecond, l.cfg.shortTimeout))
		defer c2()
	case sendCancel:
		t := time.AfterFunc(l.rnd.duration(0, l.cfg.shortTimeout), cancel)
		defer t.Stop()
	}
	req, err := http.NewRequestWithContext(sctx, http.MethodPost, l.cfg.hosts[0]+"/v1/payments", bytes.NewReader(lp.body))
	if err != nil {
		return answer{rejected: err.Error()}, false
	}
	req.Header.Set("Authorization", "Bearer sk_test_"+lp.Merchant)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idemclient.HeaderKey, lp.Key)
	resp, err := l.client.Do(req)
	var body []byte
	if err == nil {
		body, err = readBody(resp, 1<<20)
	}
	if err != nil || retryableStatus(resp.StatusCode) {
		// No 201 yet: the send's deadline or cancellation cut it short, or
		// the retrying client reached its bounds (or was answered a 500,
		// which idem records FAILED). The same key runs again.
		switch {
		case ctx.Err() != nil:
			return answer{}, false
		case kind == sendDeadline:
			l.res.clientTimeouts.Add(1)
		case kind == sendCancel && sctx.Err() != nil:
			l.res.cancellations.Add(1)
		default:
			l.res.gaveUp.Add(1)
		}
		return answer{}, true
	}
	if resp.StatusCode == http.StatusCreated {
		var p struct {
			ID string `json:"id"`
		}
		if json.Unmarshal(body, &p) != nil || p.ID == "" {
			return answer{rejected: "201 without a payment id: " + truncate(string(body), 200)}, false
		}
		return answer{paymentID: p.ID, replayed: idemclient.Replayed(resp), at: time.Now()}, false
	}
	var p struct {
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &p)
	return answer{rejected: strconv.Itoa(resp.StatusCode) + " " + p.Type}, false
}

// retryableStatus: a key still in flight, overload, or a failure idem
// records FAILED (5xx): sending the same key again is safe.
func retryableStatus(code int) bool {
	return code == http.StatusConflict || code == http.StatusTooManyRequests || code >= 500
}

// sleepCtx waits d, or less when ctx ends first (then it returns false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}
