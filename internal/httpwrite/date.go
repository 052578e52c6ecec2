package httpwrite

import (
	"net/http"
	"sync/atomic"
	"time"
)

// Dates formats HTTP-dates and keeps the last one: the retries of one key
// (and the keys of one second) carry the same expiry. The zero Dates is
// ready; it is safe for concurrent use.
type Dates struct{ last atomic.Pointer[httpDate] }

// httpDate is a second as an RFC 9110 HTTP-date (section 5.6.7).
type httpDate struct {
	unix int64
	text string
}

// Format formats t as an HTTP-date (http.TimeFormat, in UTC).
func (d *Dates) Format(t time.Time) string {
	unix := t.Unix()
	if last := d.last.Load(); last != nil && last.unix == unix {
		return last.text
	}
	next := &httpDate{unix: unix, text: t.UTC().Format(http.TimeFormat)}
	d.last.Store(next)
	return next.text
}
