package idem_test

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
)

func TestParseKey(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		values  []string
		want    string
		wantErr error
	}{
		{"bare token", []string{"abc-123"}, "abc-123", nil},
		{"sf-string", []string{`"abc-123"`}, "abc-123", nil},
		{"sf-string with parameters (ignored, RFC 8941 3.1.2)", []string{`"abc";v=1`}, "abc", nil},
		{"other parameters name the same key", []string{`"abc";v=2;w`}, "abc", nil},
		{"malformed parameter (upper-case name)", []string{`"abc";V=1`}, "", idem.ErrInvalidKey},
		{"bare form is taken whole, semicolon included", []string{`abc;v=1`}, "abc;v=1", nil},
		{"surrounding whitespace", []string{"  abc \t"}, "abc", nil},
		{"UUID", []string{"8e03978e-40d5-43e8-bc93-6894a57f9324"}, "8e03978e-40d5-43e8-bc93-6894a57f9324", nil},
		{"all visible ASCII but comma", []string{"!#$%&'()*+-./:;<=>?@[\\]^_`{|}~"}, "!#$%&'()*+-./:;<=>?@[\\]^_`{|}~", nil},
		{"quoted comma is one string", []string{`"a,b"`}, "a,b", nil},
		{"escaped quote in sf-string", []string{`"a\"b"`}, `a"b`, nil},
		{"255 characters", []string{strings.Repeat("k", 255)}, strings.Repeat("k", 255), nil},
		{"missing", nil, "", idem.ErrMissingKey},
		{"two field lines", []string{"a", "a"}, "", idem.ErrInvalidKey},
		{"comma-joined list", []string{"k, k"}, "", idem.ErrInvalidKey},
		{"comma-joined sf-strings", []string{`"k", "k"`}, "", idem.ErrInvalidKey},
		{"empty", []string{""}, "", idem.ErrInvalidKey},
		{"blank", []string{"   "}, "", idem.ErrInvalidKey},
		{"empty sf-string", []string{`""`}, "", idem.ErrInvalidKey},
		{"256 characters", []string{strings.Repeat("k", 256)}, "", idem.ErrInvalidKey},
		{"inner space", []string{"a b"}, "", idem.ErrInvalidKey},
		{"space in sf-string", []string{`"a b"`}, "", idem.ErrInvalidKey},
		{"tab", []string{"a\tb"}, "", idem.ErrInvalidKey},
		{"DEL", []string{"a\x7f"}, "", idem.ErrInvalidKey},
		{"non-ASCII", []string{"café"}, "", idem.ErrInvalidKey},
		{"unterminated sf-string", []string{`"abc`}, "", idem.ErrInvalidKey},
		{"sf-integer is not a string", []string{`"1" 2`}, "", idem.ErrInvalidKey},
		{"NUL", []string{"a\x00b"}, "", idem.ErrInvalidKey},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := idem.ParseKey(tc.values)
			if tc.wantErr != nil {
				require.ErrorIs(t, err, tc.wantErr)
				require.Empty(t, got)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.want, got)
		})
	}
}

func FuzzParseKey(f *testing.F) {
	for _, s := range []string{"abc", `"abc"`, `"a\"b";x=1`, "k, k", "", strings.Repeat("x", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		key, err := idem.ParseKey([]string{v})
		if err != nil {
			return
		}
		// Every accepted key is 1-255 visible ASCII characters.
		require.NotEmpty(t, key)
		require.LessOrEqual(t, len(key), idem.MaxKeyLength)
		for i := 0; i < len(key); i++ {
			require.True(t, key[i] >= 0x21 && key[i] <= 0x7e, "byte %d of %q", i, key)
		}
	})
}

// Parameters on the sf-string form are ignored (docs/problems.md#invalid-key):
// "p";x=1 and "p";x=2 name one key, the key of "p", so the second request
// is a retry of the first (a replay, or 422 key-reused for another body),
// never a second execution.
func TestParseKeyParametersNameOneKey(t *testing.T) {
	t.Parallel()
	var keys []string
	for _, v := range []string{`"p";x=1`, `"p";x=2`, `"p"`, `p`} {
		k, err := idem.ParseKey([]string{v})
		require.NoError(t, err, v)
		keys = append(keys, k)
	}
	require.Equal(t, []string{"p", "p", "p", "p"}, keys)
}
