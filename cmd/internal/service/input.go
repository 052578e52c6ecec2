package service

import (
	"errors"
	"net/http"
	"slices"
)

// ErrUnsupportedMedia is wrapped by a service's body parser for a
// Content-Type it does not read; WriteInputError answers it 415.
var ErrUnsupportedMedia = errors.New("unsupported media type")

// InvalidParam names one invalid field of a request and why (the
// "invalid-params" extension member of RFC 7807 section 3, the shape RFC
// 9457 section 3 describes for listing several problems at once).
type InvalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// InputError is a request body that is not valid: malformed as a whole
// (Detail) or with invalid fields (Params, every one found).
type InputError struct {
	Detail string
	Params []InvalidParam
}

// Error is Detail, or the first invalid field as "name: reason".
func (e *InputError) Error() string {
	if e.Detail != "" {
		return e.Detail
	}
	return e.Params[0].Name + ": " + e.Params[0].Reason
}

// UnknownFields returns the names of fields that are not in known, sorted.
func UnknownFields[V any](fields map[string]V, known ...string) []string {
	var unknown []string
	for name := range fields {
		if !slices.Contains(known, name) {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	return unknown
}

// WriteInvalidParams sends 400 invalid-request with detail, listing params
// in its invalid-params member.
func (a *API) WriteInvalidParams(w http.ResponseWriter, detail string, params []InvalidParam) {
	p := a.Problem(ProblemInvalidRequest, http.StatusBadRequest, detail)
	p.Extra = map[string]any{"invalid-params": params}
	p.Write(w)
}

// WriteInputError answers err, a body parser's error: 415
// unsupported-media-type for ErrUnsupportedMedia; 400 invalid-request with
// invalid-params for an *InputError with Params, detail(e) its detail; 400
// invalid-request with err's text otherwise.
func (a *API) WriteInputError(w http.ResponseWriter, err error, detail func(e *InputError) string) {
	var ie *InputError
	switch {
	case errors.Is(err, ErrUnsupportedMedia):
		a.WriteProblem(w, ProblemUnsupportedMedia, http.StatusUnsupportedMediaType, err.Error())
	case errors.As(err, &ie) && ie.Params != nil:
		a.WriteInvalidParams(w, detail(ie), ie.Params)
	default:
		a.WriteProblem(w, ProblemInvalidRequest, http.StatusBadRequest, err.Error())
	}
}
