package protocol

import (
	"log/slog"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// Config is what the protocol runs by: the front's settings, validated and
// defaulted there (idem.EngineOptions documents each), and the runtime state
// built from them (the keyring).
type Config struct {
	Store              idemdriver.Driver
	LeaseDuration      time.Duration
	Retention          time.Duration
	Owner              string
	Outcome            func(status int) Outcome
	InFlightRetryAfter time.Duration
	ClaimTimeout       time.Duration
	CompleteTimeout    time.Duration
	MaxExecution       time.Duration
	MaxInFlight        int
	OneCommit          bool
	OneCommitWait      time.Duration
	// Notify names each execution's record in its completion's
	// notification (idemdriver.FenceParams.Notify), so that waiters in
	// other processes wake: set when the wait mode is on.
	Notify     bool
	MaxWaiters int
	WaitPoll   time.Duration
	Logger     *slog.Logger
	// Keyring seals records and opens them; nil stores them plain.
	Keyring          *seal.Keyring
	ReplayPlain      bool
	KeepRequestBytes int64
	// RelaySecret keys the relayed keys (idem.DeriveKey).
	RelaySecret []byte
	// KeyHashSecret, when set, stores seal.HashKey(KeyHashSecret, key) for
	// each client's key (StoredKey).
	KeyHashSecret []byte
	// ReplayCacheBytes, when positive, bounds the replay cache (Run answers
	// a cached replay or 422 without a statement); ReplayCacheTTL bounds an
	// entry's life.
	ReplayCacheBytes int64
	ReplayCacheTTL   time.Duration
}

// completion is the completion of resp by the execution fenced by f: resp
// sealed for f's record (its scope, key and life) when the keyring seals,
// plain otherwise.
func (c *Config) completion(f idemdriver.FenceParams, resp idemdriver.Response) (idemdriver.CompleteParams, error) {
	stored, err := c.Keyring.SealResponse(seal.Life{Scope: f.Scope, Key: f.Key, Created: f.CreatedAt}, resp)
	return idemdriver.CompleteParams{FenceParams: f, Response: stored}, err
}
