package protocol

import (
	"math"
	"net/http"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/maypok86/otter/v2"
)

// replayCache keeps recent replays and 422s in this process
// (Config.ReplayCacheBytes), so that a retry storm on a finished key is
// answered without a store read. A nil replayCache keeps nothing.
type replayCache struct {
	c *otter.Cache[replayKey, *cachedRecord]
}

type replayKey struct{ scope, key string }

type cachedRecord struct {
	method, path string
	fingerprint  []byte
	response     *idemdriver.Response
	opened       bool      // response is the replay's, opened; else as the store returned it
	expiresAt    time.Time // database clock
}

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

// get returns the record cached for (scope, key), and whether its response
// is opened already (put's opened).
func (rc *replayCache) get(scope, key string) (idemdriver.Record, bool, bool) {
	if rc == nil {
		return idemdriver.Record{}, false, false
	}
	r, ok := rc.c.GetIfPresent(replayKey{scope, key})
	if !ok || !time.Now().Before(r.expiresAt) {
		return idemdriver.Record{}, false, false
	}
	// Copied: the replay hands the header slices to a writer others may change.
	resp := *r.response
	resp.Header = http.Header(resp.Header).Clone()
	return idemdriver.Record{Scope: scope, Key: key, Method: r.method, Path: r.path, Fingerprint: r.fingerprint,
		State: idemdriver.StateSucceeded, Response: &resp, ExpiresAt: r.expiresAt}, r.opened, true
}

// put caches rec, a SUCCEEDED record; opened says that its response is the
// one replayed (opened by decide), not the store's.
func (rc *replayCache) put(scope, key string, rec idemdriver.Record, opened bool) {
	if rc == nil || rec.State != idemdriver.StateSucceeded || rec.Response == nil || !time.Now().Before(rec.ExpiresAt) {
		return
	}
	resp := *rec.Response
	resp.Header = http.Header(resp.Header).Clone()
	rc.c.Set(replayKey{scope, key}, &cachedRecord{method: rec.Method, path: rec.Path,
		fingerprint: rec.Fingerprint, response: &resp, opened: opened, expiresAt: rec.ExpiresAt})
}
