package httpread

import (
	"errors"
	"io"
	"net/http"
	"strings"
	"time"
)

// The request body (CONTRACT section 2): read whole, at most
// MaxRequestBytes, before the claim. A body over the limit is answered 413,
// and the answer must reach a client that is still sending: an HTTP/1.1
// server that closes a connection with unread bytes in it resets it (TCP
// RST), and the client may lose the answer with it (RFC 9112 section 9.6).
// So the rest of such a body is read and dropped, within DiscardBytes and
// DiscardTimeout, and the connection kept; past them, or when the client
// waits for "100 Continue" (which it never gets), the 413 says
// "Connection: close". HTTP/2 and HTTP/3 end the request's stream, not the
// connection: nothing is read or closed there.

// Body reads request bodies within their limits.
type Body struct {
	// Limit is the largest body read (idem's MaxRequestBytes).
	Limit int64
	// DiscardBytes and DiscardTimeout bound what is read and dropped of a
	// body over Limit so that its 413 reaches the client.
	DiscardBytes   int64
	DiscardTimeout time.Duration
}

// ErrTooLarge is Read's error for a body over the limit.
var ErrTooLarge = errors.New("request body too large")

// Read reads r's body, at most Limit bytes. Errors: ErrTooLarge for a body
// over the limit, the read's own for a body that could not be read to its
// end; either way what w still needs for the answer (Connection: close) is
// set.
func (m Body) Read(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return nil, nil
	}
	limit := m.Limit
	if r.ContentLength > limit {
		m.discardDeclared(w, r)
		return nil, ErrTooLarge
	}
	body, err := readAll(bodyBuffer(r.ContentLength, limit), io.LimitReader(r.Body, limit+1))
	switch {
	case err != nil:
		m.closeAfter(w, r) // what is left on the wire is no request
		return nil, err
	case int64(len(body)) > limit:
		// A body of unknown length (chunked) that crossed the limit.
		m.discard(w, r, m.DiscardBytes-1)
		return nil, ErrTooLarge
	}
	_ = r.Body.Close() // at its end: net/http reads nothing more
	return body, nil
}

// discardDeclared makes the 413 of a body declared over the limit readable:
// unread when the client waits for "100 Continue" (RFC 9110 section
// 10.1.1: it then sends no body, or the connection closes after the answer,
// RFC 9112 section 9.6) or when the declared length ends past
// MaxRequestBytes + DiscardBytes; else read to its end.
func (m Body) discardDeclared(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.ProtoMajor != 1:
		// HTTP/2 and 3: the server resets the stream once the answer is
		// sent (RST_STREAM NO_ERROR, RFC 9113 section 8.1); the connection
		// and its other streams go on.
	case expectsContinue(r), r.ContentLength-m.Limit > m.DiscardBytes:
		m.closeAfter(w, r)
	default:
		m.discard(w, r, r.ContentLength)
	}
}

// discard reads and drops the rest of r's body, at most n more bytes and
// for at most DiscardTimeout (the response controller's read deadline,
// where the server supports one), so that the client reads the 413 that
// follows on a connection kept open. A body that does not end within them
// (or cannot be read) is left, and the answer closes the connection.
func (m Body) discard(w http.ResponseWriter, r *http.Request, n int64) {
	if r.ProtoMajor != 1 {
		return // the stream's end, as in discardDeclared
	}
	rc := http.NewResponseController(w)
	deadline := rc.SetReadDeadline(time.Now().Add(m.DiscardTimeout)) == nil
	// MaxBytesReader tells net/http's own writer that the body ran past n:
	// it then closes the connection after a pause for the client to read.
	_, err := io.Copy(io.Discard, http.MaxBytesReader(w, r.Body, max(n, 0)))
	if err != nil {
		m.closeAfter(w, r)
		return
	}
	_ = r.Body.Close()
	if deadline {
		_ = rc.SetReadDeadline(time.Time{}) // the body is read: no more reads wait on it
	}
}

// closeAfter asks that r's HTTP/1.x connection close after the answer: a
// body not read to its end leaves bytes that are no request. The read
// deadline bounds what net/http still reads of a short body after the
// answer, hoping to reuse the connection, from a client that sends nothing
// more (one that waits for "100 Continue"). Never on HTTP/2, where net/http
// would take Connection: close for the whole connection's end.
func (m Body) closeAfter(w http.ResponseWriter, r *http.Request) {
	if r.ProtoMajor == 1 {
		w.Header().Set("Connection", "close")
		_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(m.DiscardTimeout))
	}
}

// expectsContinue reports whether r's client waits for "100 Continue"
// before it sends the body (RFC 9110 section 10.1.1), which net/http sends
// at the body's first read.
func expectsContinue(r *http.Request) bool {
	if !r.ProtoAtLeast(1, 1) {
		return false
	}
	for _, v := range r.Header["Expect"] {
		for e := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(e), "100-continue") {
				return true
			}
		}
	}
	return false
}

// bodyBuffer is the buffer readBody starts with for a body of declared
// length n (-1: unknown) under limit: n bytes and one to spare for the read
// that meets the end, so a body within presizedBody takes one allocation
// where io.ReadAll starts at 512 bytes and grows; nil for an unknown length
// or one over the limit. A longer body's buffer grows as it arrives: a
// client that declares a megabyte and sends nothing holds no megabyte.
func bodyBuffer(n, limit int64) []byte {
	if n < 0 || n > limit {
		return nil
	}
	return make([]byte, 0, min(n, presizedBody)+1)
}

// presizedBody is the most of a declared length bodyBuffer allocates
// before the bytes arrive (64 KiB: a payment's JSON is a few hundred).
const presizedBody = 64 << 10

// readAll is io.ReadAll appending to b.
func readAll(b []byte, r io.Reader) ([]byte, error) {
	for {
		if len(b) == cap(b) {
			b = append(b, 0)[:len(b)] // grows as append does
		}
		n, err := r.Read(b[len(b):cap(b)])
		b = b[:len(b)+n]
		if err == io.EOF {
			return b, nil
		}
		if err != nil {
			return b, err
		}
	}
}
