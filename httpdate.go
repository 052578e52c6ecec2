package idem

import (
	"net/http"
	"time"
)

// httpDate is t's second as an RFC 9110 HTTP-date (section 5.6.7).
type httpDate struct {
	unix int64
	text string
}

// httpDate formats t as an HTTP-date (http.TimeFormat, in UTC), the last
// one kept.
func (m *Middleware) httpDate(t time.Time) string {
	unix := t.Unix()
	if d := m.lastDate.Load(); d != nil && d.unix == unix {
		return d.text
	}
	d := &httpDate{unix: unix, text: t.UTC().Format(http.TimeFormat)}
	m.lastDate.Store(d)
	return d.text
}
