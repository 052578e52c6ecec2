package seal_test

import (
	"bytes"
	"encoding/base64"
	"testing"

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

func TestSealOpenRoundTrip(t *testing.T) {
	t.Parallel()
	a := seal.Key{ID: "a", Secret: bytes.Repeat([]byte{1}, 16)}
	kr := keyring(t, a)
	resp := idemdriver.Response{Status: 201, Header: map[string][]string{"Location": {"/x/1"}}, Body: []byte("body"),
		BodyStored: true, BodySize: 4, Request: seal.EncodeRequest(seal.Request{Query: "q=1", Size: 3, Body: []byte("req")})}
	sealed, err := kr.SealResponse("s", "k", resp)
	require.NoError(t, err)
	require.Equal(t, "a", sealed.SealKey)
	require.Nil(t, sealed.Header)
	require.Nil(t, sealed.Body)
	require.NotContains(t, string(sealed.Sealed), "body")
	again, err := kr.SealResponse("s", "k", resp)
	require.NoError(t, err)
	require.NotEqual(t, sealed.Sealed, again.Sealed, "a new nonce each seal")

	opened, err := kr.OpenResponse("s", "k", sealed)
	require.NoError(t, err)
	require.Equal(t, resp, opened)
	req, err := seal.DecodeRequest(opened.Request)
	require.NoError(t, err)
	require.Equal(t, seal.Request{Query: "q=1", Size: 3, Body: []byte("req")}, req)

	for name, f := range map[string]func(r *idemdriver.Response) (string, string){
		"other key":   func(*idemdriver.Response) (string, string) { return "s", "k2" },
		"other scope": func(*idemdriver.Response) (string, string) { return "s2", "k" },
		"status":      func(r *idemdriver.Response) (string, string) { r.Status = 200; return "s", "k" },
		"size":        func(r *idemdriver.Response) (string, string) { r.BodySize = 5; return "s", "k" },
		"parts": func(r *idemdriver.Response) (string, string) {
			r.Sealed, r.Request = r.Request, r.Sealed
			return "s", "k"
		},
		"truncated": func(r *idemdriver.Response) (string, string) { r.Sealed = r.Sealed[:10]; return "s", "k" },
	} {
		r := sealed
		scope, key := f(&r)
		_, err := kr.OpenResponse(scope, key, r)
		require.ErrorIs(t, err, seal.ErrBroken, name)
	}
	_, err = keyring(t, seal.Key{ID: "b", Secret: a.Secret}).OpenResponse("s", "k", sealed)
	require.ErrorIs(t, err, seal.ErrKeyMissing)
	_, err = (*seal.Keyring)(nil).OpenResponse("s", "k", sealed)
	require.ErrorIs(t, err, seal.ErrKeyMissing)
	plain, err := (*seal.Keyring)(nil).SealResponse("s", "k", resp)
	require.NoError(t, err)
	require.Equal(t, resp, plain, "a nil keyring seals nothing")
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
