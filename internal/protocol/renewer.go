package protocol

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idemgo/idem/idemdriver"
)

// renewer renews the leases of an engine's executions in flight together:
// one idemdriver.Renewer.Renew per tick (every LeaseDuration/3) for all of
// them, so that a burst of executions costs one renewal statement per tick,
// which the driver sends outside the pool the burst's claims wait for. Each
// execution still learns alone whether it kept its lease (heartbeat.settle).
// Its loop runs only while it holds leases.
type renewer struct {
	cfg   *Config
	store idemdriver.Renewer
	every time.Duration
	// singleWriter: while an execution's transaction is open it holds the
	// database's only write lock, and its lease is not sent (as Heartbeat's
	// loop does).
	singleWriter bool

	mu      sync.Mutex
	leases  map[*heartbeat]struct{}
	running bool // the loop runs
}

// newRenewer returns the renewer of cfg's store, or nil when the store
// renews one lease at a time only.
func newRenewer(cfg *Config) *renewer {
	store, ok := cfg.Store.(idemdriver.Renewer)
	if !ok {
		return nil
	}
	return &renewer{cfg: cfg, store: store, every: cfg.LeaseDuration / 3, singleWriter: isSingleWriter(cfg.Store),
		leases: map[*heartbeat]struct{}{}}
}

// add renews hb's lease from the next tick on.
func (r *renewer) add(hb *heartbeat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.leases[hb] = struct{}{}
	if !r.running {
		r.running = true
		go r.loop()
	}
}

// remove stops renewing hb's lease; a renewal in flight may still extend it.
func (r *renewer) remove(hb *heartbeat) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.leases, hb)
}

func (r *renewer) loop() {
	t := time.NewTicker(r.every)
	defer t.Stop()
	for range t.C {
		due := r.due()
		if len(due) == 0 {
			return
		}
		r.renew(due)
	}
}

// due is the leases to renew now; none ends the loop (under the lock, so
// that the next add starts another).
func (r *renewer) due() []*heartbeat {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.leases) == 0 {
		r.running = false
		return nil
	}
	due := make([]*heartbeat, 0, len(r.leases))
	for hb := range r.leases {
		due = append(due, hb)
	}
	return due
}

// renew sends one Renew for due and tells each execution its answer.
func (r *renewer) renew(due []*heartbeat) {
	sent := time.Now() // the database's now is no earlier than this
	p := idemdriver.RenewParams{Leases: make([]idemdriver.FenceParams, 0, len(due)), LeaseDuration: r.cfg.LeaseDuration}
	sending := due[:0]
	for _, hb := range due {
		if r.singleWriter && hb.e.txOpen() {
			// The transaction holds the only write lock: no one can claim meanwhile.
			r.settle(hb, time.Now(), true, nil)
			continue
		}
		p.Leases = append(p.Leases, hb.e.fence)
		sending = append(sending, hb)
	}
	if len(sending) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.every)
	renewed, err := r.store.Renew(ctx, p)
	cancel()
	if err == nil && len(renewed) != len(p.Leases) {
		err = fmt.Errorf("idem: the store answered %d renewals for %d leases", len(renewed), len(p.Leases))
	}
	for i, hb := range sending {
		r.settle(hb, sent, err == nil && renewed[i], err)
	}
}

// settle gives hb its renewal's answer, and stops renewing a lease that is
// lost or given up.
func (r *renewer) settle(hb *heartbeat, sent time.Time, ok bool, err error) {
	if !hb.settle(sent, ok, err) {
		r.remove(hb)
	}
}
