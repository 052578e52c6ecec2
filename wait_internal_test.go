package idem

import (
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestPreferredWait(t *testing.T) {
	for _, tc := range []struct {
		prefer []string
		want   time.Duration
		ok     bool
	}{
		{nil, 0, false},
		{[]string{"wait=5"}, 5 * time.Second, true},
		{[]string{"respond-async, wait=10"}, 10 * time.Second, true},
		{[]string{"WAIT = 3"}, 3 * time.Second, true},
		{[]string{`wait="7"`}, 7 * time.Second, true},
		{[]string{"wait=2; ignored=param"}, 2 * time.Second, true},
		{[]string{"wait=0"}, 0, true},
		{[]string{"return=minimal", "wait=4"}, 4 * time.Second, true},
		{[]string{"wait=4, wait=9"}, 4 * time.Second, true}, // the first counts (RFC 7240 section 2)
		{[]string{"wait=-1"}, 0, false},
		{[]string{"wait=1.5"}, 0, false},
		{[]string{"wait=abc"}, 0, false},
		{[]string{"wait=99999999999"}, 0, false},
		{[]string{"waiting=5"}, 0, false},
	} {
		r, err := http.NewRequest(http.MethodPost, "/", nil)
		require.NoError(t, err)
		for _, v := range tc.prefer {
			r.Header.Add("Prefer", v)
		}
		got, ok := preferredWait(r)
		require.Equal(t, tc.ok, ok, "%q", tc.prefer)
		require.Equal(t, tc.want, got, "%q", tc.prefer)
	}
}
