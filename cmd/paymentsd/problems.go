package main

import (
	"net/http"

	"github.com/idemgo/idem"
)

// ProblemTypeBase prefixes the type URI of every problem the demo itself
// sends; the fragment names the section of cmd/paymentsd/README.md that
// documents the kind. The middleware's own problems (missing-key,
// key-reused, request-in-flight, ...) keep idem's type URIs.
const ProblemTypeBase = "https://github.com/idemgo/idem/blob/main/cmd/paymentsd/README.md#"

// Problem kinds the demo sends, one type URI each (RFC 9457 section 3.1.1).
const (
	problemUnauthorized     = "unauthorized"
	problemInvalidRequest   = "invalid-request"
	problemUnsupportedMedia = "unsupported-media-type"
	problemNotFound         = "not-found"
	problemMethodNotAllowed = "method-not-allowed"
	problemProviderError    = "provider-error"
	problemProviderTimeout  = "provider-timeout"
	problemUnavailable      = "unavailable"
	problemInternal         = "internal-error"
)

var problemTitles = map[string]string{
	problemUnauthorized:     "Missing or invalid API key",
	problemInvalidRequest:   "The request is not valid",
	problemUnsupportedMedia: "Unsupported request body media type",
	problemNotFound:         "Not found",
	problemMethodNotAllowed: "Method not allowed",
	problemProviderError:    "The payment provider failed",
	problemProviderTimeout:  "The payment provider did not answer in time",
	problemUnavailable:      "Service unavailable",
	problemInternal:         "Internal error",
}

// invalidParam names one invalid field of a request and why (the
// "invalid-params" extension member of RFC 7807 section 3, the shape RFC
// 9457 section 3 describes for listing several problems at once).
type invalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// problem returns the problem details of one of the demo's kinds.
func problem(kind string, status int, detail string) idem.Problem {
	return idem.Problem{Type: ProblemTypeBase + kind, Title: problemTitles[kind], Status: status, Detail: detail}
}

// writeProblem sends the problem of kind as application/problem+json.
func writeProblem(w http.ResponseWriter, kind string, status int, detail string) {
	problem(kind, status, detail).Write(w)
}

// writeInvalidParams sends 400 invalid-request listing every invalid field.
func writeInvalidParams(w http.ResponseWriter, params []invalidParam) {
	detail := params[0].Name + ": " + params[0].Reason
	if len(params) > 1 {
		detail += " (and more: see invalid-params)"
	}
	p := problem(problemInvalidRequest, http.StatusBadRequest, detail)
	p.Extra = map[string]any{"invalid-params": params}
	p.Write(w)
}
