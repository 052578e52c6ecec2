package service

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/httpwrite"
)

// NewLogger returns the logger of --log-format on w: format "text" is
// slog's text handler, anything else (the flag's "json") slog's JSON
// handler, both with slog's defaults (level Info).
func NewLogger(w io.Writer, format string) *slog.Logger {
	if format == "text" {
		return slog.New(slog.NewTextHandler(w, nil))
	}
	return slog.New(slog.NewJSONHandler(w, nil))
}

// RequestInfo collects what the layers inside LogRequests learn about a
// request, for its log line.
type RequestInfo struct {
	// Merchant is the authenticated merchant, set by API.Authenticate; empty
	// when the request was not authenticated.
	Merchant string
	// Attrs are the service's own attributes, logged after "replayed" and
	// before "merchant".
	Attrs []slog.Attr
}

type requestInfoKey struct{}

// RequestInfoFrom returns the RequestInfo of the request whose context is
// ctx, or nil outside LogRequests.
func RequestInfoFrom(ctx context.Context) *RequestInfo {
	info, _ := ctx.Value(requestInfoKey{}).(*RequestInfo)
	return info
}

// LogRequests returns next wrapped to log one line per request, once next
// has returned, with the message "request", at level Info (Warn when the
// status is 500 or more), and these attributes:
//
//	method           string
//	path             string  the URL's path, without the query
//	status           int     the status sent; unanswered when next sent nothing
//	duration_ms      float   time in next, in milliseconds (to the microsecond)
//	bytes            int     the size of the body sent
//	idempotency_key  string  the Idempotency-Key as idem stores it (LoggedKey with storedKey)
//	replayed         bool    whether the answer was idem's replay
//	RequestInfo.Attrs...
//	merchant         string  RequestInfo.Merchant
//
// It never logs the Authorization header. unanswered is the status logged
// when next sent no answer at all: http.StatusOK is what net/http then
// sends if the client is still there; 0 says that nothing was sent.
// storedKey maps a client's key to the key idem stores (idem.Engine.StoredKey:
// its HMAC under KeyHashSecret, so no client key reaches the log); nil logs
// the key as sent.
func LogRequests(log *slog.Logger, unanswered int, storedKey func(string) string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		info := &RequestInfo{}
		rec := httpwrite.NewRecorder(w, false)
		next.ServeHTTP(rec, r.WithContext(context.WithValue(r.Context(), requestInfoKey{}, info)))
		if rec.Status == 0 {
			rec.Status = unanswered
		}
		level := slog.LevelInfo
		if rec.Status >= 500 {
			level = slog.LevelWarn
		}
		attrs := append([]slog.Attr{
			slog.String("method", r.Method),
			slog.String("path", r.URL.Path),
			slog.Int("status", rec.Status),
			slog.Float64("duration_ms", float64(time.Since(start).Microseconds())/1000),
			slog.Int64("bytes", rec.Bytes),
			slog.String("idempotency_key", LoggedKey(r, storedKey)),
			slog.Bool("replayed", rec.Header().Get(idem.HeaderReplayed) == "true"),
		}, info.Attrs...)
		log.LogAttrs(r.Context(), level, "request", append(attrs, slog.String("merchant", info.Merchant))...)
	})
}

// LoggedKey is the request's Idempotency-Key as idem stores it: unquoted,
// and passed through storedKey when it is not nil, so that `idem inspect
// --key` finds it (idem.Engine.StoredKey: hashed under KeyHashSecret). When
// the header does not parse (idem.ParseKey), its values joined by ", ",
// through storedKey too: nothing of a client's key is logged in plain. ""
// without the header.
func LoggedKey(r *http.Request, storedKey func(string) string) string {
	values := r.Header.Values(idem.HeaderKey)
	if len(values) == 0 {
		return ""
	}
	key, err := idem.ParseKey(values)
	if err != nil {
		key = strings.Join(values, ", ")
	}
	if storedKey != nil {
		return storedKey(key)
	}
	return key
}
