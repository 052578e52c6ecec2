package idem

import (
	"math"
	"net/http"
	"time"

	"github.com/maypok86/otter/v2"

	"github.com/idemgo/idem/idemdriver"
)

// replayCache holds the SUCCEEDED records the middleware replayed, by
// scope and key (Config.ReplayCacheBytes): what a retry needs to be
// answered its replay or its 422 without the store.
type replayCache struct {
	c *otter.Cache[replayKey, *cachedRecord]
}

type replayKey struct{ scope, key string }

// cachedRecord is the part of a SUCCEEDED record that the answer to a
// claim that lost to it reads (idemdriver.Decide and Middleware.answer).
type cachedRecord struct {
	method, path string
	fingerprint  []byte
	response     *idemdriver.Response
	expiresAt    time.Time // database clock
}

// recordOverhead approximates, in bytes, what an entry costs beyond the
// lengths of its strings and body.
const recordOverhead = 256

func newReplayCache(maxBytes int64, ttl time.Duration) *replayCache {
	return &replayCache{c: otter.Must(&otter.Options[replayKey, *cachedRecord]{
		MaximumWeight: uint64(maxBytes),
		Weigher: func(k replayKey, r *cachedRecord) uint32 {
			n := recordOverhead + len(k.scope) + len(k.key) + len(r.method) + len(r.path) + len(r.fingerprint) + len(r.response.Body)
			for name, vs := range r.response.Header {
				n += len(name)
				for _, v := range vs {
					n += len(v)
				}
			}
			return uint32(min(n, math.MaxUint32))
		},
		ExpiryCalculator: otter.ExpiryCreatingFunc(func(e otter.Entry[replayKey, *cachedRecord]) time.Duration {
			return min(ttl, time.Until(e.Value.expiresAt))
		}),
	})}
}

// get returns the cached record (none on a nil cache) of (scope, key) as a claim that lost to it
// would have read it, and false when there is none or it has expired.
func (rc *replayCache) get(scope, key string) (idemdriver.Record, bool) {
	if rc == nil {
		return idemdriver.Record{}, false
	}
	r, ok := rc.c.GetIfPresent(replayKey{scope, key})
	if !ok || !time.Now().Before(r.expiresAt) {
		return idemdriver.Record{}, false
	}
	// The headers copied: the replay hands their value slices to the
	// response writer, where another middleware may change them in place.
	resp := *r.response
	resp.Header = http.Header(resp.Header).Clone()
	return idemdriver.Record{Scope: scope, Key: key, Method: r.method, Path: r.path, Fingerprint: r.fingerprint,
		State: idemdriver.StateSucceeded, Response: &resp, ExpiresAt: r.expiresAt}, true
}

// put keeps rec, the record of (scope, key) that a claim read from the
// store and lost to, when it is SUCCEEDED with its response and has not
// expired on this process's clock.
func (rc *replayCache) put(scope, key string, rec idemdriver.Record) {
	if rc == nil || rec.State != idemdriver.StateSucceeded || rec.Response == nil || !time.Now().Before(rec.ExpiresAt) {
		return
	}
	// A copy of the headers: this request's replay hands rec's to the
	// response writer.
	resp := *rec.Response
	resp.Header = http.Header(resp.Header).Clone()
	rc.c.Set(replayKey{scope, key}, &cachedRecord{method: rec.Method, path: rec.Path,
		fingerprint: rec.Fingerprint, response: &resp, expiresAt: rec.ExpiresAt})
}
