package main

import (
	"net/http"

	"github.com/idemgo/idem/cmd/internal/service"
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

// invalidParam names one invalid field of a request and why
// (service.InvalidParam).
type invalidParam = service.InvalidParam

// writeInvalidParams sends 400 invalid-request listing every invalid field.
func writeInvalidParams(w http.ResponseWriter, params []invalidParam) {
	svc.WriteInvalidParams(w, invalidParamsDetail(params), params)
}

// invalidParamsDetail is the detail of a 400 listing params: the first, and
// a pointer to the others.
func invalidParamsDetail(params []invalidParam) string {
	detail := params[0].Name + ": " + params[0].Reason
	if len(params) > 1 {
		detail += " (and more: see invalid-params)"
	}
	return detail
}
