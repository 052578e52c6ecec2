package main

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/internal/proctest"
)

// The program as the README's "In your own server" says, against the real
// cmd/fakepsp on a fresh database (a schema of TEST_DATABASE_URL; fakepsp
// on an SQLite file): it creates its table, the first POST charges once
// and answers 201, its retry gets the same 201 replayed, and the provider
// holds one charge. Regression (issue 35): the program never created its
// payments table and called the provider without Authorization, currency
// or customer, so every POST answered 503 with nothing logged.
func TestInYourOwnServer(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	bin := proctest.Build(t, ".", "github.com/idemgo/idem/cmd/fakepsp")
	psp := run(t, filepath.Join(bin, "fakepsp"), nil, "--database-url", filepath.Join(t.TempDir(), "fakepsp.db"), "--log-format", "text")
	server := run(t, filepath.Join(bin, "postgres"),
		[]string{"DATABASE_URL=" + url, "PROVIDER_URL=http://" + psp, "PROVIDER_KEY=sk_test_shop"})

	pay := func() (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, "http://"+server+"/v1/payments",
			strings.NewReader(`{"amount":1000,"currency":"EUR","customer":"cus_42"}`))
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer acct_1")
		req.Header.Set("Idempotency-Key", "order-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp, string(body)
	}
	first, body := pay()
	require.Equal(t, http.StatusCreated, first.StatusCode, body)
	require.Empty(t, first.Header.Get("Idempotent-Replayed"))
	require.Regexp(t, `^\{"charge":"ch_[^"]+"\}\n$`, body)
	retry, again := pay()
	require.Equal(t, http.StatusCreated, retry.StatusCode, again)
	require.Equal(t, "true", retry.Header.Get("Idempotent-Replayed"))
	require.Equal(t, body, again, "the same charge, replayed")

	resp, err := http.Get("http://" + psp + "/v1/charges/stats")
	require.NoError(t, err)
	defer resp.Body.Close()
	var stats struct{ Charges int }
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&stats))
	require.Equal(t, 1, stats.Charges, "one charge at the provider")
	db, err := pgxpool.New(t.Context(), url)
	require.NoError(t, err)
	defer db.Close()
	var payments int
	require.NoError(t, db.QueryRow(t.Context(), `SELECT count(*) FROM payments`).Scan(&payments))
	require.Equal(t, 1, payments)
}

// run starts bin with env added and args, on a free port (given both
// ways: ADDR and --addr), waits until it accepts, and returns its address;
// it is killed when t ends.
func run(t *testing.T, bin string, env []string, args ...string) string {
	t.Helper()
	addr := proctest.FreeAddr(t)
	cmd := exec.Command(bin, append(args, "--addr", addr)...)
	cmd.Env = append(os.Environ(), append(env, "ADDR="+addr)...)
	return proctest.Start(t, cmd, addr).Addr
}
