package idemclient

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime"
	"net/http"
)

// Problem is the part of an RFC 9457 problem details document
// (application/problem+json) that tells a client what to do after an
// answer: its type URI (idem's are https://github.com/idemgo/idem/blob/main/docs/problems.md#<kind>),
// title, status, detail, and idem's extension member new_key_safe.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail"`
	// NewKeySafe is true when sending the request again under a new key is
	// safe: nothing of it ran under its key (docs/problems.md). False, the
	// default, when a problem does not say: retry with the same key, or stop.
	NewKeySafe bool `json:"new_key_safe"`
}

// maxProblemBytes bounds the body ProblemOf reads: idem's problems are
// under 1 KiB.
const maxProblemBytes = 64 << 10

// ProblemOf reads resp's problem details when its Content-Type is
// application/problem+json, and gives the body back unread (resp.Body is
// replaced by a reader of the same bytes, so the caller can still read
// and close it). ok is false for any other response, whose body is left
// as it was. Errors: reading the body, a body over 64 KiB, or a problem
// that is not a JSON object (then resp.Body still holds what was read).
func ProblemOf(resp *http.Response) (p Problem, ok bool, err error) {
	if resp == nil || resp.Body == nil {
		return Problem{}, false, nil
	}
	media, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if err != nil || media != "application/problem+json" {
		return Problem{}, false, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxProblemBytes+1))
	rest := resp.Body
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(body), rest), rest}
	switch {
	case err != nil:
		return Problem{}, false, err
	case len(body) > maxProblemBytes:
		return Problem{}, false, fmt.Errorf("idemclient: a problem document over %d bytes", maxProblemBytes)
	}
	if p, err = decodeProblem(body); err != nil {
		return Problem{}, false, fmt.Errorf("idemclient: the problem document does not decode: %w", err)
	}
	return p, true, nil
}

// decodeProblem reads a problem document's members. A member of the wrong
// type is ignored (RFC 9457 section 3.1); new_key_safe named twice is true
// only when every one says true.
func decodeProblem(body []byte) (Problem, error) {
	var p Problem
	dec := json.NewDecoder(bytes.NewReader(body))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return p, fmt.Errorf("not a JSON object")
	}
	safe, unsafe := false, false
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return p, err
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return p, err
		}
		switch tok {
		case "type":
			_ = json.Unmarshal(raw, &p.Type) // a member of another type is ignored
		case "title":
			_ = json.Unmarshal(raw, &p.Title)
		case "status":
			_ = json.Unmarshal(raw, &p.Status)
		case "detail":
			_ = json.Unmarshal(raw, &p.Detail)
		case "new_key_safe":
			var b bool
			if json.Unmarshal(raw, &b) == nil {
				safe, unsafe = safe || b, unsafe || !b
			}
		}
	}
	p.NewKeySafe = safe && !unsafe
	return p, nil
}
