package main

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/service"
)

// GET /healthz answers 503 once the SQLite file at the database's path is
// not the file the service has open: deleted (the service would go on
// writing to the deleted inode, lost at the next start, and a retried,
// answered key would be charged again) or replaced by another file.
// Regression: /healthz answered 200 in both cases, its reads served by the
// deleted inode.
func TestHealthzNoticesTheSQLiteFileGone(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		damage func(t *testing.T, path string)
	}{
		{"deleted", func(t *testing.T, path string) {
			require.NoError(t, os.Remove(path))
		}},
		{"replaced", func(t *testing.T, path string) {
			require.NoError(t, os.Rename(path, path+".old"))
			require.NoError(t, os.WriteFile(path, nil, 0o644))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "paymentsd.db")
			store := openTestStore(t, "sqlite:"+path)
			s := startServer(t, store, nil)
			require.Equal(t, http.StatusCreated, s.postJSON("acme", "k-1", paymentBody).status)
			require.Equal(t, http.StatusOK, s.do(http.MethodGet, "/healthz", "").status)

			tc.damage(t, path)
			r := s.do(http.MethodGet, "/healthz", "")
			require.Equal(t, http.StatusServiceUnavailable, r.status, "body: %s", r.body)
			require.Equal(t, ProblemTypeBase+service.ProblemUnavailable, r.problem(t)["type"])
			require.Equal(t, "1", r.header.Get("Retry-After"))
			require.Contains(t, r.problem(t)["detail"], "database file")
		})
	}
}
