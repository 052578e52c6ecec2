package main

import (
	"net/http"

	"github.com/idemgo/idem/internal/service"
)

// ProblemTypeBase prefixes the type URI of every problem the demo itself
// sends; the fragment names the section of cmd/paymentsd/README.md that
// documents the kind. The middleware's own problems (missing-key,
// key-reused, request-in-flight, ...) keep idem's type URIs.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/cmd/paymentsd/README.md#"

// Problem kinds of the demo's own, beside service's (unauthorized,
// invalid-request, unsupported-media-type, not-found, unavailable,
// internal-error), one type URI each (RFC 9457 section 3.1.1).
const (
	problemMethodNotAllowed = "method-not-allowed"
	problemProviderError    = "provider-error"
	problemProviderTimeout  = "provider-timeout"
)

// svc writes the demo's answers and authenticates its requests.
var svc = &service.API{
	Name:            "paymentsd",
	ProblemTypeBase: ProblemTypeBase,
	ProblemTitles: map[string]string{
		problemMethodNotAllowed: "Method not allowed",
		problemProviderError:    "The payment provider failed",
		problemProviderTimeout:  "The payment provider did not answer in time",
	},
}

// invalidParam names one invalid field of a request and why (the
// "invalid-params" extension member of RFC 7807 section 3, the shape RFC
// 9457 section 3 describes for listing several problems at once).
type invalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// writeInvalidParams sends 400 invalid-request listing every invalid field.
func writeInvalidParams(w http.ResponseWriter, params []invalidParam) {
	detail := params[0].Name + ": " + params[0].Reason
	if len(params) > 1 {
		detail += " (and more: see invalid-params)"
	}
	p := svc.Problem(service.ProblemInvalidRequest, http.StatusBadRequest, detail)
	p.Extra = map[string]any{"invalid-params": params}
	p.Write(w)
}
