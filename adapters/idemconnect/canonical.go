package idemconnect

import (
	"bytes"
	"compress/gzip"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idemgo/idem"
)

// MaxCanonicalBytes bounds what Handler reads of a keyed request's body,
// and what it decompresses, to put the body in its canonical form (see the
// package documentation, "The fingerprint"); a larger body passes as sent.
const MaxCanonicalBytes = 8 << 20 // 8 MiB

// canonical returns r, a unary Connect-protocol request, with its body in
// the form whose fingerprint is the same on every retry of one message:
// a gzip body decompressed (Content-Encoding removed), and a binary proto
// message re-encoded deterministically (map entries sorted by key), when
// r's procedure is a method of a service in protoregistry.GlobalFiles. A
// request without an Idempotency-Key, with another Content-Encoding, or
// whose body exceeds MaxCanonicalBytes, does not parse, or names no known
// procedure is left as sent, and so is its body.
func canonical(r *http.Request) *http.Request {
	if len(r.Header.Values(idem.HeaderKey)) == 0 || r.Body == nil || r.Body == http.NoBody {
		return r
	}
	mediaType, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	isProto := mediaType == "application/proto"
	gzipped := false
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		gzipped = true
	default:
		return r
	}
	if !isProto && !gzipped {
		return r // JSON: idem's fingerprint canonicalizes it (RFC 8785)
	}
	sent, err := io.ReadAll(io.LimitReader(r.Body, MaxCanonicalBytes+1))
	if err != nil || len(sent) > MaxCanonicalBytes {
		// As sent: what was read, then the rest (or the read's error).
		rest := r.Body
		if err != nil {
			rest = io.NopCloser(errReader{err})
		}
		r2 := r.WithContext(r.Context())
		r2.Body = readCloser{io.MultiReader(bytes.NewReader(sent), rest), r.Body}
		return r2
	}
	body := sent
	if gzipped {
		if body, err = gunzip(sent); err != nil {
			return withBody(r, sent, false) // connect-go refuses it, as sent
		}
	}
	if isProto {
		if mt := inputType(r.URL.Path); mt != nil {
			m := mt.New().Interface()
			if proto.Unmarshal(body, m) == nil {
				if b, err := (proto.MarshalOptions{Deterministic: true}).Marshal(m); err == nil {
					body = b
				}
			}
		}
	}
	return withBody(r, body, gzipped)
}

// gunzip is gz decompressed, or an error beyond MaxCanonicalBytes.
func gunzip(gz []byte) ([]byte, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(io.LimitReader(zr, MaxCanonicalBytes+1))
	if err == nil && len(b) > MaxCanonicalBytes {
		err = io.ErrShortBuffer
	}
	return b, err
}

// withBody is a shallow copy of r whose body is body (no longer encoded
// when decoded).
func withBody(r *http.Request, body []byte, decoded bool) *http.Request {
	r2 := r.WithContext(r.Context())
	r2.Header = r.Header.Clone()
	if decoded {
		r2.Header.Del("Content-Encoding")
	}
	if r2.Header.Get("Content-Length") != "" {
		r2.Header.Set("Content-Length", strconv.Itoa(len(body)))
	}
	r2.Body, r2.ContentLength, r2.TransferEncoding = readCloser{bytes.NewReader(body), r.Body}, int64(len(body)), nil
	return r2
}

// inputType is the request message type of the procedure at the end of
// path ("/<package>.<Service>/<Method>", under any prefix), found in
// protoregistry.GlobalFiles, or nil.
func inputType(path string) protoreflect.MessageType {
	rest, method, ok := cutLast(path)
	if !ok {
		return nil
	}
	_, service, _ := cutLast(rest)
	name := protoreflect.FullName(service)
	if !name.IsValid() {
		return nil
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return nil
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil
	}
	md := sd.Methods().ByName(protoreflect.Name(method))
	if md == nil {
		return nil
	}
	if mt, err := protoregistry.GlobalTypes.FindMessageByName(md.Input().FullName()); err == nil {
		return mt
	}
	return dynamicpb.NewMessageType(md.Input())
}

// cutLast splits s at its last '/': what is before, and after.
func cutLast(s string) (before, after string, ok bool) {
	i := strings.LastIndexByte(s, '/')
	if i < 0 {
		return "", s, false
	}
	return s[:i], s[i+1:], true
}

// readCloser reads from Reader and closes the request's own body.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (rc readCloser) Close() error { return rc.c.Close() }

// errReader fails every read with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
