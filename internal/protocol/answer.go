package protocol

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// decideStored is the Answer of the record rec, as the store returned it,
// that a claim of p lost to.
func (c *Config) decideStored(ctx context.Context, rec idemdriver.Record, p idemdriver.ClaimParams) Answer {
	return c.decide(ctx, rec, p, false)
}

// errPlainRecord is why a sealed engine without ReplayPlain refuses a
// record stored plain.
var errPlainRecord = fmt.Errorf("%w: the record is stored plain (its seal_key is empty), and this engine holds SealKeys "+
	"and replays sealed records only (EngineOptions.Sealing.ReplayPlain)", ErrSealBroken)

// decide is decideStored of rec; opened says that rec's response is opened
// already (the replay cache holds replays as they were answered).
func (c *Config) decide(ctx context.Context, rec idemdriver.Record, p idemdriver.ClaimParams, opened bool) Answer {
	switch idemdriver.Decide(&rec, false, p) {
	case idemdriver.DecisionReplay:
		if rec.Response == nil {
			// Damaged by hand or by a partial restore: say so, not 409 forever.
			c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record holds no readable response (its response columns are missing or damaged)",
				"scope", p.Scope, "key", p.Key)
			return Answer{Kind: KindResponseMissing, Record: rec, Err: ErrResponseMissing}
		}
		switch {
		case opened:
		case rec.Response.SealKey == "" && c.Keyring != nil && !c.ReplayPlain:
			// Sealing's downgrade: a plain body planted under an emptied
			// seal_key authenticates nothing. A server fault, as a broken seal.
			c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record is stored plain but this engine replays sealed records only; "+
				"answering 500, it is not run again (set ReplayPlain while plain records written before sealing live)",
				"scope", p.Scope, "key", p.Key)
			return Answer{Kind: KindSealBroken, Record: rec, Err: errPlainRecord}
		case rec.Response.SealKey != "":
			resp, err := c.Keyring.OpenResponse(seal.LifeOf(rec), *rec.Response)
			if err != nil {
				// A server fault, never a re-execution: the record stays SUCCEEDED.
				c.Logger.ErrorContext(ctx, "idem: a SUCCEEDED record cannot be opened; answering 500, it is not run again",
					"scope", p.Scope, "key", p.Key, "seal_key", rec.Response.SealKey, "err", err)
				kind := KindSealBroken
				if errors.Is(err, ErrSealKeyMissing) {
					kind = KindSealKeyMissing
				}
				return Answer{Kind: kind, Record: rec, Err: err}
			}
			rec.Response = &resp
		}
		return Answer{Kind: KindReplay, Record: rec}
	case idemdriver.DecisionDamaged:
		// Damaged by hand or by a partial restore: no lease says whether its
		// execution runs. A server fault, never a 503 that invites retries
		// forever, and never a takeover.
		c.Logger.ErrorContext(ctx, "idem: a PROCESSING record has no lease bound (locked_until is NULL), so it cannot be told whether "+
			"its execution still runs; answering 500, it is not run (`idem stuck` lists it; release the key once its execution is known)",
			"scope", p.Scope, "key", p.Key, "fencing_token", rec.FencingToken, "owner", rec.Owner)
		return Answer{Kind: KindRecordDamaged, Record: rec, Err: ErrRecordDamaged}
	case idemdriver.DecisionUnknown:
		return Answer{Kind: KindOutcomeUnknown, Record: rec, Err: ErrOutcomeUnknown}
	case idemdriver.DecisionKeyReused:
		sameOp := rec.Method == p.Method && rec.Path == p.Path
		// A method in another case, or a path escaped otherwise ("/%70ay"
		// for "/pay"), may name the same operation (a router may take both
		// alike): a new key is not safe for it either.
		mayBeSameOp := sameOp || strings.EqualFold(rec.Method, p.Method) && unescapedPath(rec.Path) == unescapedPath(p.Path)
		return Answer{Kind: KindKeyReused, Record: rec, SameOp: sameOp,
			Err: &keyReusedError{method: rec.Method, path: rec.Path, sameOp: mayBeSameOp}}
	}
	ra := c.inFlightRetryAfter(rec.LeaseLeft)
	return Answer{Kind: KindInFlight, Record: rec, RetryAfter: ra, Err: &InFlightError{RetryAfter: ra}}
}

func (c *Config) inFlightRetryAfter(leaseLeft time.Duration) time.Duration {
	return max(time.Second, min(c.InFlightRetryAfter, leaseLeft, c.LeaseDuration))
}

func (c *Config) claimFailed(ctx context.Context, err error) Answer {
	if errors.Is(err, idemdriver.ErrUnstorable) {
		c.Logger.ErrorContext(ctx, "idem: the store cannot hold this request's scope", "err", err)
		return Answer{Kind: KindUnstorable, Err: fmt.Errorf("%w: %w", ErrScopeUnstorable, err)}
	}
	serr := &StoreError{Op: "claim", Err: err}
	c.Logger.ErrorContext(ctx, "idem: store unavailable", "err", serr)
	return Answer{Kind: KindClaimFailed, Err: serr}
}

// unescapedPath is path with its percent-encoding undone, or path itself
// when it does not decode.
func unescapedPath(path string) string {
	if u, err := url.PathUnescape(path); err == nil {
		return u
	}
	return path
}
