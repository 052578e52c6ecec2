package idem

import (
	"crypto/sha256"
	"encoding/binary"
	"mime"
	"net/http"
	"strings"

	"github.com/gowebpki/jcs"
)

// Fingerprint is the default request fingerprint (CONTRACT section 2): the
// SHA-256 (32 bytes) of the method, the route path, the canonical query
// string (url.Values.Encode: keys sorted), the media type (lower-cased,
// without parameters) and the body. A JSON body (application/json or any
// +json type) is first canonicalized per RFC 8785, so key order and
// whitespace do not change the fingerprint; a JSON body that does not parse,
// and every other body, is hashed as raw bytes. Each part is length-prefixed,
// so no two different requests share an encoding.
func Fingerprint(r *http.Request, body []byte) []byte {
	h := sha256.New()
	part := func(b []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	mediaType := ""
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err == nil {
			mediaType = mt
		} else {
			mediaType = strings.ToLower(strings.TrimSpace(ct))
		}
	}
	if isJSON(mediaType) {
		if canon, err := jcs.Transform(body); err == nil {
			body = canon
		}
	}
	part([]byte(r.Method))
	part([]byte(r.URL.EscapedPath()))
	part([]byte(r.URL.Query().Encode()))
	part([]byte(mediaType))
	part(body)
	return h.Sum(nil)
}

func isJSON(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
