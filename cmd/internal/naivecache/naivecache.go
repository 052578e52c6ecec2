// Package naivecache is the idempotency middleware of the common blog
// article, a response cache in Redis, kept for comparison only: cmd/paymentsd
// runs it under --naive and cmd/idembench measures it beside idem.
//
//	GET key -> hit: replay the stored response
//	        -> miss: run the handler, then SET key response EX ttl
//
// It takes no lock, keeps no fingerprint and fails open: concurrent
// duplicates all run (cmd/paymentsd/naive.go lists every failure mode).
package naivecache

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httpwrite"
)

// Cache is what the middleware needs of Redis.
type Cache interface {
	// Get returns the stored value of key; found is false on a miss.
	Get(ctx context.Context, key string) (value []byte, found bool, err error)
	// Set stores value under key for ttl.
	Set(ctx context.Context, key string, value []byte, ttl time.Duration) error
}

// Redis is the Cache on a Redis server (go-redis).
type Redis struct{ Client *redis.Client }

// OpenRedis connects to the Redis server at url
// (redis://[user:password@]host:port/db) and checks that it answers (PING,
// within 5 s).
func OpenRedis(ctx context.Context, url string) (*Redis, error) {
	opt, err := redis.ParseURL(url)
	if err != nil {
		return nil, fmt.Errorf("redis: %w", err)
	}
	c := redis.NewClient(opt)
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := c.Ping(pctx).Err(); err != nil {
		return nil, errors.Join(fmt.Errorf("redis %s: %w", opt.Addr, err), c.Close())
	}
	return &Redis{Client: c}, nil
}

// Get is Cache.Get: redis.Nil is a miss.
func (c *Redis) Get(ctx context.Context, key string) ([]byte, bool, error) {
	b, err := c.Client.Get(ctx, key).Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	return b, true, nil
}

// Set is Cache.Set (SET key value EX ttl).
func (c *Redis) Set(ctx context.Context, key string, value []byte, ttl time.Duration) error {
	return c.Client.Set(ctx, key, value, ttl).Err()
}

// Close closes the client.
func (c *Redis) Close() error { return c.Client.Close() }

// Response is a response as the middleware stores it (JSON).
type Response struct {
	Status int         `json:"status"`
	Header http.Header `json:"header"`
	Body   []byte      `json:"body"`
}

// ReplayedHeaders are the response headers the cache keeps.
var ReplayedHeaders = []string{"Content-Type", "Location"}

// Config configures Middleware.
type Config struct {
	// Cache stores the responses. Required.
	Cache Cache
	// TTL is how long a response is kept. Required (> 0).
	TTL time.Duration
	// Key returns the cache key of a request, "" for a request the cache
	// does not touch (it then just runs). Required.
	Key func(r *http.Request) string
	// Log, when set, receives a warning for every failed GET (the request
	// then runs unprotected) and SET (a retry will run again); nil ignores
	// them.
	Log *slog.Logger
}

// Middleware is the article's middleware: on a request with a cache key it
// replays the cached response when there is one (with Idempotency-Replayed:
// true); otherwise it runs next and caches its response when it is not a
// 5xx. A cache error on GET runs next anyway (fail open); one on SET is
// logged and ignored.
func Middleware(cfg Config, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cacheKey := cfg.Key(r)
		if cacheKey == "" {
			next.ServeHTTP(w, r)
			return
		}
		b, found, err := cfg.Cache.Get(r.Context(), cacheKey)
		if err != nil && cfg.Log != nil {
			cfg.Log.WarnContext(r.Context(), "naive cache: GET failed; running the request unprotected", "err", err)
		}
		var cached Response
		if found && json.Unmarshal(b, &cached) == nil {
			for k, v := range cached.Header {
				w.Header()[k] = v
			}
			w.Header().Set(idem.HeaderReplayed, "true")
			w.WriteHeader(cached.Status)
			_, _ = w.Write(cached.Body)
			return
		}
		rec := httpwrite.NewRecorder(w, true)
		next.ServeHTTP(rec, r)
		if rec.Status == 0 || rec.Status >= 500 {
			return
		}
		stored := Response{Status: rec.Status, Header: http.Header{}, Body: rec.Body.Bytes()}
		for _, h := range ReplayedHeaders {
			if v := rec.Header().Values(h); len(v) > 0 {
				stored.Header[h] = v
			}
		}
		value, err := json.Marshal(stored)
		if err == nil {
			// Not the request's context: the client may have gone.
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
			err = cfg.Cache.Set(ctx, cacheKey, value, cfg.TTL)
			cancel()
		}
		if err != nil && cfg.Log != nil {
			cfg.Log.WarnContext(r.Context(), "naive cache: SET failed; a retry will run again", "err", err)
		}
	})
}
