package browser

import (
	"net/http"

	"github.com/rs/cors"

	"github.com/idemgo/idem"
)

// ExposedHeaders are the response headers a page must be allowed to read
// (Access-Control-Expose-Headers; Fetch standard, section 3.2.3) to act on
// idem's answers: Idempotent-Replayed (a replay), Retry-After (when to send
// a 409 request-in-flight or a 503 again), Idempotency-Key (the key, which
// idem echoes), Idempotency-Key-Expires (until when the key is remembered)
// and Location (a created resource). Without them
// fetch() sees only the CORS-safelisted response headers, and
// Headers.get returns null for these.
func ExposedHeaders() []string {
	return []string{idem.HeaderReplayed, "Retry-After", idem.HeaderKey, idem.HeaderKeyExpires, "Location"}
}

// WithCORS returns next protected by mw, inside rs/cors' middleware for the
// given origins:
//
//	cors -> idem -> next
//
// The order matters. Inside the CORS middleware, every answer idem makes
// (the replay of a recorded response, a 409, a 422, a problem) carries the
// CORS headers, added before idem runs. Outside it, a replay carries only
// what was recorded (Options.Replay.Headers), without
// Access-Control-Allow-Origin, and the browser refuses it to the page:
// fetch() rejects, although the server answered.
//
// The preflight (OPTIONS) is answered by rs/cors and never reaches idem,
// which protects POST and PATCH only. Idempotency-Key is not a
// CORS-safelisted request header, so the preflight must allow it
// (AllowedHeaders).
func WithCORS(mw *idem.Middleware, origins []string, next http.Handler) http.Handler {
	c := cors.New(cors.Options{
		AllowedOrigins: origins,
		AllowedMethods: []string{http.MethodPost, http.MethodPatch},
		AllowedHeaders: []string{"Content-Type", idem.HeaderKey},
		ExposedHeaders: ExposedHeaders(),
	})
	return c.Handler(mw.Handler(next))
}
