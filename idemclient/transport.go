package idemclient

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// Transport is an http.RoundTripper that sends POST and PATCH requests with
// an Idempotency-Key and retries them, with that same key, through 409s,
// overload statuses and network failures. Create it with New; it is safe for
// concurrent use, and its zero value is not usable.
type Transport struct {
	cfg          Config
	keyMethods   map[string]bool
	retryMethods map[string]bool
}

var _ http.RoundTripper = (*Transport)(nil)

// New validates cfg (after WithDefaults) and returns the Transport. The
// error names every invalid field. Use it as an http.Client's Transport:
//
//	tr, err := idemclient.New(idemclient.Config{})
//	if err != nil {
//		log.Fatal(err)
//	}
//	client := &http.Client{Transport: tr}
func New(cfg Config) (*Transport, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, keyMethods: map[string]bool{}, retryMethods: map[string]bool{}}
	for _, m := range cfg.KeyMethods {
		t.keyMethods[strings.ToUpper(m)] = true
	}
	for _, m := range cfg.RetryMethods {
		t.retryMethods[strings.ToUpper(m)] = true
	}
	return t, nil
}

// AttemptInfo describes one finished attempt, for Config.OnAttempt.
type AttemptInfo struct {
	// Request is the attempt's request: a clone of the caller's, carrying
	// the key. Read only.
	Request *http.Request
	// Key is the Idempotency-Key field value sent, "" for a request without.
	Key string
	// Attempt is the attempt's number, 1 for the first.
	Attempt int
	// Response is the attempt's response, nil when Err is set. Its body must
	// not be read or closed.
	Response *http.Response
	// Status is Response.StatusCode, 0 when Err is set.
	Status int
	// Err is the attempt's error (a network error; one wrapping
	// ErrAttemptTimeout; the context's error), nil when a response came.
	Err error
	// Duration is the time from sending the attempt to its response headers
	// (or its error).
	Duration time.Duration
}

// RetryInfo describes a decided retry, for Config.OnRetry: the attempt that
// is retried, and the wait before the next one.
type RetryInfo struct {
	AttemptInfo
	// Wait is the time the Transport is about to sleep (Config.Sleep)
	// before attempt number Attempt+1.
	Wait time.Duration
}

// Error is the error type of every error RoundTrip returns (an http.Client
// wraps it in a *url.Error; reach it with errors.As). It carries the key,
// so the caller can try again later with the same key: after a network
// error the request may have run.
type Error struct {
	// Key is the Idempotency-Key field value sent, "" for a request without.
	Key string
	// Attempts is the number of attempts made (0 when none could be made).
	Attempts int
	// Status is the status of the last response received and discarded
	// (when the context ended during the wait that followed it), else 0.
	Status int
	// Err is why it stopped: the last attempt's error, or the context's
	// error (or CheckRetry's) joined with the last attempt's error.
	Err error
}

func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("idemclient: ")
	if e.Attempts == 1 {
		b.WriteString("1 attempt")
	} else {
		fmt.Fprintf(&b, "%d attempts", e.Attempts)
	}
	if e.Key != "" {
		fmt.Fprintf(&b, ", %s %q", HeaderKey, e.Key)
	}
	if e.Status != 0 {
		fmt.Fprintf(&b, ", last status %d", e.Status)
	}
	fmt.Fprintf(&b, ": %v", e.Err)
	return b.String()
}

// Unwrap returns Err, so errors.Is(err, context.Canceled),
// errors.Is(err, syscall.ECONNREFUSED) and the like see through.
func (e *Error) Unwrap() error { return e.Err }

// CloseIdleConnections closes the idle connections of the underlying
// Transport when it has such a method (http.Client.CloseIdleConnections
// calls it).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.cfg.Transport.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// RoundTrip sends req, retrying as Config says, and returns the first
// response that is not retried, or the last one when the retries run out
// (attempts, MaxElapsed, or the request context's deadline). It never
// modifies req: each attempt sends req.Clone, with the Idempotency-Key added
// when req has none and its method is in KeyMethods (the same key on every
// attempt; KeyFromResponse reads it back), and a fresh copy of the body
// (req.GetBody, or a buffered copy of at most MaxBufferedBody bytes).
// Response bodies discarded before a retry are drained (at most
// MaxDrainBytes) and closed, so their connections are reused.
//
// It returns an error only when no response is returned: an *Error wrapping
// the last attempt's error, the context's error when the request context
// ended (at once, even mid-wait), CheckRetry's error, NewKey's, GetBody's,
// or the request body's read or Close error. req.Body is closed in every
// case.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	key, addKey := "", false
	if v := req.Header.Values(HeaderKey); len(v) > 0 {
		key = v[0]
	} else if t.keyMethods[req.Method] {
		k, err := t.cfg.NewKey()
		if err != nil {
			return nil, &Error{Err: errors.Join(fmt.Errorf("generating the %s: %w", HeaderKey, err), closeBody(req))}
		}
		key, addKey = k, true
	}
	maxAttempts := 1
	if key != "" || t.retryMethods[req.Method] {
		maxAttempts = t.cfg.MaxAttempts
	}
	body, err := t.prepareBody(req, maxAttempts > 1)
	if err != nil {
		return nil, &Error{Key: key, Err: err}
	}
	if !body.rewindable {
		maxAttempts = 1
	}

	stopAt := time.Now().Add(t.cfg.MaxElapsed)
	if dl, ok := ctx.Deadline(); ok && dl.Before(stopAt) {
		stopAt = dl
	}
	next := body.first
	for attempt := 1; ; attempt++ {
		actx, timer := t.attemptContext(ctx)
		r := req.Clone(actx)
		if addKey {
			if r.Header == nil {
				r.Header = http.Header{}
			}
			r.Header.Set(HeaderKey, key)
		}
		r.Body, r.GetBody = next, body.get
		began := time.Now()
		resp, err := t.send(ctx, r, timer)
		info := AttemptInfo{Request: r, Key: key, Attempt: attempt, Response: resp, Err: err, Duration: time.Since(began)}
		if resp != nil {
			info.Status = resp.StatusCode
		}
		if t.cfg.OnAttempt != nil {
			t.cfg.OnAttempt(info)
		}

		retry, checkErr := t.cfg.CheckRetry(ctx, resp, err)
		if checkErr != nil {
			t.discard(resp)
			return nil, &Error{Key: key, Attempts: attempt, Status: info.Status, Err: join(checkErr, err)}
		}
		if !retry || attempt >= maxAttempts {
			return t.finish(resp, err, key, attempt)
		}
		wait := max(t.cfg.Backoff(attempt, resp), 0)
		if time.Now().Add(wait).After(stopAt) {
			return t.finish(resp, err, key, attempt)
		}
		if t.cfg.OnRetry != nil {
			t.cfg.OnRetry(RetryInfo{AttemptInfo: info, Wait: wait})
		}
		t.discard(resp)
		if err := t.cfg.Sleep(ctx, wait); err != nil {
			return nil, &Error{Key: key, Attempts: attempt, Status: info.Status, Err: join(err, info.Err)}
		}
		if next, err = body.get(); err != nil {
			return nil, &Error{Key: key, Attempts: attempt, Err: fmt.Errorf("rewinding the request body (GetBody): %w", err)}
		}
	}
}

// finish returns an attempt's outcome to the caller.
func (t *Transport) finish(resp *http.Response, err error, key string, attempts int) (*http.Response, error) {
	if err != nil {
		return nil, &Error{Key: key, Attempts: attempts, Err: err}
	}
	return resp, nil
}

// join reports why the retries stopped (cause) and the last attempt's error,
// once when they are the same error.
func join(cause, last error) error {
	if last == nil || errors.Is(last, cause) {
		return cause
	}
	return errors.Join(cause, last)
}

// requestBody gives each attempt a fresh copy of a request body.
type requestBody struct {
	first      io.ReadCloser                 // the first attempt's body
	get        func() (io.ReadCloser, error) // later attempts' bodies; nil when not rewindable
	rewindable bool
}

func noBody() (io.ReadCloser, error) { return http.NoBody, nil }

// prepareBody makes req's body rewindable: through req.GetBody when set,
// else by buffering at most MaxBufferedBody bytes (only when the request
// may be retried). A longer body is streamed once, unbuffered beyond the
// bytes read, and not rewindable.
func (t *Transport) prepareBody(req *http.Request, mayRetry bool) (requestBody, error) {
	switch {
	case req.Body == nil || req.Body == http.NoBody:
		return requestBody{first: req.Body, get: noBody, rewindable: true}, nil
	case req.GetBody != nil:
		return requestBody{first: req.Body, get: req.GetBody, rewindable: true}, nil
	case !mayRetry || t.cfg.MaxBufferedBody < 0:
		return requestBody{first: req.Body}, nil
	}
	buf, err := io.ReadAll(io.LimitReader(req.Body, t.cfg.MaxBufferedBody+1))
	if err != nil {
		return requestBody{}, fmt.Errorf("reading the request body: %w", errors.Join(err, req.Body.Close()))
	}
	if int64(len(buf)) > t.cfg.MaxBufferedBody {
		rest := req.Body
		return requestBody{first: struct {
			io.Reader
			io.Closer
		}{io.MultiReader(bytes.NewReader(buf), rest), rest}}, nil
	}
	// As net/http does, a body whose Close fails is not sent.
	if err := req.Body.Close(); err != nil {
		return requestBody{}, fmt.Errorf("closing the request body: %w", err)
	}
	get := func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(buf)), nil }
	first, _ := get()
	return requestBody{first: first, get: get, rewindable: true}, nil
}

// attemptContext returns the context of one attempt: ctx itself, or with
// AttemptTimeout a child that a timer cancels until the response headers
// arrive.
func (t *Transport) attemptContext(ctx context.Context) (context.Context, *attemptTimer) {
	if t.cfg.AttemptTimeout <= 0 {
		return ctx, nil
	}
	actx, cancel := context.WithCancel(ctx)
	return actx, &attemptTimer{timer: time.AfterFunc(t.cfg.AttemptTimeout, cancel), cancel: cancel}
}

type attemptTimer struct {
	timer  *time.Timer
	cancel context.CancelFunc
}

// send makes one attempt. With an attempt timer, a response that came in
// time keeps its context alive until its body is closed.
func (t *Transport) send(ctx context.Context, r *http.Request, at *attemptTimer) (*http.Response, error) {
	resp, err := t.cfg.Transport.RoundTrip(r)
	if at == nil {
		return resp, err
	}
	if !at.timer.Stop() { // the timer fired: the attempt ran out of time
		at.cancel()
		if resp != nil {
			// The late response is dropped unread: its Close error concerns
			// nobody, and the attempt's error below says what happened.
			_ = resp.Body.Close()
			resp = nil
		}
		if ctx.Err() != nil && err != nil {
			return nil, err
		}
		if err == nil {
			return nil, fmt.Errorf("%w after %s", ErrAttemptTimeout, t.cfg.AttemptTimeout)
		}
		return nil, fmt.Errorf("%w after %s: %w", ErrAttemptTimeout, t.cfg.AttemptTimeout, err)
	}
	if err != nil {
		at.cancel()
		return nil, err
	}
	body := &cancelOnClose{ReadCloser: resp.Body, cancel: at.cancel}
	if w, ok := resp.Body.(io.ReadWriteCloser); ok {
		resp.Body = &cancelOnCloseRW{cancelOnClose: body, Writer: w}
	} else {
		resp.Body = body
	}
	return resp, nil
}

// cancelOnClose ends an attempt's context when its body is closed.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelOnClose) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}

// cancelOnCloseRW keeps the io.Writer of a 101 Switching Protocols body;
// Read and Close are cancelOnClose's.
type cancelOnCloseRW struct {
	*cancelOnClose
	io.Writer
}

// discard drains (at most MaxDrainBytes) and closes a response that is not
// returned, so its connection can be reused.
func (t *Transport) discard(resp *http.Response) {
	if resp == nil || resp.Body == nil {
		return
	}
	if t.cfg.MaxDrainBytes > 0 {
		_, _ = io.CopyN(io.Discard, resp.Body, t.cfg.MaxDrainBytes)
	}
	// The response is not returned: a drain or Close error only costs the
	// connection, which the underlying Transport then does not reuse.
	_ = resp.Body.Close()
}

// closeBody closes req's body, if any, and returns its Close error.
func closeBody(req *http.Request) error {
	if req.Body == nil {
		return nil
	}
	return req.Body.Close()
}
