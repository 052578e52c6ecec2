// Package idemclient is the client-side half of idem: an http.RoundTripper
// that sends POST and PATCH requests with an Idempotency-Key
// (draft-ietf-httpapi-idempotency-key-header) and retries them with that
// same key when the server answers "in flight" (409), asks to slow down
// (429, 502, 503, 504) or the connection fails, so the end user does not
// see a conflict and the request runs at most once on an idem server. A
// key whose request was in flight on a server that died is held until its
// lease runs out (30 s by default); the default budget (60 attempts within
// 60 s) rides that out (docs/deployment.md, "Deploys and restarts").
//
//	tr, err := idemclient.New(idemclient.Config{})
//	if err != nil {
//		log.Fatal(err)
//	}
//	client := &http.Client{Transport: tr}
//	resp, err := client.Post(url, "application/json", strings.NewReader(body))
//	if err != nil {
//		log.Fatal(err)
//	}
//	defer resp.Body.Close()
//	log.Println(idemclient.KeyFromResponse(resp), idemclient.Replayed(resp))
//
// # The key
//
// A request whose method is in Config.KeyMethods (POST, PATCH) and that has
// no Idempotency-Key gets one from Config.NewKey (a UUIDv7) and keeps it on
// every retry. A key the caller set is kept as is, and a request of any
// method that carries a key is retried with it. The caller's request is
// never modified (http.RoundTripper forbids it): each attempt is a clone,
// and KeyFromResponse reads the key back from resp.Request. A caller that
// may give up and try again later (a crash, a closed laptop) should set the
// key itself and store it with the order, so the later try reuses it.
//
// Requests without a key are retried only when their method is in
// Config.RetryMethods, the idempotent methods of RFC 9110 section 9.2.2 (GET,
// HEAD, PUT, DELETE, OPTIONS) by default; every other request is sent once.
//
// # What is retried
//
// DefaultCheckRetry retries network errors (refused, reset, EOF before the
// response, an attempt past Config.AttemptTimeout) and the statuses 409,
// 429, 502, 503 and 504. It never retries 400, 401, 403, 404 or 422 (idem's
// key-reused: the same key with another body), nor any other status.
// Replace it with Config.CheckRetry.
//
// # How long it waits
//
// FullJitter: before retry n it waits a random time in
// [0, min(MaxDelay, BaseDelay·2^(n-1))) (100 ms doubling up to 10 s by
// default), or the response's Retry-After (RFC 9110 section 10.2.3, seconds
// or an HTTP-date), capped by Config.MaxRetryAfter (5 s). idem's 409 sends
// its in-flight delay (idem.Options.Engine.RetryAfter.InFlight, 1 s by default),
// never more than what is left of the first request's lease. Replace the
// policy with Config.Backoff.
//
// # When it stops
//
// After Config.MaxAttempts attempts (60), or when the next wait would end
// past Config.MaxElapsed (60 s after the first attempt began) or the request
// context's deadline (an http.Client Timeout included): it then returns the
// last response as is (a 409 or 503 the caller can read), or the last
// network error. When the request context ends it stops at once, even
// mid-wait, and returns an *Error wrapping the context's error and the last
// attempt's. Every error RoundTrip returns is an *Error carrying the key, so
// the caller can try again later with the same key: after a network error
// the request may have run.
//
// # The request body
//
// Each attempt gets a fresh copy of the body: from req.GetBody, which
// http.NewRequest sets for *bytes.Buffer, *bytes.Reader and *strings.Reader
// bodies, or else from a copy read into memory before the first attempt, up
// to Config.MaxBufferedBody (10 MiB). A longer body without GetBody is
// streamed once and never retried (its key is still sent); set GetBody on
// such requests to have them retried.
//
// # Hooks
//
// Config.OnAttempt sees every attempt (for metrics), Config.OnRetry every
// decided retry with its wait (for logs), and Config.Sleep performs the
// waits (tests replace it to record them without waiting).
package idemclient
