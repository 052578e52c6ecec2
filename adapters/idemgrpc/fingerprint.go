package idemgrpc

import (
	"fmt"
	"net/http"
	"net/url"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/idemgo/idem/fingerprint"
)

// canonicalJSON writes a request for its fingerprint: the schema's field
// names and enum numbers, fields at their default value left out (so a field
// added to the schema that the client does not set changes nothing).
// protojson's output is deliberately unstable (it adds random spaces);
// fingerprint.Request canonicalizes it per RFC 8785.
var canonicalJSON = protojson.MarshalOptions{UseProtoNames: true, UseEnumNumbers: true}

// Fingerprint is the default canonical form of a request (WithFingerprint):
// req, a proto.Message, as protojson writes it with the schema's field names
// (UseProtoNames) and enum numbers (UseEnumNumbers), fields at their default
// value left out. Unknown fields are not written. It is what the record
// keeps of the request under EngineOptions.Sealing.KeepRequestBytes. A request
// protojson cannot write (an Any whose type this binary does not link) is
// written as proto's deterministic binary encoding instead, stable within
// one binary only, and hashed as such (its fingerprint cannot equal a JSON
// one). Errors: req is not a proto.Message.
func Fingerprint(_ string, req any) ([]byte, error) {
	m, ok := req.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("idemgrpc: the request is a %T, not a proto.Message (set WithFingerprint)", req)
	}
	if b, err := canonicalJSON.Marshal(m); err == nil {
		return b, nil
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return nil, err
	}
	return append([]byte(binaryMark), b...), nil
}

// binaryMark starts the form of a request protojson could not write.
const binaryMark = "\x00idemgrpc-binary\x00"

// hashForm is the fingerprint (a SHA-256) of a request of fullMethod whose
// canonical form is form: idem's fingerprint of a JSON body (RFC 8785), as
// for an HTTP request of method RecordMethod to the path fullMethod. A form
// that is not JSON is hashed as it is.
func hashForm(fullMethod string, form []byte) []byte {
	r := &http.Request{Method: RecordMethod, URL: &url.URL{Path: fullMethod}, Header: http.Header{"Content-Type": {"application/json"}}}
	return fingerprint.Request(r, form)
}
