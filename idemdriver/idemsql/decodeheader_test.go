package idemsql

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

// DecodeHeader reads what json.Unmarshal reads, and refuses what it
// refuses, whether or not its fast path (decodePlainHeader) takes the
// input.
func FuzzDecodeHeaderMatchesJSON(f *testing.F) {
	for _, seed := range []string{
		`{}`, `{"Content-Type":["application/json"],"Location":["/v1/payments/pay_1"]}`,
		`{"X-A":["1","2"],"X-B":["a:b","c,d"]}`, `{"A":[]}`, `{"A":null}`, `null`, ``, `{"A":["x"],}`,
		`{"A":["x"]}}`, `{"A":["\u003c"]}`, `{"A":["x"],"A":["y"]}`, `{"A":["x\ty"]}`, "{\"A\":[\"\xff\"]}",
		`{"A":["x"] }`, `{"A":"x"}`, `{"":[""]}`, `{"A":["é"]}`, `{"A":["x"],"B":["y","z"],"C":["w"]}`,
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, gotErr := DecodeHeader(b)
		want := map[string][]string{}
		var wantErr error
		if len(b) > 0 {
			wantErr = json.Unmarshal(b, &want)
		}
		if wantErr != nil {
			require.Error(t, gotErr, "%q", b)
			return
		}
		require.NoError(t, gotErr, "%q", b)
		require.Equal(t, want, got, "%q", b)
	})
}

// What EncodeHeader writes of ordinary headers is read by the fast path.
func TestDecodeHeaderFastPath(t *testing.T) {
	h := map[string][]string{"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}, "X-Multi": {"a", "b:c"}}
	b, err := EncodeHeader(h)
	require.NoError(t, err)
	got, ok := decodePlainHeader(b)
	require.True(t, ok, "%s", b)
	require.Equal(t, h, got)
	// A value with an escape (json.Marshal writes < as \u003c) is read by
	// encoding/json.
	b, err = EncodeHeader(map[string][]string{"Link": {"<https://x>; rel=next"}})
	require.NoError(t, err)
	_, ok = decodePlainHeader(b)
	require.False(t, ok, "%s", b)
	got, err = DecodeHeader(b)
	require.NoError(t, err)
	require.Equal(t, map[string][]string{"Link": {"<https://x>; rel=next"}}, got)
}
