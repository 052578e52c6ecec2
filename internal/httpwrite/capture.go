// Package httpwrite writes the HTTP answers of idem's middleware: the
// handler's response held until its outcome is recorded (Capture), a
// stored response replayed (WriteResponse), RFC 9457 problem details
// (Problem), the HTTP-dates of a key's expiry (Dates) and a pass-through
// recorder (Recorder). It knows nothing of the protocol.
package httpwrite

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
)

// Capture holds a handler's response until its outcome is recorded
// (CONTRACT section 6), then Send writes it to the client.
type Capture struct {
	w      http.ResponseWriter
	header http.Header // what the handler sees
	sent   http.Header // the headers as they were at WriteHeader
	// status is the first final status the handler wrote, valid or not
	// (FinalStatus), once wroteHeader.
	status      int
	wroteHeader bool
	body        bytes.Buffer
}

func NewCapture(w http.ResponseWriter) *Capture {
	return &Capture{w: w, header: http.Header{}}
}

func (c *Capture) Header() http.Header { return c.header }

// WriteHeader takes the first status that is not informational (1xx, RFC
// 9110 section 15.2: never forwarded, the response is held until recorded)
// as the final one, and ignores the later ones, as net/http does. It never
// panics: a status that is no final status (FinalStatus) is kept as written
// for the caller to refuse (the root package's httpJob.Run), where net/http would panic
// and drop the connection.
func (c *Capture) WriteHeader(status int) {
	if c.wroteHeader || (status >= 100 && status < 200) {
		return
	}
	c.status, c.wroteHeader = status, true
	c.sent = c.header.Clone()
}

func (c *Capture) Write(b []byte) (int, error) {
	if !c.wroteHeader {
		c.WriteHeader(http.StatusOK)
	}
	return c.body.Write(b)
}

func (c *Capture) Flush() {}

// Hijack refuses: idem could not record a hijacked answer.
func (c *Capture) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return nil, nil, fmt.Errorf("idem: a protected handler cannot hijack the connection, its response is recorded and replayed: %w", http.ErrNotSupported)
}

func (c *Capture) Unwrap() http.ResponseWriter { return c.w }

// Status is the final status written, 200 when none was.
func (c *Capture) Status() int {
	if !c.wroteHeader {
		return http.StatusOK
	}
	return c.status
}

// FinalStatus reports whether status is one a response may end with: 200 to
// 599 (RFC 9110 section 15: 1xx are informational, and no class is defined
// past 5xx). net/http panics on a status under 100 or over 999.
func FinalStatus(status int) bool { return status >= 200 && status <= 599 }

// Reset forgets what the handler wrote, for idem to answer in its place.
func (c *Capture) Reset() {
	c.header, c.sent, c.status, c.wroteHeader = http.Header{}, nil, 0, false
	c.body.Reset()
}

// SentHeader is the header as it was at WriteHeader, without trailers.
func (c *Capture) SentHeader() http.Header {
	h := c.header
	if c.sent != nil {
		h = c.sent
	}
	declared := c.declaredTrailers(h)
	if len(declared) == 0 && !hasTrailerKeys(h) {
		return h
	}
	out := http.Header{}
	for k, v := range h {
		if !declared[k] && !strings.HasPrefix(k, http.TrailerPrefix) {
			out[k] = v
		}
	}
	return out
}

func (c *Capture) declaredTrailers(h http.Header) map[string]bool {
	var names map[string]bool
	for _, v := range h.Values("Trailer") {
		for _, name := range strings.Split(v, ",") {
			if name = strings.TrimSpace(name); name != "" {
				if names == nil {
					names = map[string]bool{}
				}
				names[http.CanonicalHeaderKey(name)] = true
			}
		}
	}
	return names
}

func hasTrailerKeys(h http.Header) bool {
	for k := range h {
		if strings.HasPrefix(k, http.TrailerPrefix) {
			return true
		}
	}
	return false
}

// Trailers are the trailers the handler declared or set (nil for none),
// by their canonical names.
func (c *Capture) Trailers() http.Header {
	var t http.Header // nil, allocated at the first trailer: most responses have none
	add := func(name string, v []string) {
		if t == nil {
			t = http.Header{}
		}
		t[name] = v
	}
	for name := range c.declaredTrailers(c.headerNow()) {
		if v := c.header[name]; len(v) > 0 {
			add(name, v)
		}
	}
	for k, v := range c.header {
		if name, ok := strings.CutPrefix(k, http.TrailerPrefix); ok && len(v) > 0 {
			add(http.CanonicalHeaderKey(name), v)
		}
	}
	return t
}

// headerNow is the header as sent, or as it stands when nothing was sent
// yet.
func (c *Capture) headerNow() http.Header {
	if c.sent != nil {
		return c.sent
	}
	return c.header
}

// Send writes the captured response to the client; extra holds idem's own
// field lines for this answer (Preference-Applied), kept beside the
// handler's own lines of those fields.
func (c *Capture) Send(extra http.Header) {
	h, sent := c.w.Header(), c.SentHeader()
	for k, v := range sent {
		h[k] = v
	}
	for k, v := range extra {
		h[k] = append(append([]string(nil), sent[k]...), v...)
	}
	for name, v := range c.Trailers() {
		h[http.TrailerPrefix+name] = v
	}
	WriteResponse(c.w, c.Status(), c.body.Bytes())
}

// Body is what the handler wrote.
func (c *Capture) Body() []byte { return c.body.Bytes() }

// WriteResponse writes status and body under w's header. Trailers need
// chunking: no Content-Length with them (RFC 9110 section 8.6).
func WriteResponse(w http.ResponseWriter, status int, body []byte) {
	bodyAllowed := status >= 200 && status != http.StatusNoContent && status != http.StatusNotModified
	if bodyAllowed && w.Header().Get("Content-Length") == "" && !hasTrailerKeys(w.Header()) {
		w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	}
	w.WriteHeader(status)
	if bodyAllowed {
		_, _ = w.Write(body)
	}
	_ = http.NewResponseController(w).Flush()
}
