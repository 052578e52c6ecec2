package idem

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/httpread"
)

// wait is how long r waits for its key's execution in flight: its Prefer
// wait (RFC 7240 section 4.3), at most MaxWait, else Config.Wait; asked
// reports the Prefer wait's, to be named in Preference-Applied (section 3)
// when the request waits.
func (m *Middleware) wait(r *http.Request) (time.Duration, bool) {
	if m.cfg.MaxWait == 0 {
		return 0, false
	}
	if d, ok := httpread.PreferredWait(r); ok {
		return min(d, m.cfg.MaxWait), d > 0
	}
	return m.cfg.Wait, false
}

// request reads r's claim (its key the stored one), the client's key and
// the body; w carries what the body's reading asks of the connection.
func (m *Middleware) request(w http.ResponseWriter, r *http.Request, values []string) (idemdriver.ClaimParams, string, []byte, *Problem) {
	refuse := func(kind error, detail string) (idemdriver.ClaimParams, string, []byte, *Problem) {
		pr := ProblemFor(kind, detail)
		return idemdriver.ClaimParams{}, "", nil, &pr
	}
	key, err := ParseKey(values)
	if errors.Is(err, ErrMissingKey) {
		return refuse(ErrMissingKey, fmt.Sprintf("this endpoint requires an %s header: a unique value per logical request, sent again unchanged on every retry", HeaderKey))
	} else if err != nil {
		return refuse(ErrInvalidKey, strings.TrimPrefix(err.Error(), "idem: "))
	}
	scope, err := m.cfg.Scope(r)
	if err != nil || scope == "" {
		// The error is the server's: logged, never sent.
		if err != nil {
			m.cfg.Logger.InfoContext(r.Context(), "idem: Scope refused the request", "err", err)
		}
		return refuse(ErrMissingScope, "this request names no owner for its key; authenticate first")
	}
	if why := unstorableScope(scope); why != "" {
		m.cfg.Logger.ErrorContext(r.Context(), "idem: Scope returned a scope no store can hold", "reason", why, "length", len(scope))
		return refuse(ErrScopeUnstorable, "the server could not scope this request")
	}
	path := r.URL.EscapedPath()
	if len(path) > MaxPathLength {
		return refuse(ErrPathTooLong, fmt.Sprintf("the request path is %d bytes; a protected request's path may have at most %d", len(path), MaxPathLength))
	}
	body, err := m.body.Read(w, r)
	if errors.Is(err, httpread.ErrTooLarge) {
		return refuse(ErrRequestTooLarge, fmt.Sprintf("the request body exceeds %d bytes", m.cfg.MaxRequestBytes))
	} else if err != nil {
		return refuse(ErrBodyUnreadable, "the request body could not be read to its end; nothing was processed, send the request again with the same key")
	}
	return m.g.claimParams(scope, key, r.Method, path, m.cfg.Fingerprint(r, body)), key, body, nil
}
