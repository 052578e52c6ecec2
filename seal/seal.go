// Package seal encrypts what idem keeps of a response and of a request in
// its store, and derives the key it stores in place of a client's
// Idempotency-Key, so that neither sits readable in idem_keys, its backups
// or its replicas (docs/sealing.md).
//
// Sealing is AES-GCM (crypto/aes, crypto/cipher) with a random 96-bit nonce
// per seal. Every sealed blob is bound, as additional authenticated data, to
// its record (scope, stored key and life: its created_at), to the part it
// holds (response or request), to the id of the key that sealed it and,
// for a response, to its status, whether its body was stored and its size
// (the plain columns beside it): a blob copied into another record, into
// another life of the key, into another part, or beside an edited status
// does not open. A seal tag (HMAC-SHA256 under a key derived from the
// sealing key) binds the same columns, and whether the blob is kept, in a
// column apart from the blob, so that a record whose blob was emptied does
// not open either. A Keyring holds the configured keys: the first seals,
// every one opens, so keys rotate. Records sealed before seal tags (format
// 1) still open by their blob.
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
	"crypto/hkdf"
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
	"time"

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

// ErrBroken is returned by Keyring.OpenResponse for a sealed record that
// does not authenticate: its blob or seal tag altered, truncated, emptied,
// removed, or copied from another record, life or part, or beside a status,
// body flag or size that were edited. idem answers it 500 seal-broken and
// never runs the request again.
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
// bytes: 128 bits. idem.New refuses a shorter EngineOptions.Sealing.KeyHashSecret,
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
	// tagKeys are the keys of the seal tags (HMAC-SHA256), one per key id,
	// derived from its secret (tagKey).
	tagKeys map[string][]byte
}

// NewKeyring returns the keyring of keys, keys[0] sealing; nil (and no
// error) for no key. Errors: a key that fails Validate, or an id given
// twice, each naming the key's index.
func NewKeyring(keys []Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	r := &Keyring{sealing: keys[0].ID, aeads: make(map[string]cipher.AEAD, len(keys)), tagKeys: make(map[string][]byte, len(keys))}
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
		if err == nil {
			r.tagKeys[k.ID], err = tagKey(k.Secret)
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

// tagKey derives a key's tag key from its secret (HKDF-SHA256, RFC 5869),
// so that the AES key is used for AES-GCM only.
func tagKey(secret []byte) ([]byte, error) {
	return hkdf.Key(sha256.New, secret, nil, "idem seal tag", sha256.Size)
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
	// PartStepRelay and PartStepResult are a step's relayed key and its
	// recorded result (docs/contract.md section 11.1; SealStep).
	PartStepRelay  Part = "step-relay"
	PartStepResult Part = "step-result"
)

// Life names the record a sealed response belongs to: its scope, its
// stored key (HashKey's when key hashing is on) and the created_at of its
// life (idemdriver.Record.CreatedAt, idemdriver.FenceParams.CreatedAt),
// bound to the microsecond, as every driver stores it. A takeover or a
// re-claim keeps created_at, so a life's record keeps opening; a new life
// of the key (after its expiry) or another key's record does not open it.
type Life struct {
	Scope, Key string
	Created    time.Time
}

// LifeOf is the life of rec (its Scope, Key and CreatedAt).
func LifeOf(rec idemdriver.Record) Life {
	return Life{Scope: rec.Scope, Key: rec.Key, Created: rec.CreatedAt}
}

// format is the sealing format SealResponse writes: the first byte of
// every sealed blob and seal tag. Format 1 sealed the blobs alone, bound to
// scope and stored key; a record of format 1 has no tag. Format 2 adds the
// tag (idemdriver.Response.SealTag) and binds blobs and tag to the record's
// life. Every format from firstTagged on is opened by the same code, its
// number bound in all it authenticates (bind), so a later format that
// seals more (the recovery's step data) raises this constant and adds its
// data to bind; records of each earlier format still open as written.
const format = 2

const (
	// formatBlobOnly is the format of records sealed before seal tags.
	formatBlobOnly = 1
	// firstTagged is the first format with a seal tag.
	firstTagged = 2
	// aadLabelBlobOnly is format 1's additional-data label.
	aadLabelBlobOnly = "idem-seal-v1"
	// bindLabel starts what formats from firstTagged on authenticate.
	bindLabel = "idem-seal"
)

// aadBlobOnly is a format-1 blob's additional data: its key id, record
// (scope and key), part and, for a response, its plain columns.
// Length-prefixed: no two inputs give the same bytes.
func aadBlobOnly(id string, part Part, scope, key string, resp *idemdriver.Response) []byte {
	b := appendStrings(nil, aadLabelBlobOnly, id, string(part), scope, key)
	if resp != nil {
		b = appendColumns(b, resp)
	}
	return b
}

// bind is what a blob or seal tag of format f (firstTagged or later)
// authenticates: the format, the key id, the part, the record's life and,
// for a response (resp not nil), its plain columns (status, body-stored
// flag, body size) and whether its blob is kept (false in the tag a driver
// stores when it drops the blob). Length-prefixed: no two inputs give the
// same bytes.
func bind(f byte, id string, part Part, l Life, resp *idemdriver.Response, blobKept bool) []byte {
	b := appendStrings([]byte{f}, bindLabel, id, string(part), l.Scope, l.Key)
	b = binary.BigEndian.AppendUint64(b, uint64(l.Created.UnixMicro()))
	if resp != nil {
		b = appendColumns(b, resp)
		b = append(b, boolByte(blobKept))
	}
	return b
}

func appendStrings(b []byte, ss ...string) []byte {
	for _, s := range ss {
		b = binary.BigEndian.AppendUint32(b, uint32(len(s)))
		b = append(b, s...)
	}
	return b
}

// appendColumns appends a response's plain columns: status, body-stored
// flag, body size.
func appendColumns(b []byte, resp *idemdriver.Response) []byte {
	b = binary.BigEndian.AppendUint64(b, uint64(int64(resp.Status)))
	b = append(b, boolByte(resp.BodyStored))
	return binary.BigEndian.AppendUint64(b, uint64(resp.BodySize))
}

func boolByte(v bool) byte {
	if v {
		return 1
	}
	return 0
}

// sealBlob seals plain under the sealing key in the current format, with
// additional data aad: format byte, random nonce, ciphertext and GCM tag.
func (r *Keyring) sealBlob(plain, aad []byte) []byte {
	g := r.aeads[r.sealing]
	out := make([]byte, 1+g.NonceSize(), 1+g.NonceSize()+len(plain)+g.Overhead())
	out[0] = format
	_, _ = rand.Read(out[1:]) // crypto/rand.Read never fails (Go 1.24)
	return g.Seal(out, out[1:1+g.NonceSize()], plain, aad)
}

// openBlob opens a blob of format f sealed under id with additional data
// aad.
func (r *Keyring) openBlob(id string, part Part, f byte, aad, blob []byte) ([]byte, error) {
	g := r.aeads[id]
	if len(blob) < 1+g.NonceSize()+g.Overhead() || blob[0] != f {
		return nil, fmt.Errorf("%w: the %s blob is %d bytes, not a format-%d blob", ErrBroken, part, len(blob), f)
	}
	plain, err := g.Open(nil, blob[1:1+g.NonceSize()], blob[1+g.NonceSize():], aad)
	if err != nil {
		return nil, fmt.Errorf("%w: the %s sealed under %q", ErrBroken, part, id)
	}
	return plain, nil
}

// tag is the seal tag of format f under id over bind's input: the format
// byte and the HMAC-SHA256.
func (r *Keyring) tag(f byte, id string, l Life, resp *idemdriver.Response, blobKept bool) []byte {
	m := hmac.New(sha256.New, r.tagKeys[id])
	m.Write(bind(f, id, PartResponse, l, resp, blobKept))
	return m.Sum([]byte{f})
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

// SealResponse returns resp as idem stores it for the record of life l:
// with a keyring, its headers and body packed and sealed in Sealed (Header
// and Body nil, SealKey the sealing key's id), its Request, if any, sealed
// too, and SealTag, a seal tag over Status, BodyStored and BodySize (which
// stay plain) and the blob's presence, with SealTagDropped, the tag of the
// same response stored without its blob (BodyStored false; a driver that
// drops the blob stores it instead). Everything is bound to the key id and
// to l. A nil keyring returns resp unchanged. resp must be plain (SealKey
// "").
func (r *Keyring) SealResponse(l Life, resp idemdriver.Response) (idemdriver.Response, error) {
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
	out.Sealed = r.sealBlob(plain, bind(format, r.sealing, PartResponse, l, &out, true))
	out.SealTag = r.tag(format, r.sealing, l, &out, true)
	dropped := out
	dropped.BodyStored = false
	out.SealTagDropped = r.tag(format, r.sealing, l, &dropped, false)
	if resp.Request != nil {
		out.Request = r.sealBlob(resp.Request, bind(format, r.sealing, PartRequest, l, nil, false))
	}
	return out, nil
}

// SealStep returns a step's data as idem stores it: part (PartStepRelay or
// PartStepResult) of the step name of the record of life l, sealed under
// the sealing key, bound to the key id, part, life and name, and the key
// id. A nil keyring returns plain and "". Each blob authenticates itself:
// steps are rows of their own, outside the record's seal tag.
func (r *Keyring) SealStep(l Life, part Part, name string, plain []byte) (blob []byte, keyID string) {
	if r == nil {
		return plain, ""
	}
	return r.sealBlob(plain, stepBind(format, r.sealing, part, l, name)), r.sealing
}

// OpenStep is the inverse of SealStep; data of keyID "" is returned as is.
// Errors: ErrKeyMissing, ErrBroken (another part, name, life or key, or
// edited).
func (r *Keyring) OpenStep(l Life, part Part, name, keyID string, blob []byte) ([]byte, error) {
	if keyID == "" {
		return blob, nil
	}
	if !r.Holds(keyID) {
		return nil, fmt.Errorf("%w: step %q: key id %q (the configured ids: %s)", ErrKeyMissing, name, keyID, r.ids())
	}
	if len(blob) == 0 || blob[0] < firstTagged || blob[0] > format {
		return nil, fmt.Errorf("%w: step %q: the %s blob is not of a format this idem reads", ErrBroken, name, part)
	}
	return r.openBlob(keyID, part, blob[0], stepBind(blob[0], keyID, part, l, name), blob)
}

// stepBind is what a step's blob authenticates: bind's record part and the
// step's name.
func stepBind(f byte, id string, part Part, l Life, name string) []byte {
	return appendStrings(bind(f, id, part, l, nil, false), name)
}

// OpenResponse is the inverse of SealResponse: the plain response (Header
// and Body set, Request opened; SealKey, Sealed, SealTag and
// SealTagDropped cleared) of the record of life l as the store returned
// it. A plain response (SealKey "") is returned as is, by a nil keyring
// too: nothing authenticates it, so a caller holding keys decides whether
// to trust it (idem refuses it unless EngineOptions.Sealing.ReplayPlain is set,
// docs/sealing.md).
//
// A sealed response opens only when its seal tag authenticates its
// status, body-stored flag, body size and blob (present, or dropped by a
// driver for the database's packet: then it opens with no headers and no
// body), bound to its key id and life, and its blob (when kept) opens too.
// A record sealed before seal tags (format 1) has none: it opens by its
// blob alone, which binds the same columns but not the life; without its
// blob it authenticates nothing and does not open. Errors: ErrKeyMissing,
// ErrBroken (which says what failed).
func (r *Keyring) OpenResponse(l Life, resp idemdriver.Response) (idemdriver.Response, error) {
	if resp.SealKey == "" {
		return resp, nil
	}
	id := resp.SealKey
	if !r.Holds(id) {
		return resp, fmt.Errorf("%w: key id %q (the configured ids: %s)", ErrKeyMissing, id, r.ids())
	}
	out := resp
	out.SealKey, out.Sealed, out.SealTag, out.SealTagDropped = "", nil, nil, nil
	out.Header, out.Body, out.Request = map[string][]string{}, []byte{}, nil
	var aad func(Part, *idemdriver.Response) []byte
	f, kept := byte(formatBlobOnly), len(resp.Sealed) > 0
	switch {
	case len(resp.SealTag) == 0 && !kept:
		return resp, fmt.Errorf("%w: the record is sealed under %q but holds neither its seal tag nor its blob "+
			"(emptied, or sealed before seal tags and dropped for the database's packet)", ErrBroken, id)
	case len(resp.SealTag) == 0 && resp.Sealed[0] != formatBlobOnly:
		return resp, fmt.Errorf("%w: the record's format-%d blob has lost its seal tag", ErrBroken, resp.Sealed[0])
	case len(resp.SealTag) == 0:
		aad = func(part Part, cols *idemdriver.Response) []byte { return aadBlobOnly(id, part, l.Scope, l.Key, cols) }
	default:
		f = resp.SealTag[0]
		if f < firstTagged || f > format {
			return resp, fmt.Errorf("%w: the record's seal tag is of format %d; this idem reads formats %d to %d "+
				"(a later idem version sealed it: run that version on every process)", ErrBroken, f, firstTagged, format)
		}
		if !hmac.Equal(resp.SealTag, r.tag(f, id, l, &resp, kept)) {
			return resp, fmt.Errorf("%w: the seal tag under %q does not authenticate the record's status, body flag and size, "+
				"its blob, or its life (edited, emptied or copied)", ErrBroken, id)
		}
		aad = func(part Part, cols *idemdriver.Response) []byte { return bind(f, id, part, l, cols, true) }
	}
	if !kept {
		return out, nil // dropped for the packet: the tag says so
	}
	plain, err := r.openBlob(id, PartResponse, f, aad(PartResponse, &resp), resp.Sealed)
	if err != nil {
		return resp, err
	}
	if out.Header, out.Body, err = unpackResponse(plain); err != nil {
		return resp, err
	}
	if resp.Request != nil {
		if out.Request, err = r.openBlob(id, PartRequest, f, aad(PartRequest, nil), resp.Request); err != nil {
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
// (idem.EngineOptions.Sealing.KeepRequestBytes).
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
	// Key is the client's Idempotency-Key and Header the request's headers
	// but its credentials, kept for a re-drive only (idem's
	// RequestOptions.KeepForRedrive, docs/contract.md section 11.4); empty
	// in the request kept for an audit.
	Key    string              `json:"key,omitempty"`
	Header map[string][]string `json:"header,omitempty"`
}

// EncodeRequest packs r as idem stores it (in idemdriver.Response.Request,
// before sealing): a version byte, the JSON length of the other fields
// (uvarint), that JSON, the body.
func EncodeRequest(r Request) []byte {
	meta, _ := json.Marshal(r) // strings, an int, a bool and a map of strings: no error
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
// secret (idem.EngineOptions.Sealing.KeyHashSecret): "h1_" and the lowercase hex
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
