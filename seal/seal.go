// Package seal encrypts what idem keeps of a response and of a request in
// its store, and derives the key it stores in place of a client's
// Idempotency-Key, so that neither sits readable in idem_keys, its backups
// or its replicas (docs/sealing.md).
//
// Sealing is AES-GCM (crypto/aes, crypto/cipher) with a random 96-bit nonce
// per seal. Every sealed blob is bound, as additional authenticated data, to
// its record (scope and stored key), to the part it holds (response or
// request), to the id of the key that sealed it and, for a response, to its
// status, whether its body was stored and its size (the plain columns beside
// it): a blob copied into another record, into another part, or beside an
// edited status does not open. A Keyring holds the configured keys: the
// first seals, every one opens, so keys rotate.
//
// The stored key (HashKey) is an HMAC-SHA256 of the client's key under a
// secret: the table shows no client key, and whoever holds the secret (the
// idem CLI, given it) finds a record from the plain key.
//
// The packings (EncodeRequest, the response's headers and body) are what
// idem writes in idemdriver.Response's Sealed and Request fields, sealed or
// not; this package reads them back for the CLI and for idem's replay.
package seal

//lint:file-ignore ST1005 validation errors start with the field they name (ID, Secret), as Config's do

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/idemgo/idem/idemdriver"
)

// MaxKeyIDLength is the longest key id, in bytes. Every driver stores up to
// 64 bytes in its seal_key column.
const MaxKeyIDLength = 32

// ErrKeyMissing is returned by Keyring.OpenResponse for a record sealed with
// a key id the keyring does not hold (a key removed from the configuration
// before every record it sealed expired). idem answers it 500
// seal-key-missing and never runs the request again.
var ErrKeyMissing = errors.New("idem: the record is sealed with a key this process does not hold")

// ErrBroken is returned by Keyring.OpenResponse for a sealed blob that does
// not authenticate: altered, truncated, copied from another record or part,
// or beside a status, body flag or size that were edited. idem answers it
// 500 seal-broken and never runs the request again.
var ErrBroken = errors.New("idem: the record's sealed data does not authenticate (altered, or copied from another record)")

// Key is one sealing key.
type Key struct {
	// ID names the key in every record it seals (the seal_key column): 1 to
	// MaxKeyIDLength bytes of ASCII letters, digits, '.', '_' or '-'. Never
	// reuse an id for another secret: records sealed under the old one would
	// not open.
	ID string
	// Secret is the AES key: 16, 24 or 32 bytes (AES-128, AES-192, AES-256).
	Secret []byte
}

// Validate reports what is wrong with k, naming the field (ID or Secret);
// nil when k can seal.
func (k Key) Validate() error {
	var errs []error
	switch {
	case k.ID == "":
		errs = append(errs, errors.New("ID is empty"))
	case len(k.ID) > MaxKeyIDLength:
		errs = append(errs, fmt.Errorf("ID is %d bytes; at most %d are stored", len(k.ID), MaxKeyIDLength))
	case strings.Trim(k.ID, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-") != "":
		errs = append(errs, fmt.Errorf("ID %q holds a character other than ASCII letters, digits, '.', '_' and '-'", k.ID))
	}
	switch len(k.Secret) {
	case 16, 24, 32:
	default:
		errs = append(errs, fmt.Errorf("Secret is %d bytes; AES takes 16, 24 or 32", len(k.Secret)))
	}
	return errors.Join(errs...)
}

// ParseKey reads a key written "id:secret", the secret in base64 (standard
// or URL alphabet, padded or not), as the idem CLI's --seal-key and
// cmd/paymentsd's take it. The error names what is wrong but never quotes
// the secret.
func ParseKey(s string) (Key, error) {
	id, secret, ok := strings.Cut(strings.TrimSpace(s), ":")
	if !ok {
		return Key{}, errors.New("a sealing key is written id:base64secret")
	}
	b, err := decodeBase64(secret)
	if err != nil {
		return Key{}, fmt.Errorf("the secret of key %q is not base64", id)
	}
	k := Key{ID: id, Secret: b}
	if err := k.Validate(); err != nil {
		return Key{}, fmt.Errorf("key %q: %w", id, err)
	}
	return k, nil
}

// ParseKeys reads comma-separated keys (ParseKey's form), the sealing key
// first: "new:...,old:...". An empty s is no key.
func ParseKeys(s string) ([]Key, error) {
	var keys []Key
	for _, part := range strings.Split(s, ",") {
		if strings.TrimSpace(part) == "" {
			continue
		}
		k, err := ParseKey(part)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// ParseSecret reads a base64 secret (standard or URL alphabet, padded or
// not), such as a key-hash secret given on a command line. A key-hash
// secret also needs ParseHashSecret's length.
func ParseSecret(s string) ([]byte, error) {
	b, err := decodeBase64(strings.TrimSpace(s))
	if err != nil {
		return nil, errors.New("the secret is not base64")
	}
	return b, nil
}

// MinHashSecretBytes is the shortest key-hash secret (HashKey's secret), in
// bytes: 128 bits. idem.New refuses a shorter EngineConfig.KeyHashSecret,
// and the commands (paymentsd, the idem CLI) a shorter --key-hash-secret.
const MinHashSecretBytes = 16

// ParseHashSecret reads a key-hash secret as ParseSecret does, and refuses
// one shorter than MinHashSecretBytes. Its errors never quote the secret.
func ParseHashSecret(s string) ([]byte, error) {
	b, err := ParseSecret(s)
	if err != nil {
		return nil, err
	}
	if len(b) < MinHashSecretBytes {
		return nil, fmt.Errorf("the secret is %d bytes; it needs at least %d", len(b), MinHashSecretBytes)
	}
	return b, nil
}

func decodeBase64(s string) ([]byte, error) {
	s = strings.TrimRight(s, "=")
	if strings.ContainsAny(s, "-_") {
		return base64.RawURLEncoding.DecodeString(s)
	}
	return base64.RawStdEncoding.DecodeString(s)
}

// Keyring holds the configured sealing keys: the first seals, every one
// opens. A nil *Keyring holds none: it seals nothing and opens only plain
// records. Safe for concurrent use.
type Keyring struct {
	sealing string
	aeads   map[string]cipher.AEAD
}

// NewKeyring returns the keyring of keys, keys[0] sealing; nil (and no
// error) for no key. Errors: a key that fails Validate, or an id given
// twice, each naming the key's index.
func NewKeyring(keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	r := &Keyring{sealing: keys[0].ID, aeads: make(map[string]cipher.AEAD, len(keys))}
	var errs []error
	first := map[string]int{}
	for i, k := range keys {
		if err := k.Validate(); err != nil {
			errs = append(errs, fmt.Errorf("[%d].%w", i, err))
			continue
		}
		if j, dup := first[k.ID]; dup {
			errs = append(errs, fmt.Errorf("[%d].ID %q repeats the id of [%d]; each key needs its own", i, k.ID, j))
			continue
		}
		first[k.ID] = i
		block, err := aes.NewCipher(k.Secret)
		if err == nil {
			r.aeads[k.ID], err = cipher.NewGCM(block)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("[%d]: %w", i, err))
		}
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return r, nil
}

// SealingKey is the id of the key that seals new records; "" for a nil
// keyring.
func (r *Keyring) SealingKey() string {
	if r == nil {
		return ""
	}
	return r.sealing
}

// Holds reports whether the keyring can open records sealed under id.
func (r *Keyring) Holds(id string) bool {
	if r == nil {
		return false
	}
	_, ok := r.aeads[id]
	return ok
}

// Part names what a sealed blob holds; it is part of the blob's
// additional data, so a blob of one part does not open as another.
type Part string

const (
	// PartResponse is a response's headers and body.
	PartResponse Part = "response"
	// PartRequest is a kept request (EncodeRequest).
	PartRequest Part = "request"
)

const (
	blobVersion = 1
	aadLabel    = "idem-seal-v1"
)

// aad binds a blob to its key id, record, part and, for a response, its
// plain columns. Length-prefixed: no two inputs give the same bytes.
func aad(id string, part Part, scope, key string, resp *idemdriver.Response) []byte {
	var b []byte
	for _, s := range []string{aadLabel, id, string(part), scope, key} {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	if resp != nil {
		b = binary.BigEndian.AppendUint64(b, uint64(int64(resp.Status)))
		stored := byte(0)
		if resp.BodyStored {
			stored = 1
		}
		b = append(b, stored)
		b = binary.BigEndian.AppendUint64(b, uint64(resp.BodySize))
	}
	return b
}

func (r *Keyring) seal(part Part, scope, key string, resp *idemdriver.Response, plain []byte) []byte {
	g := r.aeads[r.sealing]
	out := make([]byte, 1+g.NonceSize(), 1+g.NonceSize()+len(plain)+g.Overhead())
	out[0] = blobVersion
	_, _ = rand.Read(out[1:]) // crypto/rand.Read never fails (Go 1.24)
	return g.Seal(out, out[1:1+g.NonceSize()], plain, aad(r.sealing, part, scope, key, resp))
}

func (r *Keyring) open(id string, part Part, scope, key string, resp *idemdriver.Response, blob []byte) ([]byte, error) {
	if !r.Holds(id) {
		return nil, fmt.Errorf("%w: key id %q (the configured ids: %s)", ErrKeyMissing, id, r.ids())
	}
	g := r.aeads[id]
	if len(blob) < 1+g.NonceSize()+g.Overhead() || blob[0] != blobVersion {
		return nil, fmt.Errorf("%w: the %s blob is %d bytes, not a version-%d blob", ErrBroken, part, len(blob), blobVersion)
	}
	plain, err := g.Open(nil, blob[1:1+g.NonceSize()], blob[1+g.NonceSize():], aad(id, part, scope, key, resp))
	if err != nil {
		return nil, fmt.Errorf("%w: the %s sealed under %q", ErrBroken, part, id)
	}
	return plain, nil
}

func (r *Keyring) ids() string {
	if r == nil || len(r.aeads) == 0 {
		return "none"
	}
	ids := make([]string, 0, len(r.aeads))
	for id := range r.aeads {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return strings.Join(ids, ", ")
}

// SealResponse returns resp as idem stores it for the record (scope, key)
// (the stored key, HashKey's when key hashing is on): with a keyring, its
// headers and body packed and sealed in Sealed (Header and Body nil,
// SealKey the sealing key's id) and its Request, if any, sealed too;
// Status, BodyStored and BodySize stay plain (and bound to the blob). A nil
// keyring returns resp unchanged. resp must be plain (SealKey "").
func (r *Keyring) SealResponse(scope, key string, resp idemdriver.Response) (idemdriver.Response, error) {
	if r == nil {
		return resp, nil
	}
	if resp.SealKey != "" {
		return resp, errors.New("idem: the response is sealed already")
	}
	plain, err := packResponse(resp)
	if err != nil {
		return resp, err
	}
	out := resp
	out.Header, out.Body, out.SealKey = nil, nil, r.sealing
	out.Sealed = r.seal(PartResponse, scope, key, &out, plain)
	if resp.Request != nil {
		out.Request = r.seal(PartRequest, scope, key, nil, resp.Request)
	}
	return out, nil
}

// OpenResponse is the inverse of SealResponse: the plain response (Header
// and Body set, Request opened, SealKey and Sealed cleared) of the record
// (scope, key) as the store returned it. A plain response (SealKey "") is
// returned as is, by a nil keyring too: nothing authenticates it, so a
// caller holding keys decides whether to trust it (idem refuses it unless
// EngineConfig.ReplayPlain is set, docs/sealing.md). A sealed response whose body was
// not stored and whose blob a driver dropped (too large for the database's
// packet) opens with no headers and no body. Errors: ErrKeyMissing,
// ErrBroken.
func (r *Keyring) OpenResponse(scope, key string, resp idemdriver.Response) (idemdriver.Response, error) {
	if resp.SealKey == "" {
		return resp, nil
	}
	out := resp
	out.SealKey, out.Sealed, out.Header, out.Body = "", nil, map[string][]string{}, []byte{}
	if len(resp.Sealed) == 0 && !resp.BodyStored {
		if !r.Holds(resp.SealKey) {
			return resp, fmt.Errorf("%w: key id %q (the configured ids: %s)", ErrKeyMissing, resp.SealKey, r.ids())
		}
		out.Request = nil
		return out, nil
	}
	plain, err := r.open(resp.SealKey, PartResponse, scope, key, &resp, resp.Sealed)
	if err != nil {
		return resp, err
	}
	if out.Header, out.Body, err = unpackResponse(plain); err != nil {
		return resp, err
	}
	if resp.Request != nil {
		if out.Request, err = r.open(resp.SealKey, PartRequest, scope, key, nil, resp.Request); err != nil {
			return resp, err
		}
	}
	return out, nil
}

// packResponse is a response's headers and body in one plaintext: a version
// byte, the headers' JSON length (uvarint), the JSON, the body (empty when
// not stored).
func packResponse(resp idemdriver.Response) ([]byte, error) {
	h := resp.Header
	if h == nil {
		h = map[string][]string{}
	}
	meta, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	body := resp.Body
	if !resp.BodyStored {
		body = nil
	}
	return frame(meta, body), nil
}

func unpackResponse(plain []byte) (map[string][]string, []byte, error) {
	meta, body, err := unframe(plain)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: the response: %w", ErrBroken, err)
	}
	h := map[string][]string{}
	if err := json.Unmarshal(meta, &h); err != nil {
		return nil, nil, fmt.Errorf("%w: the response's headers: %w", ErrBroken, err)
	}
	return h, body, nil
}

const packVersion = 1

func frame(meta, body []byte) []byte {
	b := make([]byte, 0, 1+binary.MaxVarintLen64+len(meta)+len(body))
	b = append(b, packVersion)
	b = binary.AppendUvarint(b, uint64(len(meta)))
	return append(append(b, meta...), body...)
}

func unframe(b []byte) (meta, body []byte, err error) {
	if len(b) == 0 || b[0] != packVersion {
		return nil, nil, errors.New("not a version-1 packing")
	}
	n, w := binary.Uvarint(b[1:])
	if w <= 0 || n > uint64(len(b)-1-w) {
		return nil, nil, errors.New("a truncated packing")
	}
	rest := b[1+w:]
	return rest[:n], bytes.Clone(rest[n:]), nil
}

// Request is the request idem keeps beside a record for an audit
// (idem.EngineConfig.KeepRequestBytes).
type Request struct {
	// ContentType is the request's Content-Type header; "" for Do.
	ContentType string `json:"content_type,omitempty"`
	// Query is the request's raw query string, without '?'; "" for Do.
	Query string `json:"query,omitempty"`
	// Size is the whole body's size in bytes (Do: the Payload's).
	Size int64 `json:"size"`
	// Truncated reports that Body holds only the first KeepRequestBytes
	// bytes of the body.
	Truncated bool `json:"truncated,omitempty"`
	// Body is the body, or its first KeepRequestBytes bytes.
	Body []byte `json:"-"`
}

// EncodeRequest packs r as idem stores it (in idemdriver.Response.Request,
// before sealing): a version byte, the JSON length of the other fields
// (uvarint), that JSON, the body.
func EncodeRequest(r Request) []byte {
	meta, _ := json.Marshal(r) // strings, an int and a bool: no error
	return frame(meta, r.Body)
}

// DecodeRequest is the inverse of EncodeRequest (of an opened request).
func DecodeRequest(b []byte) (Request, error) {
	meta, body, err := unframe(b)
	if err != nil {
		return Request{}, fmt.Errorf("idem: the kept request: %w", err)
	}
	var r Request
	if err := json.Unmarshal(meta, &r); err != nil {
		return Request{}, fmt.Errorf("idem: the kept request: %w", err)
	}
	r.Body = body
	return r, nil
}

// HashedKeyPrefix starts every key HashKey returns; it versions the
// derivation. A table whose keys start with it stores them hashed (the idem
// CLI says so when a plain key finds nothing).
const HashedKeyPrefix = "h1_"

// HashedKeyLength is the length of every key HashKey returns, in bytes.
const HashedKeyLength = len(HashedKeyPrefix) + 2*sha256.Size

// HashKey returns the key idem stores for a client's Idempotency-Key under
// secret (idem.EngineConfig.KeyHashSecret): "h1_" and the lowercase hex
// HMAC-SHA256(secret, key), HashedKeyLength (67) visible ASCII bytes, which
// every driver's 255-byte key column holds. The scope is not part of it (it
// stays a column of its own). Deterministic: the same secret and key give
// the same stored key on every process, so the CLI finds a record from the
// plain key.
func HashKey(secret []byte, key string) string {
	h := hmac.New(sha256.New, secret)
	h.Write([]byte(key))
	return HashedKeyPrefix + hex.EncodeToString(h.Sum(nil))
}
