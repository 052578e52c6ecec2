package idem

import (
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/idemgo/idem/seal"
)

// EngineConfig configures an Engine for NewEngine: the Store and the
// protocol's settings in one flat struct. A zero field means its default.
//
// Deprecated: use Options with NewMiddleware (EngineOptions with NewEngineWith); each field's new place is named on it.
type EngineConfig struct {
	// Store: NewEngineWith's (or NewMiddleware's) first argument.
	Store Store
	// LeaseDuration: EngineOptions.Lease.Duration.
	LeaseDuration time.Duration
	// Retention: EngineOptions.Retention.
	Retention time.Duration
	// MaxResponseBytes: EngineOptions.Response.MaxBytes.
	MaxResponseBytes int64
	// Outcome: EngineOptions.Response.Outcome.
	Outcome func(status int) Outcome
	// InFlightRetryAfter: EngineOptions.RetryAfter.InFlight.
	InFlightRetryAfter time.Duration
	// ClaimTimeout: EngineOptions.Timeouts.Claim.
	ClaimTimeout time.Duration
	// CompleteTimeout: EngineOptions.Timeouts.Complete.
	CompleteTimeout time.Duration
	// MaxExecution: EngineOptions.Lease.MaxExecution.
	MaxExecution time.Duration
	// MaxInFlight: EngineOptions.Admission.MaxInFlight.
	MaxInFlight int
	// RelaySecret: EngineOptions.RelaySecret.
	RelaySecret []byte
	// Owner: EngineOptions.Lease.Owner.
	Owner string
	// OneCommit: EngineOptions.OneCommit.Enabled.
	OneCommit bool
	// OneCommitWait: EngineOptions.OneCommit.Wait.
	OneCommitWait time.Duration
	// Wait: EngineOptions.Waiting.Wait.
	Wait time.Duration
	// MaxWait: EngineOptions.Waiting.Max.
	MaxWait time.Duration
	// MaxWaiters: EngineOptions.Waiting.MaxWaiters.
	MaxWaiters int
	// WaitPoll: EngineOptions.Waiting.Poll.
	WaitPoll time.Duration
	// Logger: EngineOptions.Logger.
	Logger *slog.Logger
	// Observer: EngineOptions.Observer.
	Observer Observer
	// SealKeys: EngineOptions.Sealing.Keys.
	SealKeys []seal.Key
	// ReplayPlain: EngineOptions.Sealing.ReplayPlain.
	ReplayPlain bool
	// KeyHashSecret: EngineOptions.Sealing.KeyHashSecret.
	KeyHashSecret []byte
	// KeepRequestBytes: EngineOptions.Sealing.KeepRequestBytes.
	KeepRequestBytes int64
}

// Config configures Middleware for New: an EngineConfig and the HTTP
// fields in one flat struct. A zero field means its default.
//
// Deprecated: use Options with NewMiddleware (EngineOptions with NewEngineWith); each field's new place is named on it.
type Config struct {
	// EngineConfig: Options.Engine, and the Store NewMiddleware's first argument.
	EngineConfig
	// Scope: Options.Scope.
	Scope ScopeFunc
	// Methods: Options.Methods.
	Methods []string
	// KeyOptional: Options.KeyOptional.
	KeyOptional bool
	// MaxRequestBytes: Options.Request.MaxBytes.
	MaxRequestBytes int64
	// DiscardBytes and DiscardTimeout: Options.Request.Drain.Bytes and .Timeout.
	DiscardBytes   int64
	DiscardTimeout time.Duration
	// ReplayHeaders: Options.Replay.Headers.
	ReplayHeaders []string
	// Fingerprint: Options.Request.Fingerprint.
	Fingerprint FingerprintFunc
	// StoreRetryAfter: Options.Engine.RetryAfter.Store.
	StoreRetryAfter time.Duration
	// ReplayCacheBytes: Options.Replay.Cache.Bytes.
	ReplayCacheBytes int64
	// ReplayCacheTTL: Options.Replay.Cache.TTL.
	ReplayCacheTTL time.Duration
	// ProblemWriter: Options.ProblemWriter.
	ProblemWriter func(w http.ResponseWriter, r *http.Request, p Problem)
	// Route: Options.Route.
	Route func(r *http.Request) string
}

// New is NewMiddleware(cfg.Store, ...) with cfg's fields in their new places.
//
// Deprecated: use NewMiddleware.
func New(cfg Config) (*Middleware, error) {
	store, o := cfg.options()
	m, err := NewMiddleware(store, o)
	if err != nil {
		return nil, fmt.Errorf("%w\n(each field is named by its place in Options; each field of Config names its place)", err)
	}
	return m, nil
}

// NewEngine is NewEngineWith(cfg.Store, ...) with cfg's fields in their new
// places.
//
// Deprecated: use NewEngineWith.
func NewEngine(cfg EngineConfig) (*Engine, error) {
	store, o := cfg.Options()
	eng, err := NewEngineWith(store, o)
	if err != nil {
		return nil, fmt.Errorf("%w\n(each field is named by its place in EngineOptions; each field of EngineConfig names its place)", err)
	}
	return eng, nil
}

// WithDefaults returns c with every zero field set to its default
// (EngineOptions.WithDefaults).
//
// Deprecated: use EngineOptions.WithDefaults.
func (c EngineConfig) WithDefaults() EngineConfig {
	store, o := c.Options()
	return engineConfigOf(store, o.WithDefaults())
}

// WithDefaults returns c with every zero field set to its default
// (Options.WithDefaults).
//
// Deprecated: use Options.WithDefaults.
func (c Config) WithDefaults() Config {
	store, o := c.options()
	return configOf(store, o.WithDefaults())
}

// Options returns c's Store, and its fields in their new places: what
// NewEngineWith takes (an adapter's deprecated constructor converts with it).
func (c EngineConfig) Options() (Store, EngineOptions) {
	return c.Store, EngineOptions{
		Lease:      LeaseOptions{Duration: c.LeaseDuration, MaxExecution: c.MaxExecution, Owner: c.Owner},
		Retention:  c.Retention,
		Timeouts:   TimeoutOptions{Claim: c.ClaimTimeout, Complete: c.CompleteTimeout},
		Response:   ResponseOptions{MaxBytes: c.MaxResponseBytes, Outcome: c.Outcome},
		RetryAfter: RetryAfterOptions{InFlight: c.InFlightRetryAfter},
		Waiting:    WaitOptions{Wait: c.Wait, Max: c.MaxWait, MaxWaiters: c.MaxWaiters, Poll: c.WaitPoll},
		OneCommit:  OneCommitOptions{Enabled: c.OneCommit, Wait: c.OneCommitWait},
		Sealing: SealingOptions{Keys: c.SealKeys, ReplayPlain: c.ReplayPlain, KeyHashSecret: c.KeyHashSecret,
			KeepRequestBytes: c.KeepRequestBytes},
		Admission:   AdmissionOptions{MaxInFlight: c.MaxInFlight},
		RelaySecret: c.RelaySecret,
		Logger:      c.Logger,
		Observer:    c.Observer,
	}
}

// options is c's Store, and its fields in their new places.
func (c Config) options() (Store, Options) {
	store, e := c.EngineConfig.Options()
	e.RetryAfter.Store = c.StoreRetryAfter
	return store, Options{
		Scope:       c.Scope,
		Engine:      e,
		Methods:     c.Methods,
		KeyOptional: c.KeyOptional,
		Request: RequestOptions{MaxBytes: c.MaxRequestBytes, Fingerprint: c.Fingerprint,
			Drain: DrainOptions{Bytes: c.DiscardBytes, Timeout: c.DiscardTimeout}},
		Replay: ReplayOptions{Headers: c.ReplayHeaders,
			Cache: ReplayCacheOptions{Bytes: c.ReplayCacheBytes, TTL: c.ReplayCacheTTL}},
		ProblemWriter: c.ProblemWriter,
		Route:         c.Route,
	}
}

// engineConfigOf is the EngineConfig of store and o, Options' inverse.
func engineConfigOf(store Store, o EngineOptions) EngineConfig {
	return EngineConfig{
		Store: store, LeaseDuration: o.Lease.Duration, Retention: o.Retention, MaxResponseBytes: o.Response.MaxBytes,
		Outcome: o.Response.Outcome, InFlightRetryAfter: o.RetryAfter.InFlight, ClaimTimeout: o.Timeouts.Claim,
		CompleteTimeout: o.Timeouts.Complete, MaxExecution: o.Lease.MaxExecution, MaxInFlight: o.Admission.MaxInFlight,
		RelaySecret: o.RelaySecret, Owner: o.Lease.Owner, OneCommit: o.OneCommit.Enabled, OneCommitWait: o.OneCommit.Wait,
		Wait: o.Waiting.Wait, MaxWait: o.Waiting.Max, MaxWaiters: o.Waiting.MaxWaiters, WaitPoll: o.Waiting.Poll,
		Logger: o.Logger, Observer: o.Observer, SealKeys: o.Sealing.Keys, ReplayPlain: o.Sealing.ReplayPlain,
		KeyHashSecret: o.Sealing.KeyHashSecret, KeepRequestBytes: o.Sealing.KeepRequestBytes,
	}
}

// configOf is the Config of store and o, options' inverse.
func configOf(store Store, o Options) Config {
	return Config{
		EngineConfig: engineConfigOf(store, o.Engine), Scope: o.Scope, Methods: o.Methods, KeyOptional: o.KeyOptional,
		MaxRequestBytes: o.Request.MaxBytes, DiscardBytes: o.Request.Drain.Bytes, DiscardTimeout: o.Request.Drain.Timeout,
		ReplayHeaders: o.Replay.Headers, Fingerprint: o.Request.Fingerprint, StoreRetryAfter: o.Engine.RetryAfter.Store,
		ReplayCacheBytes: o.Replay.Cache.Bytes, ReplayCacheTTL: o.Replay.Cache.TTL, ProblemWriter: o.ProblemWriter, Route: o.Route,
	}
}
