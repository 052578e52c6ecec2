package protocol

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"

	"github.com/idemgo/idem/idemdriver"
)

// The wait mode (docs/contract.md "Waiting for the owner"): a duplicate that
// finds its key in flight waits for the owner's outcome instead of 409.
//
// A waiter holds no connection while it waits. It sleeps on its key's
// channel in the hub, which is woken by this process's own execution of the
// key when it ends, and by the store's notifications (idemdriver.Notifier:
// PostgreSQL's LISTEN on one connection per process) when another process's
// does (the first waiter of a key in a process marks the record, so that a
// durable-claim owner notifies: idemdriver.WaitMarker); it also wakes every
// poll interval and when the lease it saw runs out. Woken, the waiters of a
// key in this process read its record once between them (singleflight), and
// answer from it: a replay, 422, or, when the record can be claimed again
// (FAILED, released, its owner dead), one of them claims it, exactly as a
// retry would.

// listenLinger is how long the hub keeps listening after its last waiter
// left: a burst of duplicates does not reconnect for each wait.
const listenLinger = 5 * time.Second

type waitHub struct {
	cfg      *Config
	notifier idemdriver.Notifier // nil: waiters poll
	// marker marks the records waited for, so that their durable-claim
	// owners notify (idemdriver.FenceParams.NotifyMarked); nil when the
	// store notifies every end, or none.
	marker idemdriver.WaitMarker
	reads  singleflight.Group

	mu      sync.Mutex
	keys    map[string]*keyWaiters // by notification payload
	waiting int
	// following counts the one-commit requests behind this process's own
	// execution of their key (oneCommit.await), which MaxWaiters does not bound.
	following int
	// listening is the listener's cancel while it runs; ready reports that
	// it listens now (notifications are not missed).
	listening context.CancelFunc
	ready     bool
	linger    *time.Timer
	closed    bool // Engine.Close: no listener any more
	gen       int  // the running listener's; an ended one's callbacks are ignored
}

type keyWaiters struct {
	n        int
	wake     chan struct{} // closed and replaced at each wake
	claiming bool          // one waiter of this process claims at a time
	// marking names the execution (fencing token, created_at) that this
	// process's waiters marked or mark now (markBusy); unmarked says the
	// mark is not known to hold (not yet done, or refused), so they poll at
	// WaitPoll and the next of them to wake marks again.
	marking  execID
	markBusy bool
	unmarked bool
}

// execID names one execution of a record: its fencing token and life
// (created_at, in nanoseconds: comparable whatever its location).
type execID struct {
	token   int64
	created int64
}

func newWaitHub(cfg *Config) *waitHub {
	h := &waitHub{cfg: cfg, keys: map[string]*keyWaiters{}}
	if n, ok := cfg.Store.(idemdriver.Notifier); ok && n.Notifies() {
		h.notifier = n
		h.marker, _ = cfg.Store.(idemdriver.WaitMarker)
	}
	return h
}

// join registers a waiter of payload's key; false when MaxWaiters wait already.
func (h *waitHub) join(payload string) (*keyWaiters, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting >= h.cfg.MaxWaiters {
		return nil, false
	}
	h.waiting++
	kw := h.keys[payload]
	if kw == nil {
		kw = &keyWaiters{wake: make(chan struct{})}
		h.keys[payload] = kw
	}
	kw.n++
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	if h.notifier != nil && h.listening == nil && !h.closed {
		ctx, cancel := context.WithCancel(context.Background())
		h.listening = cancel
		h.gen++
		go h.listen(ctx, h.gen)
	}
	return kw, true
}

func (h *waitHub) leave(payload string, kw *keyWaiters) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting--
	if kw.n--; kw.n == 0 {
		delete(h.keys, payload)
	}
	if h.waiting == 0 && h.listening != nil {
		stop := h.listening
		h.linger = time.AfterFunc(listenLinger, func() {
			h.mu.Lock()
			defer h.mu.Unlock()
			if h.waiting == 0 && h.listening != nil {
				stop()
				h.listening, h.ready, h.linger = nil, false, nil
			}
		})
	}
}

// listen runs the store's listener gen until ctx ends.
func (h *waitHub) listen(ctx context.Context, gen int) {
	err := h.notifier.Listen(ctx, func(listening bool) {
		h.mu.Lock()
		defer h.mu.Unlock()
		if gen != h.gen {
			return
		}
		h.ready = listening
		if listening {
			// Listening (again): what was sent before is read once more.
			for _, kw := range h.keys {
				kw.broadcast()
			}
		}
	}, h.wake)
	if err != nil && !errors.Is(err, context.Canceled) {
		h.cfg.Logger.Warn("idem: the store's notifications stopped; waiters poll", "err", err)
	}
	h.mu.Lock()
	if gen == h.gen {
		h.ready = false
	}
	h.mu.Unlock()
}

// wake wakes the waiters of payload's key in this process.
func (h *waitHub) wake(payload string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if kw := h.keys[payload]; kw != nil {
		kw.broadcast()
	}
}

// Close stops the wait mode's listener (Config.Wait: PostgreSQL's
// LISTEN connection, which otherwise ends 5 s after the last waiter left),
// and starts none again: the engine still serves, and its waiters poll. Call
// it when the engine is no longer used, as a test does. It returns nil.
func (eng *Engine) Close() error {
	h := eng.waits
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closed = true
	if h.linger != nil {
		h.linger.Stop()
		h.linger = nil
	}
	if h.listening != nil {
		h.listening()
		h.listening, h.ready = nil, false
	}
	return nil
}

// Waiters returns the number of requests (and Do calls) of this process
// waiting for another execution of their key: with Config.Wait, and
// in one-commit mode those behind this process's own execution of the key.
func (eng *Engine) Waiters() int {
	eng.waits.mu.Lock()
	defer eng.waits.mu.Unlock()
	return eng.waits.waiting + eng.waits.following
}

func (h *waitHub) follow(n int) {
	h.mu.Lock()
	h.following += n
	h.mu.Unlock()
}

func (kw *keyWaiters) broadcast() {
	close(kw.wake)
	kw.wake = make(chan struct{})
}

// signal returns the channel the next wake closes, and the poll interval.
func (h *waitHub) signal(kw *keyWaiters) (<-chan struct{}, time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ready && !kw.unmarked {
		return kw.wake, 10 * h.cfg.WaitPoll
	}
	return kw.wake, h.cfg.WaitPoll
}

// mark marks rec, the record of p's key in flight, as waited for
// (idemdriver.WaitMarker), once per execution for this process's waiters
// of the key: its owner's end then notifies. It is done before the record
// is read, so that an end the read does not see comes after the mark. A
// mark refused (the row locked by a write in progress) or failed leaves kw
// unmarked: its waiters poll at WaitPoll, and mark again when they wake.
func (h *waitHub) mark(ctx context.Context, p idemdriver.ClaimParams, kw *keyWaiters, rec idemdriver.Record) {
	if h.marker == nil || rec.State != idemdriver.StateProcessing {
		return
	}
	id := execID{rec.FencingToken, rec.CreatedAt.UnixNano()}
	h.mu.Lock()
	if kw.markBusy || kw.marking == id && !kw.unmarked {
		h.mu.Unlock()
		return
	}
	kw.marking, kw.unmarked, kw.markBusy = id, true, true
	h.mu.Unlock()
	mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.ClaimTimeout)
	defer cancel()
	ok, err := h.marker.MarkWaited(mctx, idemdriver.FenceParams{Scope: p.Scope, Key: p.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt})
	if err != nil {
		h.cfg.Logger.WarnContext(ctx, "idem: marking a record waited for failed; its waiters poll", "err", err)
	}
	h.mu.Lock()
	kw.markBusy = false
	if kw.marking == id {
		kw.unmarked = !ok || err != nil
	}
	h.mu.Unlock()
}

func (h *waitHub) tryClaim(kw *keyWaiters) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if kw.claiming {
		return false
	}
	kw.claiming = true
	return true
}

func (h *waitHub) claimDone(kw *keyWaiters) {
	h.mu.Lock()
	kw.claiming = false
	h.mu.Unlock()
}

// read reads p's record once for every waiter of its key in this process
// that asks meanwhile; each gets its own copy of the stored headers.
func (h *waitHub) read(ctx context.Context, payload string, p idemdriver.ClaimParams) (*idemdriver.Record, error) {
	v, err, _ := h.reads.Do(payload, func() (any, error) {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.cfg.ClaimTimeout)
		defer cancel()
		rec, err := h.cfg.Store.Get(rctx, idemdriver.GetParams{Scope: p.Scope, Key: p.Key, ClockOffset: p.ClockOffset})
		if errors.Is(err, idemdriver.ErrNotFound) {
			return (*idemdriver.Record)(nil), nil
		}
		return &rec, err
	})
	if err != nil {
		return nil, err
	}
	shared := v.(*idemdriver.Record)
	if shared == nil {
		return nil, nil
	}
	rec := *shared
	if rec.Response != nil {
		resp := *rec.Response
		resp.Header = http.Header(resp.Header).Clone()
		rec.Response = &resp
	}
	return &rec, nil
}

// await waits up to budget for the outcome of p's key, in flight as v says,
// and returns what a claim then gets: a replay, 422 or damaged record's 500 read from the record,
// or the claim of this or another attempt (claim), or v (409) when budget
// runs out, ctx ends or MaxWaiters wait already; the claimed's waited
// reports that the request waited: always but when MaxWaiters wait already.
func (h *waitHub) await(ctx context.Context, p idemdriver.ClaimParams, budget time.Duration, v Answer,
	claim func() (claimed, Answer)) (claimed, Answer) {
	payload := NotifyPayload(p.Scope, p.Key)
	kw, ok := h.join(payload)
	if !ok {
		return claimed{}, v
	}
	defer h.leave(payload, kw)
	c, v := h.awaitJoined(ctx, p, payload, kw, budget, v, claim)
	c.waited = true
	return c, v
}

// awaitJoined is await once kw joined.
func (h *waitHub) awaitJoined(ctx context.Context, p idemdriver.ClaimParams, payload string, kw *keyWaiters, budget time.Duration, v Answer,
	claim func() (claimed, Answer)) (claimed, Answer) {
	deadline := time.Now().Add(budget)
	// The first read follows the join at once: an outcome recorded between
	// the claim and the join woke nobody.
	for first := true; ; first = false {
		if !first && !h.sleep(ctx, kw, v, deadline) {
			return claimed{}, v
		}
		h.mark(ctx, p, kw, v.Record)
		rec, err := h.read(ctx, payload, p)
		if err != nil {
			return claimed{}, h.cfg.claimFailed(ctx, err)
		}
		switch d := idemdriver.Decide(rec, false, p); {
		case d == idemdriver.DecisionReplay || d == idemdriver.DecisionKeyReused || d == idemdriver.DecisionDamaged || d == idemdriver.DecisionUnknown:
			return claimed{}, h.cfg.decideStored(ctx, *rec, p)
		case d == idemdriver.DecisionInFlight:
			v = h.cfg.decideStored(ctx, *rec, p)
		case h.tryClaim(kw):
			c, cv := claim()
			h.claimDone(kw)
			if cv.Kind != KindInFlight {
				return c, cv
			}
			v = cv
		}
		if !time.Now().Before(deadline) {
			return claimed{}, v
		}
	}
}

// sleep waits for a wake of kw, the poll interval, the end of the lease v
// saw, or deadline; false when ctx ended first.
func (h *waitHub) sleep(ctx context.Context, kw *keyWaiters, v Answer, deadline time.Time) bool {
	wake, poll := h.signal(kw)
	next := min(poll, time.Until(deadline))
	if left := v.Record.LeaseLeft; left > 0 {
		next = min(next, left+time.Millisecond)
	}
	timer := time.NewTimer(max(next, 0))
	defer timer.Stop()
	select {
	case <-wake:
	case <-timer.C:
	case <-ctx.Done():
		return false
	}
	return true
}

// NotifyPayload names (scope, key) in notifications: 128 bits of a SHA-256,
// so that any scope and key fit a notification and none is sent in clear.
// A collision only wakes another key's waiters, who read their record again.
func NotifyPayload(scope, key string) string {
	h := sha256.New()
	h.Write([]byte(scope))
	h.Write([]byte{0})
	h.Write([]byte(key))
	return hex.EncodeToString(h.Sum(nil)[:16])
}
