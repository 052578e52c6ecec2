package seal_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

func keyring(t *testing.T, keys ...seal.Key) *seal.Keyring {
	t.Helper()
	kr, err := seal.NewKeyring(keys)
	require.NoError(t, err)
	return kr
}

var life = seal.Life{Scope: "s", Key: "k", Created: time.UnixMicro(1_700_000_000_123_456)}

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	a := seal.Key{ID: "a", Secret: bytes.Repeat([]byte{1}, 16)}
	kr := keyring(t, a)
	resp := idemdriver.Response{Status: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("body"),
		BodyStored: true, BodySize: 4, Request: seal.EncodeRequest(seal.Request{Query: "q=1", Size: 3, Body: []byte("req")})}
	sealed, err := kr.SealResponse(life, resp)
	require.NoError(t, err)
	require.Equal(t, "a", sealed.SealKey)
	require.Nil(t, sealed.Header)
	require.Nil(t, sealed.Body)
	require.NotContains(t, string(sealed.Sealed), "body")
	require.Len(t, sealed.SealTag, 33, "a format byte and an HMAC-SHA256")
	require.LessOrEqual(t, len(sealed.SealTag), idemdriver.MaxSealTagBytes)
	require.Equal(t, byte(2), sealed.SealTag[0], "format 2")
	require.Equal(t, byte(2), sealed.Sealed[0])
	require.NotEqual(t, sealed.SealTag, sealed.SealTagDropped)
	again, err := kr.SealResponse(life, resp)
	require.NoError(t, err)
	require.NotEqual(t, sealed.Sealed, again.Sealed, "a new nonce each seal")
	require.Equal(t, sealed.SealTag, again.SealTag, "the tag authenticates the columns, not the nonce")

	opened, err := kr.OpenResponse(life, sealed)
	require.NoError(t, err)
	require.Equal(t, resp, opened)
	req, err := seal.DecodeRequest(opened.Request)
	require.NoError(t, err)
	require.Equal(t, seal.Request{Query: "q=1", Size: 3, Body: []byte("req")}, req)

	other, err := kr.SealResponse(seal.Life{Scope: "s", Key: "k2", Created: life.Created}, resp)
	require.NoError(t, err)
	for name, f := range map[string]func(r *idemdriver.Response, l *seal.Life){
		"other key":        func(_ *idemdriver.Response, l *seal.Life) { l.Key = "k2" },
		"other scope":      func(_ *idemdriver.Response, l *seal.Life) { l.Scope = "s2" },
		"other life":       func(_ *idemdriver.Response, l *seal.Life) { l.Created = l.Created.Add(time.Microsecond) },
		"status":           func(r *idemdriver.Response, _ *seal.Life) { r.Status = 200 },
		"size":             func(r *idemdriver.Response, _ *seal.Life) { r.BodySize = 5 },
		"stored flag":      func(r *idemdriver.Response, _ *seal.Life) { r.BodyStored = false },
		"emptied":          func(r *idemdriver.Response, _ *seal.Life) { r.Sealed, r.BodyStored = nil, false },
		"emptied, status":  func(r *idemdriver.Response, _ *seal.Life) { r.Sealed, r.BodyStored, r.Status = nil, false, 200 },
		"tag removed":      func(r *idemdriver.Response, _ *seal.Life) { r.SealTag = nil },
		"tag dropped kept": func(r *idemdriver.Response, _ *seal.Life) { r.SealTag = r.SealTagDropped },
		"tag of another":   func(r *idemdriver.Response, _ *seal.Life) { r.SealTag = other.SealTag },
		"blob of another":  func(r *idemdriver.Response, _ *seal.Life) { r.Sealed = other.Sealed },
		"tag truncated":    func(r *idemdriver.Response, _ *seal.Life) { r.SealTag = r.SealTag[:20] },
		"parts": func(r *idemdriver.Response, _ *seal.Life) {
			r.Sealed, r.Request = r.Request, r.Sealed
		},
		"truncated": func(r *idemdriver.Response, _ *seal.Life) { r.Sealed = r.Sealed[:10] },
		"blob format 1": func(r *idemdriver.Response, _ *seal.Life) {
			r.Sealed = append([]byte{1}, r.Sealed[1:]...)
		},
		"tag format 3": func(r *idemdriver.Response, _ *seal.Life) {
			r.SealTag = append([]byte{3}, r.SealTag[1:]...)
		},
	} {
		r, l := sealed, life
		f(&r, &l)
		_, err := kr.OpenResponse(l, r)
		require.ErrorIs(t, err, seal.ErrBroken, name)
	}
	_, err = keyring(t, seal.Key{ID: "b", Secret: a.Secret}).OpenResponse(life, sealed)
	require.ErrorIs(t, err, seal.ErrKeyMissing)
	_, err = (*seal.Keyring)(nil).OpenResponse(life, sealed)
	require.ErrorIs(t, err, seal.ErrKeyMissing)
	forged := sealed
	forged.SealKey = "b"
	_, err = keyring(t, seal.Key{ID: "b", Secret: bytes.Repeat([]byte{2}, 16)}).OpenResponse(life, forged)
	require.ErrorIs(t, err, seal.ErrBroken, "another key id with another secret")
	plain, err := (*seal.Keyring)(nil).SealResponse(life, resp)
	require.NoError(t, err)
	require.Equal(t, resp, plain, "a nil keyring seals nothing")
}

// A driver that drops the blob for its database's packet stores
// SealTagDropped in SealTag's place and BodyStored false: the record opens
// with its status and size, no headers and no body. The same columns
// under the kept blob's tag, or with the flag set again, do not.
func TestSealDroppedBlob(t *testing.T) {
	t.Parallel()
	kr := keyring(t, seal.Key{ID: "a", Secret: bytes.Repeat([]byte{1}, 32)})
	for _, stored := range []bool{true, false} {
		resp := idemdriver.Response{Status: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("body"),
			BodyStored: stored, BodySize: 4, Request: []byte("req")}
		sealed, err := kr.SealResponse(life, resp)
		require.NoError(t, err)
		dropped := sealed
		dropped.Sealed, dropped.Request, dropped.BodyStored, dropped.SealTag = nil, nil, false, sealed.SealTagDropped
		opened, err := kr.OpenResponse(life, dropped)
		require.NoError(t, err, "stored %v", stored)
		require.Equal(t, idemdriver.Response{Status: 201, Header: map[string][]string{}, Body: []byte{}, BodySize: 4}, opened)
		for name, f := range map[string]func(r *idemdriver.Response){
			"stored again": func(r *idemdriver.Response) { r.BodyStored = true },
			"status":       func(r *idemdriver.Response) { r.Status = 200 },
			"kept tag":     func(r *idemdriver.Response) { r.SealTag = sealed.SealTag },
			"blob back":    func(r *idemdriver.Response) { r.Sealed = sealed.Sealed },
		} {
			r := dropped
			f(&r)
			_, err := kr.OpenResponse(life, r)
			require.ErrorIs(t, err, seal.ErrBroken, "stored %v: %s", stored, name)
		}
	}
}

// Records sealed before seal tags (format 1, written by the idem before
// this one; the blobs below are such records, of key "v1", for acct/k1
// and acct/k2) open by their blob alone, which binds scope, key and the
// plain columns; without the blob they authenticate nothing.
func TestSealFormat1StillOpens(t *testing.T) {
	t.Parallel()
	kr := keyring(t, seal.Key{ID: "v2", Secret: bytes.Repeat([]byte{8}, 32)}, seal.Key{ID: "v1", Secret: bytes.Repeat([]byte{7}, 32)})
	unhex := func(s string) []byte {
		b, err := hex.DecodeString(s)
		require.NoError(t, err)
		return b
	}
	stored := idemdriver.Response{Status: 201, BodyStored: true, BodySize: 13, SealKey: "v1",
		Sealed:  unhex("0112c8264dc559ba30340179fcee48695e80814f9ede99db636a91bf07f60b7439cc34fbd1a71520f837b3d65e7a6398f021c0fd0d56522e2b70cc7689841004cc08ca967c90c4"),
		Request: unhex("019b67d1bcb7c60872bb8616ad6972a3b23bf4c6bcaa21ba05a36a92b09327f5f4d2e5ddb38a2c10b98df744")}
	anyLife := seal.Life{Scope: "acct", Key: "k1", Created: time.Now()} // format 1 does not bind the life
	opened, err := kr.OpenResponse(anyLife, stored)
	require.NoError(t, err)
	require.Equal(t, `{"id":"ch_1"}`, string(opened.Body))
	require.Equal(t, []string{"/charges/1"}, opened.Header["Location"])
	req, err := seal.DecodeRequest(opened.Request)
	require.NoError(t, err)
	require.Equal(t, "req", string(req.Body))

	notStored := idemdriver.Response{Status: 201, BodySize: 5 << 20, SealKey: "v1",
		Sealed: unhex("0187e576de4fe888b132047f0a591fd6916ed21ef11139e016097a8b031a19761c3c1be27b47c1656a890b2c89721f38f334b23afdb8f5fe2a8b")}
	opened, err = kr.OpenResponse(seal.Life{Scope: "acct", Key: "k2"}, notStored)
	require.NoError(t, err)
	require.Equal(t, []string{"/charges/2"}, opened.Header["Location"])
	require.False(t, opened.BodyStored)

	for name, f := range map[string]func(r *idemdriver.Response, l *seal.Life){
		"other key":       func(_ *idemdriver.Response, l *seal.Life) { l.Key = "k2" },
		"status":          func(r *idemdriver.Response, _ *seal.Life) { r.Status = 200 },
		"emptied":         func(r *idemdriver.Response, _ *seal.Life) { r.Sealed, r.BodyStored = nil, false },
		"emptied, status": func(r *idemdriver.Response, _ *seal.Life) { r.Sealed, r.BodyStored, r.Status = nil, false, 200 },
		"tag planted":     func(r *idemdriver.Response, _ *seal.Life) { r.SealTag = append([]byte{2}, make([]byte, 32)...) },
	} {
		r, l := stored, anyLife
		f(&r, &l)
		_, err := kr.OpenResponse(l, r)
		require.ErrorIs(t, err, seal.ErrBroken, name)
	}
}

func TestParseKeys(t *testing.T) {
	t.Parallel()
	secret := bytes.Repeat([]byte{9}, 24)
	keys, err := seal.ParseKeys("new:" + base64.StdEncoding.EncodeToString(secret) + ", old:" + base64.RawURLEncoding.EncodeToString(secret))
	require.NoError(t, err)
	require.Equal(t, []seal.Key{{ID: "new", Secret: secret}, {ID: "old", Secret: secret}}, keys)
	for _, bad := range []string{"nocolon", "a:!!!", ":" + base64.StdEncoding.EncodeToString(secret), "a:AAAA"} {
		_, err := seal.ParseKeys(bad)
		require.Error(t, err, bad)
	}
	_, err = seal.NewKeyring([]seal.Key{{ID: "a", Secret: secret}, {ID: "a", Secret: secret}})
	require.ErrorContains(t, err, `[1].ID "a" repeats the id of [0]`)
}

func TestHashKey(t *testing.T) {
	t.Parallel()
	h := seal.HashKey([]byte("secret"), "order-1")
	require.Len(t, h, seal.HashedKeyLength)
	require.Equal(t, h, seal.HashKey([]byte("secret"), "order-1"))
	require.NotEqual(t, h, seal.HashKey([]byte("secret2"), "order-1"))
	require.NotEqual(t, h, seal.HashKey([]byte("secret"), "order-2"))
	require.Equal(t, "h1_", h[:3])
}

// A step's blob opens only as what it was sealed as: its part, its step's
// name, its record's life and its key; a nil keyring and key id "" pass
// the data through.
func TestSealStepBindsPartNameAndLife(t *testing.T) {
	t.Parallel()
	a := seal.Key{ID: "a", Secret: bytes.Repeat([]byte{1}, 16)}
	kr := keyring(t, a)
	blob, id := kr.SealStep(life, seal.PartStepResult, "charge", []byte(`{"v":1}`))
	require.Equal(t, "a", id)
	require.NotContains(t, string(blob), `{"v":1}`)
	plain, err := kr.OpenStep(life, seal.PartStepResult, "charge", id, blob)
	require.NoError(t, err)
	require.Equal(t, `{"v":1}`, string(plain))

	other := life
	other.Created = other.Created.Add(time.Microsecond)
	for name, open := range map[string]func() ([]byte, error){
		"another step": func() ([]byte, error) { return kr.OpenStep(life, seal.PartStepResult, "refund", id, blob) },
		"another part": func() ([]byte, error) { return kr.OpenStep(life, seal.PartStepRelay, "charge", id, blob) },
		"another life": func() ([]byte, error) { return kr.OpenStep(other, seal.PartStepResult, "charge", id, blob) },
		"edited": func() ([]byte, error) {
			b := bytes.Clone(blob)
			b[len(b)-1] ^= 1
			return kr.OpenStep(life, seal.PartStepResult, "charge", id, b)
		},
		"empty": func() ([]byte, error) { return kr.OpenStep(life, seal.PartStepResult, "charge", id, nil) },
	} {
		_, err := open()
		require.ErrorIs(t, err, seal.ErrBroken, name)
	}
	_, err = kr.OpenStep(life, seal.PartStepResult, "charge", "gone", blob)
	require.ErrorIs(t, err, seal.ErrKeyMissing)

	var none *seal.Keyring
	blob, id = none.SealStep(life, seal.PartStepResult, "charge", []byte("plain"))
	require.Equal(t, "", id)
	plain, err = none.OpenStep(life, seal.PartStepResult, "charge", id, blob)
	require.NoError(t, err)
	require.Equal(t, "plain", string(plain))
}
