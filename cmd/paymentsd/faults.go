//go:build idemfaults

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/idemdriver"
)

// This file and crash_*.go are the fault injection of the crash and storm
// proofs (e2e, cmd/idemstorm): compiled only with the build tag idemfaults
// (go build -tags idemfaults ./cmd/paymentsd). The binary built without it
// has no --crash-* or --stall-after-charge flag and carries none of this
// (nofaults.go: the hooks do nothing).

// Crash points of a POST /v1/payments, in the order a request passes them.
// The flag --crash-<point> P makes the process kill itself (SIGKILL: no
// deferred function runs, no connection is closed cleanly, no transaction is
// committed or rolled back by the process) with probability P when a request
// reaches the point. docs/crash-semantics.md says what the client and the
// ledger see for each, and names the tests.
const (
	// crashBeforeClaim: the request arrived, idem has not claimed its key.
	crashBeforeClaim = "before-claim"
	// crashBeforeCharge: the key is claimed (PROCESSING), the provider not called.
	crashBeforeCharge = "before-charge"
	// crashInCharge: the provider answered with its charge; the charge
	// step's result is not recorded yet (idem.Step), nothing is written.
	crashInCharge = "in-charge"
	// crashAfterCharge: the provider charged and the charge step's result
	// is recorded; nothing is written yet.
	crashAfterCharge = "after-charge"
	// crashAfterWrite: the payment and ledger rows are written: not committed
	// in --write-mode claim (they ride in the claim's transaction), committed
	// in --write-mode separate (idem has not recorded the outcome yet).
	crashAfterWrite = "after-write"
	// crashAfterCommit: idem recorded the outcome (and, in claim mode,
	// committed the rows with it); the response has not left.
	crashAfterCommit = "after-commit"
	// crashOnReplay: a replay of a recorded response is about to be sent.
	crashOnReplay = "on-replay"
)

// crashPoints lists the crash points in request order.
var crashPoints = []string{crashBeforeClaim, crashBeforeCharge, crashInCharge, crashAfterCharge, crashAfterWrite, crashAfterCommit, crashOnReplay}

// faults injects the crashes and stalls of the fault-injection flags. The
// zero value (and nil) injects nothing.
type faults struct {
	// crash maps a crash point to the probability of crashing there.
	crash map[string]float64
	// stallAfterCharge is --stall-after-charge.
	stallAfterCharge time.Duration
	log              *slog.Logger
	// roll returns a number in [0, 1); default rand.Float64.
	roll func() float64
	// kill ends the process; default killProcess (SIGKILL to itself).
	kill func()

	// frozenUntil is the end of the current stall (Unix nanoseconds): until
	// then the process renews no lease, as a paused process would not.
	frozenUntil atomic.Int64
}

// enabled reports whether any fault is configured.
func (f *faults) enabled() bool {
	if f == nil {
		return false
	}
	for _, p := range f.crash {
		if p > 0 {
			return true
		}
	}
	return f.stallAfterCharge > 0
}

// maybeCrash kills the process with the probability configured for point.
func (f *faults) maybeCrash(ctx context.Context, point string, attrs ...any) {
	if f == nil || f.crash[point] <= 0 {
		return
	}
	roll := rand.Float64
	if f.roll != nil {
		roll = f.roll
	}
	if roll() >= f.crash[point] {
		return
	}
	if e, ok := idem.ExecutionFromContext(ctx); ok {
		attrs = append(attrs, "merchant", e.Scope, "idempotency_key", e.Key, "fencing_token", e.FencingToken)
	}
	// Written synchronously to stderr before the process dies.
	f.log.ErrorContext(ctx, "fault injected: crashing now (SIGKILL)", append([]any{"point", point}, attrs...)...)
	kill := killProcess
	if f.kill != nil {
		kill = f.kill
	}
	kill()
}

// stall plays a process that stops for --stall-after-charge (a long GC
// pause, a frozen VM, SIGSTOP) and then resumes as if nothing happened: it
// sleeps without watching ctx, and for as long the process renews no lease
// (see stallingStore), so the lease can run out and another worker can take
// the key over. The caller then goes on to write, and idem's fencing decides.
func (f *faults) stall(ctx context.Context) {
	if f == nil || f.stallAfterCharge <= 0 {
		return
	}
	until := time.Now().Add(f.stallAfterCharge)
	f.frozenUntil.Store(until.UnixNano())
	attrs := []any{"for", f.stallAfterCharge.String()}
	if e, ok := idem.ExecutionFromContext(ctx); ok {
		attrs = append(attrs, "merchant", e.Scope, "idempotency_key", e.Key, "fencing_token", e.FencingToken)
	}
	f.log.WarnContext(ctx, "fault injected: stalling after the charge, renewing no lease", attrs...)
	time.Sleep(time.Until(until))
	f.log.WarnContext(ctx, "fault injected: stall over; resuming", attrs...)
}

// waitUnfrozen blocks while a stall is in progress, ignoring every context
// (a stopped process does not notice cancellations either).
func (f *faults) waitUnfrozen() {
	for {
		d := time.Until(time.Unix(0, f.frozenUntil.Load()))
		if d <= 0 {
			return
		}
		time.Sleep(d)
	}
}

// stallingStore is idem's store with lease renewals that wait out a stall
// (faults.stall): the whole process is paused, the heartbeat included, as a
// real pause would. Without it, idem's heartbeat would keep renewing the
// lease of a stalled handler, and no other worker could ever take over.
type stallingStore struct {
	idem.Store
	faults *faults
}

// Heartbeat waits for the stall to end, then renews with the time budget the
// core gave it: as if the renewal had started after the pause.
func (s *stallingStore) Heartbeat(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	budget := time.Duration(-1)
	if d, ok := ctx.Deadline(); ok {
		budget = time.Until(d)
	}
	if time.Until(time.Unix(0, s.faults.frozenUntil.Load())) > 0 {
		s.faults.waitUnfrozen()
		if budget > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), budget)
			defer cancel()
		}
	}
	return s.Store.Heartbeat(ctx, p)
}

// wrap returns next with the crash points that surround idem: before-claim
// (on arrival), after-commit and on-replay (when idem starts to send a
// response it recorded, or a replay). Only POST /v1/payments is affected.
func (f *faults) wrap(next http.Handler) http.Handler {
	if f == nil || f.crash[crashBeforeClaim] <= 0 && f.crash[crashAfterCommit] <= 0 && f.crash[crashOnReplay] <= 0 {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path != "/v1/payments" {
			next.ServeHTTP(w, r)
			return
		}
		key := r.Header.Get(idem.HeaderKey)
		merchant, _ := service.Merchant(r.Context())
		f.maybeCrash(r.Context(), crashBeforeClaim, "merchant", merchant, "idempotency_key", key)
		next.ServeHTTP(&crashWriter{ResponseWriter: w, f: f, r: r, key: key, merchant: merchant}, r)
	})
}

// crashWriter crashes when idem starts a response: a replay (on-replay), or
// a fresh 2xx, which idem sends only once its outcome is recorded
// (after-commit). Nothing has been written to the connection yet.
type crashWriter struct {
	http.ResponseWriter
	f             *faults
	r             *http.Request
	key, merchant string
	started       bool
}

func (c *crashWriter) start(status int) {
	if c.started {
		return
	}
	c.started = true
	attrs := []any{"merchant", c.merchant, "idempotency_key", c.key, "status", status}
	switch {
	case c.Header().Get(idem.HeaderReplayed) == "true":
		c.f.maybeCrash(c.r.Context(), crashOnReplay, attrs...)
	case status >= 200 && status < 300:
		c.f.maybeCrash(c.r.Context(), crashAfterCommit, attrs...)
	}
}

func (c *crashWriter) WriteHeader(status int) {
	c.start(status)
	c.ResponseWriter.WriteHeader(status)
}

func (c *crashWriter) Write(b []byte) (int, error) {
	c.start(http.StatusOK)
	return c.ResponseWriter.Write(b)
}

// Unwrap keeps http.ResponseController working through the wrapper.
func (c *crashWriter) Unwrap() http.ResponseWriter { return c.ResponseWriter }

// faultOptions are the fault-injection flags.
type faultOptions struct {
	// crash maps each crash point to its --crash-<point> probability.
	crash            map[string]float64
	stallAfterCharge time.Duration
	rates            []float64 // the flags' values, in crashPoints order
}

// register adds --crash-<point> and --stall-after-charge to fs.
func (o *faultOptions) register(fs *flag.FlagSet) {
	o.crash = map[string]float64{}
	o.rates = make([]float64, len(crashPoints))
	for i, point := range crashPoints {
		fs.Float64Var(&o.rates[i], "crash-"+point, 0, "fault injection: probability (0 to 1) of killing the process (SIGKILL) at the crash point "+point+" of a POST /v1/payments")
	}
	fs.DurationVar(&o.stallAfterCharge, "stall-after-charge", 0, "fault injection: after each charge, pause the request and lease renewal for this long, then write (a slow, not dead, owner)")
}

// validate checks the parsed flags and fills crash.
func (o *faultOptions) validate() error {
	for i, point := range crashPoints {
		if err := parseRate("crash-"+point, o.rates[i]); err != nil {
			return err
		}
		if o.rates[i] > 0 {
			o.crash[point] = o.rates[i]
		}
	}
	if o.stallAfterCharge < 0 {
		return errors.New("--stall-after-charge must not be negative")
	}
	return nil
}

// build returns the faults the flags ask for, nil when none.
func (o *faultOptions) build(log *slog.Logger) *faults {
	if len(o.crash) == 0 && o.stallAfterCharge <= 0 {
		return nil
	}
	return &faults{crash: o.crash, stallAfterCharge: o.stallAfterCharge, log: log}
}

// describe lists the injected faults for the log ("" for none).
func (o *faultOptions) describe() string {
	var parts []string
	for _, point := range crashPoints {
		if p := o.crash[point]; p > 0 {
			parts = append(parts, fmt.Sprintf("crash-%s=%g", point, p))
		}
	}
	if o.stallAfterCharge > 0 {
		parts = append(parts, "stall-after-charge="+o.stallAfterCharge.String())
	}
	return strings.Join(parts, " ")
}

// store returns idem's store as the faults need it: with lease renewals
// that wait out a stall (stallingStore) when --stall-after-charge is set,
// keeping s's steps (idemdriver.Stepper: the charge is a step, and a store
// that hid them would make idem.Step refuse).
func (f *faults) store(s idem.Store) idem.Store {
	if f == nil || f.stallAfterCharge <= 0 {
		return s
	}
	stalling := &stallingStore{Store: s, faults: f}
	if st, ok := s.(idemdriver.Stepper); ok {
		return stallingStepStore{stalling, st}
	}
	return stalling
}

type stallingStepStore struct {
	*stallingStore
	idemdriver.Stepper
}

// beforeCharge, inCharge, afterCharge and afterWrite are the crash points inside
// the handler.
func (f *faults) beforeCharge(ctx context.Context) { f.maybeCrash(ctx, crashBeforeCharge) }

func (f *faults) inCharge(ctx context.Context, charge string) {
	f.maybeCrash(ctx, crashInCharge, "charge", charge)
}

func (f *faults) afterCharge(ctx context.Context, charge string) {
	f.maybeCrash(ctx, crashAfterCharge, "charge", charge)
}

func (f *faults) afterWrite(ctx context.Context, charge, payment string, mode WriteMode) {
	f.maybeCrash(ctx, crashAfterWrite, "charge", charge, "payment", payment, "write_mode", string(mode))
}

// parseRate reads a probability from 0 to 1.
func parseRate(name string, p float64) error {
	if p < 0 || p > 1 || p != p {
		return fmt.Errorf("--%s must be a probability from 0 to 1, not %v", name, p)
	}
	return nil
}
