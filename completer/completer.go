// Package completer finishes what a crash, a provider timeout or a client
// that went away left behind (docs/contract.md section 11.4): a Completer,
// elected among processes by a lease row as the retention maintainer is,
// finds the executions abandoned past a started step (idem.Step) and
// re-drives each through the protected handler, so that its outcome is
// recorded without its client; the client's late retry gets the replay.
//
// A re-drive is an ordinary request with the record's key: idem's
// middleware claims it with the same statement a client's retry uses (a
// takeover or a re-claim under a new fencing token), so a retry and the
// completer race through one statement and exactly one runs. The request
// is the one kept at the execution's first step (idem's
// RequestOptions.KeepForRedrive); Config.Context rebuilds what the
// application's authentication put in its context from the record's scope,
// and no credential is ever kept. What it cannot finish (a kept request
// that does not open or was cut, or MaxAttempts reached) it ends UNKNOWN
// (idem.ErrOutcomeUnknown) for an operator: a step started, so the effect
// may have happened. An execution with no request kept (Do, gRPC, a route
// without KeepForRedrive) is not its to finish: it leaves it to its
// client's retry or its queue's redelivery; but an at-most-once step such
// an execution started without a result is ended UNKNOWN near its
// record's expiry, since a request after the expiry would start a new
// life and run the step again.
package completer

//lint:file-ignore ST1005 validation errors start with the Config field they name

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/seat"
	"github.com/idemgo/idem/seal"
)

// Defaults of Config.
const (
	DefaultInterval    = 2 * time.Second
	DefaultGrace       = 10 * time.Second
	DefaultMaxAttempts = 6
	DefaultMaxInFlight = 4
	DefaultRate        = 20
	DefaultBatch       = 100
)

// LockName is the completer's lease (idemdriver.LockParams.Name).
const LockName = "completer"

// Config configures a Completer. The zero value of every field but
// Handler and Context means its documented default.
type Config struct {
	// Handler is the protected handler behind idem's middleware
	// (mw.Handler(h)) whose Options.Request.KeepForRedrive is set. Only
	// the kept request goes through it, not the rest of the server's
	// chain. Required.
	Handler http.Handler

	// Context returns ctx with what the application's authentication
	// would have put in a request of scope (the merchant, the tenant), so
	// that the middleware's Options.Scope reads scope again. Required.
	Context func(ctx context.Context, scope string) (context.Context, error)

	// Keys are the middleware's Engine.Sealing.Keys: they open sealed kept
	// requests. Default: none (plain records only).
	Keys []seal.Key

	// Interval is the time between two cycles, and between two attempts
	// of a standby to be elected. Default: 2 s.
	Interval time.Duration

	// Grace is how long an abandoned execution is left to its client
	// before its first re-drive; the n-th re-drive waits Grace × 2^(n-1),
	// with jitter. Default: 10 s.
	Grace time.Duration

	// MaxAttempts bounds the completer's own re-drives of one execution;
	// its client's attempts do not count, before or between them (a client
	// that gave up after many 503s still gets its re-drives, and one still
	// retrying spends none), nor do an earlier leader's: a newly elected
	// completer counts anew. An execution still unfinished after
	// MaxAttempts re-drives is ended UNKNOWN
	// (idemdriver.ReasonCompleterGaveUp). At least 1. Default: 6.
	MaxAttempts int

	// MaxInFlight is the most re-drives at once; Rate the most begun per
	// second. Defaults: 4 and 20.
	MaxInFlight int
	Rate        float64

	// Batch is the most abandoned records read per cycle. Default: 100.
	Batch int

	// Lease and Retention are those of the claim that ends an execution
	// UNKNOWN (the middleware's Engine.Lease.Duration and Retention).
	// Defaults: idem.DefaultLeaseDuration and idem.DefaultRetention.
	Lease, Retention time.Duration

	// LockTTL is how long the completer's lease outlives a holder that
	// died: a process started after a crash becomes the completer within
	// it. It elects only (every re-drive is decided by the claim), so it
	// can be short. Default: 3 × Interval.
	LockTTL time.Duration

	// Holder names this process in the lease and as the owner of the
	// records it ends. Default: "hostname:pid".
	Holder string

	// OnRedrive, when set, is called after each re-drive, give-up or
	// failed attempt at either, from the completer's goroutines; not for
	// an execution left to its client (Stats.Skipped). Default: none.
	OnRedrive func(Outcome)

	// Logger receives leadership changes, re-drives and errors. Default:
	// slog.Default().
	Logger *slog.Logger

	// ClockOffset is added to the database's clock. Tests only.
	ClockOffset time.Duration
}

// WithDefaults returns a copy of c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	c.Interval = cmp.Or(c.Interval, DefaultInterval)
	c.Grace = cmp.Or(c.Grace, DefaultGrace)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxInFlight = cmp.Or(c.MaxInFlight, DefaultMaxInFlight)
	c.Rate = cmp.Or(c.Rate, DefaultRate)
	c.Batch = cmp.Or(c.Batch, DefaultBatch)
	c.Lease = cmp.Or(c.Lease, idem.DefaultLeaseDuration)
	c.Retention = cmp.Or(c.Retention, idem.DefaultRetention)
	c.LockTTL = cmp.Or(c.LockTTL, 3*c.Interval)
	c.Holder = cmp.Or(c.Holder, seat.Holder())
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

func (c Config) validate() error {
	var errs []error
	if c.Handler == nil || c.Context == nil {
		errs = append(errs, errors.New("Handler and Context are required"))
	}
	if c.Interval <= 0 || c.Grace < 0 || c.MaxAttempts < 1 || c.MaxInFlight <= 0 || c.Rate <= 0 || c.Batch <= 0 ||
		c.Lease <= 0 || c.Retention <= 0 || c.LockTTL <= 0 {
		errs = append(errs, errors.New("Interval, MaxInFlight, Rate, Batch, Lease, Retention and LockTTL must be positive, Grace not negative, MaxAttempts at least 1"))
	}
	if len(errs) > 0 {
		return fmt.Errorf("completer: invalid Config: %w", errors.Join(errs...))
	}
	return nil
}

// Outcome is what became of one abandoned execution.
type Outcome struct {
	Scope, Key string // the stored key
	// Status is the re-drive's answer (0 when none was sent: given up).
	Status int
	// GaveUp is the reason the record was ended UNKNOWN, "" otherwise.
	GaveUp string
	Err    error
}

// Stats are a Completer's running totals.
type Stats struct {
	Leader bool
	Cycles int64
	// Redriven counts re-drives, Finished those answered 2xx, GaveUp the
	// executions ended UNKNOWN, Ended those ended FAILED before any step,
	// Skipped the reads of abandoned executions with no request kept (left
	// to their clients): one such execution counts once per cycle that
	// reads it.
	Redriven, Finished, GaveUp, Ended, Skipped int64
	Errors                                     int64
}

// Store is what a Completer needs of a store: every driver of this module
// (idempgx on a plain or a partitioned table, idemmysql, idemsqlite).
type Store interface {
	idemdriver.Driver
	idemdriver.Stepper
	idemdriver.AbandonedLister
	idemdriver.MaintenanceLocker
	idemdriver.Inspector
}

// ErrUnsupported is returned by New for a store without steps or
// election.
var ErrUnsupported = errors.New("completer: the store keeps no steps or cannot elect")

// Completer re-drives abandoned executions; see the package documentation.
type Completer struct {
	store   Store
	cfg     Config
	keyring *seal.Keyring
	limiter *rate.Limiter
	slots   chan struct{}

	seat                                     *seat.Seat // the lease LockName
	cycles, redriven, finished, gaveUp, errs atomic.Int64
	ended, skipped                           atomic.Int64
	busy                                     sync.Map // keys being re-driven
	foundMu                                  sync.Mutex
	found                                    map[string]*found // by lifeOf: its re-drives

	loop seat.Loop
	wg   sync.WaitGroup // the re-drives under way
}

// New returns a Completer of store (an idemdriver.Driver that implements
// Store). Errors: ErrUnsupported, an invalid Config, invalid Keys.
func New(store idemdriver.Driver, cfg Config) (*Completer, error) {
	s, ok := store.(Store)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrUnsupported, store)
	}
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	kr, err := seal.NewKeyring(cfg.Keys)
	if err != nil {
		return nil, fmt.Errorf("completer: Keys: %w", err)
	}
	return &Completer{store: s, cfg: cfg, keyring: kr, limiter: rate.NewLimiter(rate.Limit(cfg.Rate), 1),
		slots: make(chan struct{}, cfg.MaxInFlight),
		seat: seat.New(s, idemdriver.LockParams{Name: LockName, Holder: cfg.Holder, TTL: cfg.LockTTL, ClockOffset: cfg.ClockOffset},
			"completer", cfg.Logger)}, nil
}

// Start runs the completer in the background until Stop or ctx's end.
// Errors: already started.
func (c *Completer) Start(ctx context.Context) error {
	if err := c.loop.Start(ctx, c.cfg.Interval, c.cycle, func() {
		c.wg.Wait()
		c.seat.Leave("stopped")
	}); err != nil {
		return fmt.Errorf("completer: %w", err)
	}
	return nil
}

// Stop ends the completer: it waits for the re-drives under way and
// releases its lease.
func (c *Completer) Stop() { c.loop.Stop() }

// Stats returns the running totals.
func (c *Completer) Stats() Stats {
	return Stats{Leader: c.seat.Held(), Cycles: c.cycles.Load(), Redriven: c.redriven.Load(),
		Finished: c.finished.Load(), GaveUp: c.gaveUp.Load(), Ended: c.ended.Load(), Skipped: c.skipped.Load(), Errors: c.errs.Load()}
}

func (c *Completer) cycle(ctx context.Context) {
	if err := c.Cycle(ctx); err != nil && ctx.Err() == nil {
		c.errs.Add(1)
		c.cfg.Logger.Warn("idem: completer: cycle", "err", err)
	}
}

// Cycle runs one cycle now: it leads (or returns nil as a standby), ends
// FAILED the executions whose owner died before any step, reads the
// abandoned executions and starts the re-drive of those due, without
// waiting for them (Wait does). Start calls it every Interval; call it
// yourself only on a Completer not started, one cycle at a time.
func (c *Completer) Cycle(ctx context.Context) error {
	c.cycles.Add(1)
	if lead, err := c.seat.Take(ctx); err != nil || !lead {
		return err
	}
	if err := c.endStuck(ctx); err != nil {
		return err
	}
	recs, now, err := c.store.Abandoned(ctx, idemdriver.AbandonedParams{Grace: c.cfg.Grace, Limit: c.cfg.Batch, ClockOffset: c.cfg.ClockOffset})
	if err != nil {
		return err
	}
	c.forget(now)
	for _, rec := range recs {
		if !c.due(rec, now) {
			continue
		}
		if _, busy := c.busy.LoadOrStore(rec.Scope+"\x00"+rec.Key, true); busy {
			continue
		}
		if err := c.limiter.Wait(ctx); err != nil {
			c.busy.Delete(rec.Scope + "\x00" + rec.Key)
			return nil // stopped
		}
		select {
		case c.slots <- struct{}{}:
		case <-ctx.Done():
			c.busy.Delete(rec.Scope + "\x00" + rec.Key)
			return nil
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			defer func() { <-c.slots; c.busy.Delete(rec.Scope + "\x00" + rec.Key) }()
			o := c.complete(ctx, rec, now)
			if c.cfg.OnRedrive != nil && (o.Status != 0 || o.GaveUp != "" || o.Err != nil) { // not a record left alone
				c.cfg.OnRedrive(o)
			}
		}()
	}
	return nil
}

// endStuck ends FAILED the executions whose owner died before any step
// (PROCESSING past its lease for Grace, without a step of the
// application's): nothing outside idem's database happened, so they are
// never run by the completer; FAILED, the client's retry runs them, and
// none is left PROCESSING. Damaged records are left to an operator.
func (c *Completer) endStuck(ctx context.Context) error {
	stuck, err := c.store.Stuck(ctx, idemdriver.StuckParams{Limit: c.cfg.Batch, ClockOffset: c.cfg.ClockOffset})
	if err != nil {
		return err
	}
	for _, s := range stuck {
		if s.Damaged() || s.Overdue < c.cfg.Grace {
			continue
		}
		steps, err := c.store.Steps(ctx, idemdriver.StepParams{Scope: s.Scope, Key: s.Key, CreatedAt: s.CreatedAt, ClockOffset: c.cfg.ClockOffset})
		if err != nil && !errors.Is(err, idemdriver.ErrStepsUnsupported) {
			return err
		}
		if firstStep(steps) != "" {
			continue // Abandoned has it
		}
		res, err := c.store.Claim(ctx, c.claimOf(s.Record))
		if err != nil {
			return err
		}
		if !res.Claimed || !res.Record.CreatedAt.Equal(s.CreatedAt) {
			continue
		}
		f := idemdriver.FenceParams{Scope: s.Scope, Key: s.Key, FencingToken: res.Record.FencingToken, CreatedAt: s.CreatedAt,
			LeaseDuration: c.cfg.Lease, ClockOffset: c.cfg.ClockOffset}
		if _, err := c.store.Fail(ctx, f); err != nil {
			return err
		}
		c.ended.Add(1)
		c.cfg.Logger.Info("idem: completer: ended FAILED an execution whose owner died before any step; its client's retry runs it",
			"scope", s.Scope, "key", s.Key, "overdue", s.Overdue)
	}
	return nil
}

// claimOf is the claim of rec's own request, as its client's retry sends it.
func (c *Completer) claimOf(rec idemdriver.Record) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{Scope: rec.Scope, Key: rec.Key, Method: rec.Method, Path: rec.Path,
		Fingerprint: rec.Fingerprint, LeaseDuration: c.cfg.Lease, Retention: c.cfg.Retention, Owner: c.cfg.Holder,
		ClockOffset: c.cfg.ClockOffset}
}

// firstStep is the name of the first of steps that has started
// (idemdriver.StepStarted), "" for none.
func firstStep(steps []idemdriver.Step) string {
	for _, s := range steps {
		if idemdriver.StepStarted(s) {
			return s.Name
		}
	}
	return ""
}

// Wait waits for the re-drives a Cycle started.
func (c *Completer) Wait() { c.wg.Wait() }

// holdMargin is how long before rec's expiry the completer ends UNKNOWN a
// held at-most-once start that it cannot re-drive: a tenth of the
// record's retention (from its life's start), at most an hour, at least
// ten intervals (so that a cycle sees it in time).
func (c *Completer) holdMargin(rec idemdriver.Record) time.Duration {
	return max(min(time.Hour, rec.ExpiresAt.Sub(rec.CreatedAt)/10), 10*c.cfg.Interval)
}

// found is what the completer counts of an execution life it found
// abandoned: its own re-drives, the record's attempts when last read, and
// when that was.
type found struct {
	redrives, attempts int
	seen               time.Time
}

// lifeOf names rec's execution life.
func lifeOf(rec idemdriver.Record) string {
	return rec.Scope + "\x00" + rec.Key + "\x00" + strconv.FormatInt(rec.CreatedAt.UnixNano(), 10)
}

// redrives is how many times this completer re-drove rec's life (read at
// now); its client's attempts, before or between, do not count. A record
// whose attempts went back (an operator's resolution counts them from 0
// again) is counted anew.
func (c *Completer) redrives(rec idemdriver.Record, now time.Time) int {
	c.foundMu.Lock()
	defer c.foundMu.Unlock()
	if c.found == nil {
		c.found = map[string]*found{}
	}
	f := c.found[lifeOf(rec)]
	if f == nil || rec.Attempts < f.attempts {
		f = &found{}
		c.found[lifeOf(rec)] = f
	}
	f.attempts, f.seen = rec.Attempts, now
	return f.redrives
}

// redrove counts one re-drive of rec's life.
func (c *Completer) redrove(rec idemdriver.Record) {
	c.foundMu.Lock()
	defer c.foundMu.Unlock()
	if f := c.found[lifeOf(rec)]; f != nil {
		f.redrives++
	}
}

// forget drops what it counted of lives not read for a Retention: their
// records have expired, or finished long ago.
func (c *Completer) forget(now time.Time) {
	c.foundMu.Lock()
	defer c.foundMu.Unlock()
	for k, f := range c.found {
		if now.Sub(f.seen) > c.cfg.Retention {
			delete(c.found, k)
		}
	}
}

// due reports whether rec's next re-drive is due at now: untouched for
// Grace × 2^n, n its re-drives so far (redrives), with a jitter of up to
// a half of that, fixed per (key, attempts); or its re-drives are spent.
func (c *Completer) due(rec idemdriver.Record, now time.Time) bool {
	n := c.redrives(rec, now)
	wait := float64(c.cfg.Grace) * math.Pow(2, float64(min(n, 16)))
	h := fnv.New32a()
	_, _ = fmt.Fprintf(h, "%s\x00%s\x00%d", rec.Scope, rec.Key, rec.Attempts) // a hash.Hash never fails a write
	wait *= 0.5 + float64(h.Sum32()%1000)/2000
	return rec.UpdatedAt.Add(time.Duration(wait)).Before(now) || n >= c.cfg.MaxAttempts
}

// complete re-drives rec, or ends it UNKNOWN when it cannot.
func (c *Completer) complete(ctx context.Context, rec idemdriver.Record, now time.Time) Outcome {
	o := Outcome{Scope: rec.Scope, Key: rec.Key}
	life := idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, ClockOffset: c.cfg.ClockOffset}
	steps, err := c.store.Steps(ctx, life)
	if err != nil {
		return c.failed(o, err)
	}
	var kept *idemdriver.Step
	for i, s := range steps {
		if s.Name == idemdriver.KeptRequestStep {
			kept = &steps[i]
		}
	}
	first := firstStep(steps)
	if first == "" {
		return o // its started step went (a release, a new life) since the read
	}
	if kept == nil {
		// Not this completer's to finish: a route that keeps no request
		// (Do, gRPC, an HTTP route without KeepForRedrive). Its client's
		// retry, or its queue's redelivery, resumes it; but a held
		// at-most-once start must not expire with its record: a request
		// after the expiry starts a new life, which would run the step
		// again. Near its expiry, it is held UNKNOWN for an operator.
		for _, s := range steps {
			if idemdriver.StepHeld(s) && rec.ExpiresAt.Sub(now) <= c.holdMargin(rec) {
				return c.giveUp(ctx, rec, s.Name, idemdriver.ReasonStepUnrecorded, o)
			}
		}
		c.skipped.Add(1)
		c.cfg.Logger.Debug("idem: completer: no request kept for a re-drive; left to its client", "scope", rec.Scope, "key", rec.Key)
		return o
	}
	if n := c.redrives(rec, now); n >= c.cfg.MaxAttempts {
		return c.giveUp(ctx, rec, first, idemdriver.ReasonCompleterGaveUp, o)
	}
	req, err := c.request(ctx, rec, kept)
	if err != nil {
		c.cfg.Logger.Warn("idem: completer: the execution cannot be re-driven", "scope", rec.Scope, "key", rec.Key, "err", err)
		return c.giveUp(ctx, rec, first, idemdriver.ReasonNotRedrivable, o)
	}
	w := httptest.NewRecorder()
	c.redrove(rec)
	c.cfg.Handler.ServeHTTP(w, req)
	problem := problemType(w)
	if problem == keyReused {
		// The kept request does not match the record's fingerprint (or its
		// route): the middleware refused it, and nothing ran. It will never
		// match: the execution cannot be re-driven.
		c.cfg.Logger.Warn("idem: completer: the kept request does not match its record", "scope", rec.Scope, "key", rec.Key)
		return c.giveUp(ctx, rec, first, idemdriver.ReasonNotRedrivable, o)
	}
	c.redriven.Add(1)
	o.Status = w.Code
	if w.Code < 300 {
		c.finished.Add(1)
	}
	c.cfg.Logger.Info("idem: completer: re-drove an abandoned execution", "scope", rec.Scope, "key", rec.Key,
		"attempt", rec.Attempts+1, "status", w.Code, "problem", problem)
	return o
}

// request rebuilds the request kept for a re-drive of rec.
func (c *Completer) request(ctx context.Context, rec idemdriver.Record, kept *idemdriver.Step) (*http.Request, error) {
	plain, err := c.keyring.OpenStep(seal.Life{Scope: rec.Scope, Key: rec.Key, Created: rec.CreatedAt}, seal.PartStepRelay, kept.Name, kept.SealKey, kept.Relay)
	if err != nil {
		return nil, fmt.Errorf("the kept request does not open: %w", err)
	}
	kr, err := seal.DecodeRequest(plain)
	switch {
	case err != nil:
		return nil, err
	case kr.Truncated || int64(len(kr.Body)) != kr.Size:
		return nil, errors.New("the kept request was cut")
	case kr.Key == "":
		return nil, errors.New("the kept request has no key")
	}
	target := rec.Path
	if kr.Query != "" {
		target += "?" + kr.Query
	}
	rctx, err := c.cfg.Context(ctx, rec.Scope)
	if err != nil {
		return nil, fmt.Errorf("Config.Context: %w", err)
	}
	req, err := http.NewRequestWithContext(rctx, rec.Method, target, bytes.NewReader(kr.Body))
	if err != nil {
		return nil, err
	}
	req.RequestURI = req.URL.RequestURI()
	for k, v := range kr.Header {
		req.Header[k] = append([]string(nil), v...)
	}
	req.Header.Set(idem.HeaderKey, kr.Key)
	return req, nil
}

// giveUp ends rec UNKNOWN at its step for reason: it claims the record as
// a retry would, then marks it.
func (c *Completer) giveUp(ctx context.Context, rec idemdriver.Record, step, reason string, o Outcome) Outcome {
	res, err := c.store.Claim(ctx, c.claimOf(rec))
	if err != nil {
		return c.failed(o, err)
	}
	if !res.Claimed || !res.Record.CreatedAt.Equal(rec.CreatedAt) {
		return o // a client's retry, or another completer, has it
	}
	err = c.store.MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key,
		CreatedAt: rec.CreatedAt, FencingToken: res.Record.FencingToken, Name: step, ClockOffset: c.cfg.ClockOffset}, Reason: reason})
	if err != nil {
		return c.failed(o, err)
	}
	c.gaveUp.Add(1)
	o.GaveUp = reason
	c.cfg.Logger.Error("idem: completer: the execution could not be finished; it is held UNKNOWN for an operator (idem resolve)",
		"scope", rec.Scope, "key", rec.Key, "step", step, "reason", reason, "attempts", rec.Attempts)
	return o
}

func (c *Completer) failed(o Outcome, err error) Outcome {
	c.errs.Add(1)
	c.cfg.Logger.Warn("idem: completer: re-drive", "scope", o.Scope, "key", o.Key, "err", err)
	o.Err = err
	return o
}

// keyReused is the problem type of idem's 422 (idem.ErrKeyReused).
var keyReused = idem.ProblemFor(idem.ErrKeyReused, "").Type

// problemType is the type of the problem w holds, "" for none.
func problemType(w *httptest.ResponseRecorder) string {
	if !strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json") {
		return ""
	}
	var p struct{ Type string }
	_ = json.Unmarshal(w.Body.Bytes(), &p)
	return p.Type
}
