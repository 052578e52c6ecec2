package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/internal/dbtest"
)

// cli runs the command line in-process against url.
type cli struct {
	t   *testing.T
	url string
}

func (c cli) run(args ...string) (stdout, stderr string, code int) {
	c.t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), append([]string{"--database-url", c.url}, args...), &out, &errb)
	return out.String(), errb.String(), code
}

// ok runs a command that must succeed and returns its stdout.
func (c cli) ok(args ...string) string {
	c.t.Helper()
	out, errOut, code := c.run(args...)
	require.Zero(c.t, code, "idem %v: %s", args, errOut)
	return out
}

// json runs a command with --json and decodes its output.
func (c cli) json(args ...string) map[string]any {
	c.t.Helper()
	var v map[string]any
	out := c.ok(append(args, "--json")...)
	require.NoError(c.t, json.Unmarshal([]byte(out), &v), out)
	return v
}

func fp(s string) []byte { sum := sha256.Sum256([]byte(s)); return sum[:] }

// seed writes, with the database clock moved, the records of the tests
// (each claimed by owner "web-1/<key>"):
// acct_1/paid SUCCEEDED, acct_1/busy PROCESSING under its lease, acct_1/failed
// FAILED, acct_2/dead PROCESSING whose lease ran out 9m30s ago, acct_2/old
// SUCCEEDED and expired an hour ago.
func seed(t *testing.T, d idemdriver.Driver) {
	t.Helper()
	ctx := context.Background()
	if p, ok := d.(idemdriver.Partitioner); ok && p.Partitioned() {
		_, err := p.EnsurePartitions(ctx, idemdriver.PartitionParams{DaysAhead: 3, ClockOffset: -48 * time.Hour})
		require.NoError(t, err)
	}
	claim := func(scope, key string, offset, lease time.Duration) idemdriver.Record {
		res, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: scope, Key: key, Method: "POST", Path: "/v1/payments",
			Fingerprint: fp(key), LeaseDuration: lease, Retention: 24 * time.Hour, ClockOffset: offset,
			Owner: "web-1/" + key})
		require.NoError(t, err)
		require.True(t, res.Claimed)
		return res.Record
	}
	complete := func(rec idemdriver.Record, offset time.Duration, body string) {
		ok, err := d.Complete(ctx, idemdriver.CompleteParams{
			FenceParams: idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
				ClockOffset: offset},
			Response: idemdriver.Response{Status: 201, Header: map[string][]string{
				"Content-Type": {"application/json"}, "Location": {"/v1/payments/pay_1"}},
				Body: []byte(body), BodyStored: true, BodySize: int64(len(body))}})
		require.NoError(t, err)
		require.True(t, ok)
	}
	complete(claim("acct_1", "paid", 0, 30*time.Second), 0, `{"id":"pay_1","amount":1000,"currency":"JPY","customer":"cus_42","status":"succeeded"}`)
	claim("acct_1", "busy", 0, 30*time.Second)
	failed := claim("acct_1", "failed", 0, 30*time.Second)
	ok, err := d.Fail(ctx, idemdriver.FenceParams{Scope: "acct_1", Key: "failed", FencingToken: failed.FencingToken,
		CreatedAt: failed.CreatedAt})
	require.NoError(t, err)
	require.True(t, ok)
	claim("acct_2", "dead", -10*time.Minute, 30*time.Second)
	complete(claim("acct_2", "old", -25*time.Hour, 30*time.Second), -25*time.Hour, `{"id":"pay_0"}`)
}

// expire writes n records of scope that expired an hour ago.
func expire(t *testing.T, d idemdriver.Driver, scope string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		res, err := d.Claim(context.Background(), idemdriver.ClaimParams{Scope: scope, Key: fmt.Sprint("exp-", i),
			Method: "POST", Path: "/v1/payments", Fingerprint: fp("b"), LeaseDuration: time.Second,
			Retention: 24 * time.Hour, ClockOffset: -25 * time.Hour})
		require.NoError(t, err)
		require.True(t, res.Claimed)
	}
}

type backend struct {
	name        string
	partitioned bool
	// setup returns the --database-url and a driver on the same database.
	setup func(t *testing.T, partitioned bool) (string, idemdriver.Driver)
}

func sqliteBackend(t *testing.T, _ bool) (string, idemdriver.Driver) {
	path := dbtest.SQLitePath(t)
	d, err := idemsqlite.Open(context.Background(), path)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return "sqlite:" + path, d
}

func postgresBackend(t *testing.T, partitioned bool) (string, idemdriver.Driver) {
	url, _ := dbtest.PostgresURL(t)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	if partitioned {
		return url, idempgx.NewPartitioned(pool, idempgx.PartitionConfig{})
	}
	return url, idempgx.New(pool)
}

func mysqlBackend(t *testing.T, _ bool) (string, idemdriver.Driver) {
	url, _ := dbtest.MySQLURL(t)
	d, err := idemmysql.Open(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(func() { d.Close() })
	return url, d
}

// migrateUp is the command line of migrate up on b.
func (b backend) migrateUp() []string {
	if b.partitioned {
		return []string{"migrate", "up", "--partitioned"}
	}
	return []string{"migrate", "up"}
}

var backends = []backend{
	{"SQLite", false, sqliteBackend},
	{"PostgreSQL", false, postgresBackend},
	{"PostgreSQLPartitioned", true, postgresBackend},
	{"MySQL", false, mysqlBackend},
}

func TestCommands(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t: t, url: url}

			// migrate
			up := b.migrateUp()
			out := c.ok(up...)
			require.Contains(t, out, "VERSION")
			require.Contains(t, out, "00001_idem_keys.sql")
			require.Contains(t, out, "applied")
			require.NotContains(t, out, "pending")
			out = c.ok("migrate", "status")
			require.Regexp(t, `1\s+00001_idem_keys.sql\s+applied\s+\d{4}-`, out)
			st := c.json("migrate", "status")
			require.Equal(t, b.partitioned, st["partitioned"])
			for _, m := range st["migrations"].([]any) {
				require.Equal(t, true, m.(map[string]any)["applied"])
			}
			seed(t, d)

			// inspect: one key's story
			// Regression (a fresh user's operator): the key as the server
			// echoes it, an sf-string, was not found; idem stores its value.
			require.Contains(t, c.ok("inspect", "--scope", "acct_1", "--key", `"paid"`), hex.EncodeToString(fp("paid")))
			out = c.ok("inspect", "--scope", "acct_1", "--key", "paid")
			for _, want := range []string{"state", "SUCCEEDED", "replay of the stored 201 response",
				"fingerprint", hex.EncodeToString(fp("paid")), "fencing token", "Content-Type: application/json",
				`"{\"id\":\"pay_1\",\"amount\":1000,`, "more bytes)", "expires in 23h59m", "now (database)"} {
				require.Contains(t, out, want)
			}
			rec := c.json("inspect", "--scope", "acct_1", "--key", "paid")
			require.Equal(t, "SUCCEEDED", rec["state"])
			require.EqualValues(t, 1, rec["fencing_token"])
			require.EqualValues(t, 1, rec["attempts"])
			require.Equal(t, hex.EncodeToString(fp("paid")), rec["fingerprint"])
			resp := rec["response"].(map[string]any)
			require.EqualValues(t, 201, resp["status"])
			require.EqualValues(t, len(`{"id":"pay_1","amount":1000,"currency":"JPY","customer":"cus_42","status":"succeeded"}`), resp["body_size"])
			require.Len(t, resp["body_head"], bodyPreview)
			require.InDelta(t, 24*3600, rec["expires_in_seconds"], 60)

			out = c.ok("inspect", "--scope", "acct_1", "--key", "busy")
			// The server's Retry-After is its in-flight delay
			// (Config.InFlightRetryAfter, unknown here), not the lease left
			// (regression: inspect said "Retry-After 30" for a 30 s lease).
			require.Regexp(t, `next request\s+409 request-in-flight \(lease [\d.]+s left; `+
				`Retry-After is the server's in-flight delay, 1 s by default, at most the lease left\)`, out)
			require.NotRegexp(t, `Retry-After \d`, out)
			busy := c.json("inspect", "--scope", "acct_1", "--key", "busy")
			require.InDelta(t, 30, busy["lease_left_seconds"], 10)
			require.Nil(t, busy["response"])
			require.Contains(t, c.ok("inspect", "--scope", "acct_2", "--key", "dead"), "takes over with the next fencing token")
			require.Contains(t, c.ok("inspect", "--scope", "acct_1", "--key", "failed"), "runs again")
			require.Contains(t, c.ok("inspect", "--scope", "acct_2", "--key", "old"), "runs as a new request: the record expired")
			_, errOut, code := c.run("inspect", "--scope", "acct_1", "--key", "nope")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, `no record for scope "acct_1" and key "nope"`)
			_, _, code = c.run("inspect", "--scope", "acct_1")
			require.Equal(t, 2, code, "--key is required")

			// stuck
			out = c.ok("stuck")
			require.Contains(t, out, "LEASE RAN OUT")
			require.Regexp(t, `acct_2\s+dead\s+9m\d+s ago\s+1\s+1\s+POST /v1/payments`, out)
			stuck := c.json("stuck")["stuck"].([]any)
			require.Len(t, stuck, 1)
			s0 := stuck[0].(map[string]any)
			require.Equal(t, "dead", s0["key"])
			require.InDelta(t, 570, s0["overdue_seconds"], 30)

			// stats
			out = c.ok("stats", "--top", "1")
			require.Regexp(t, `records\s+5\n`, out)
			require.Regexp(t, `SUCCEEDED\s+2\n`, out)
			require.Regexp(t, `expired, not purged\s+1\n`, out)
			require.Regexp(t, `stuck \(PROCESSING past lease\)\s+1\n`, out)
			require.Regexp(t, `oldest record\s+\S+ \S+ \(25h0m\d+s ago\)`, out)
			require.Regexp(t, `SCOPE\s+RECORDS\nacct_1\s+3\n$`, out)
			stats := c.json("stats")
			require.EqualValues(t, 5, stats["total"])
			require.Equal(t, map[string]any{"PROCESSING": 2.0, "SUCCEEDED": 2.0, "FAILED": 1.0, "UNKNOWN": 0.0}, stats["by_state"])
			require.Len(t, stats["top_scopes"], 2)
			require.EqualValues(t, 1, stats["expired_not_purged"])

			// purge
			require.Contains(t, c.ok("purge", "--dry-run"), "would purge 1 records (every expired record)")
			require.EqualValues(t, 0, c.json("purge", "--dry-run", "--older-than", "2h")["would_purge"])
			require.Contains(t, c.ok("purge", "--older-than", "2h"), "purged 0 records in 1 batches of at most 1000 (records expired more than 2h0m0s ago)")
			p := c.json("purge", "--batch", "10")
			require.EqualValues(t, 1, p["purged"])
			require.EqualValues(t, 1, p["batches"])
			_, errOut, code = c.run("inspect", "--scope", "acct_2", "--key", "old")
			require.Equal(t, 1, code, errOut)
			_, _, code = c.run("purge", "--batch", "0")
			require.Equal(t, 2, code)
			// Several batches, and --max-batches.
			expire(t, d, "acct_3", 5)
			require.Contains(t, c.ok("purge", "--batch", "2", "--max-batches", "1"), "purged 2 records in 1 batches of at most 2 (every expired record)")
			p = c.json("purge", "--batch", "2")
			require.EqualValues(t, 3, p["purged"])
			require.EqualValues(t, 2, p["batches"], "a short batch ends the purge")
			require.EqualValues(t, 0, c.json("purge", "--dry-run")["would_purge"])

			// partitions
			if !b.partitioned {
				_, errOut, code := c.run("partitions", "list")
				require.Equal(t, 1, code)
				if b.name == "SQLite" || b.name == "MySQL" {
					require.Contains(t, errOut, "partitions are PostgreSQL's partitioned mode")
				} else {
					require.Contains(t, errOut, "idem_keys is not partitioned")
				}
			} else {
				now := time.Now().UTC()
				out = c.ok("partitions", "list")
				require.Contains(t, out, "PARTITION")
				require.Contains(t, out, idempgx.PartitionPrefix+now.Format("20060102"))
				created := c.json("partitions", "ensure", "--days-ahead", "10")["created"].([]any)
				require.Len(t, created, 3, "days 8 to 10 ahead")
				require.Equal(t, "created 0 partitions\n", c.ok("partitions", "ensure", "--days-ahead", "10"))
				twoDaysAgo := idempgx.PartitionPrefix + now.AddDate(0, 0, -2).Format("20060102")
				out = c.ok("partitions", "drop", "--dry-run")
				require.Contains(t, out, "would drop")
				require.Contains(t, out, twoDaysAgo)
				require.Contains(t, c.ok("partitions", "list"), twoDaysAgo, "a dry run drops nothing")
				dropped := c.json("partitions", "drop")["dropped"].([]any)
				require.NotEmpty(t, dropped)
				require.Equal(t, twoDaysAgo, dropped[0].(map[string]any)["name"])
				require.NotContains(t, c.ok("partitions", "list"), twoDaysAgo)
				_, errOut, code := c.run("migrate", "up", "--partitioned")
				require.Zero(t, code, errOut)
			}

			// migrate down, one step
			out = c.ok("migrate", "down")
			require.Contains(t, out, "rolled back")
			st = c.json("migrate", "status")
			list := st["migrations"].([]any)
			last := list[len(list)-1].(map[string]any)
			require.Equal(t, false, last["applied"])
			require.Nil(t, last["applied_at"])
			require.Contains(t, c.ok("migrate", "status"), "pending")
			// and up again, then down, with --json
			st = c.json(up...)
			for _, m := range st["migrations"].([]any) {
				require.Equal(t, true, m.(map[string]any)["applied"])
			}
			down := c.json("migrate", "down")["rolled_back"].(map[string]any)
			require.Equal(t, last["version"], down["version"])
			require.Equal(t, last["name"], down["name"])
		})
	}
}

func TestPartitionedFlagOnPlainTable(t *testing.T) {
	t.Parallel()
	url, _ := postgresBackend(t, false)
	c := cli{t: t, url: url}
	c.ok("migrate", "up")
	_, errOut, code := c.run("migrate", "up", "--partitioned")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "idem_keys exists and is not partitioned")
}

// MySQL stores are not partitioned: the partitioned mode and the
// partition commands are refused with a clear error.
func TestMySQLHasNoPartitions(t *testing.T) {
	t.Parallel()
	url, _ := mysqlBackend(t, false)
	c := cli{t: t, url: url}
	_, errOut, code := c.run("migrate", "up", "--partitioned")
	require.Equal(t, 1, code)
	require.Contains(t, errOut, "--partitioned is PostgreSQL's partitioned mode; MySQL stores are not partitioned")
	require.Equal(t, "mysql", c.json("migrate", "up")["database"])
	for _, args := range [][]string{{"partitions", "ensure"}, {"partitions", "drop", "--dry-run"}, {"partitions", "list", "--json"}} {
		_, errOut, code := c.run(args...)
		require.Equal(t, 1, code, args)
		require.Contains(t, errOut, "partitions are PostgreSQL's partitioned mode; this mysql store has none", args)
	}
}

func TestDatabaseURLs(t *testing.T) {
	for _, tc := range []struct{ in, kind, target string }{
		{"postgres://u@h/db", "postgres", "postgres://u@h/db"},
		{"postgresql://u@h/db?search_path=s", "postgres", "postgresql://u@h/db?search_path=s"},
		{"mysql://root@127.0.0.1:3306/test", "mysql", "mysql://root@127.0.0.1:3306/test"},
		{"sqlite:/tmp/a.db", "sqlite", "/tmp/a.db"},
		{"sqlite:///tmp/a.db", "sqlite", "/tmp/a.db"},
		{"file:idem.db", "sqlite", "idem.db"},
		{"idem.db", "sqlite", "idem.db"},
	} {
		kind, target, err := parseDatabaseURL(tc.in)
		require.NoError(t, err, tc.in)
		require.Equal(t, tc.kind, kind, tc.in)
		require.Equal(t, tc.target, target, tc.in)
	}
	for _, bad := range []string{"", "redis://x", "sqlite:"} {
		_, _, err := parseDatabaseURL(bad)
		require.Error(t, err, bad)
	}
	var out, errb bytes.Buffer
	require.Equal(t, 1, run(context.Background(), []string{"stats"}, &out, &errb))
	require.True(t, strings.Contains(errb.String(), "--database-url"), errb.String())
}

// A mistyped SQLite path is refused, not created empty (regression: `idem
// --database-url nonexist.db stats` left an empty nonexist.db behind and
// said "no such table: idem_keys"); migrate up still creates the file.
func TestMissingSQLiteFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nonexist.db")
	c := cli{t: t, url: path}
	for _, args := range [][]string{{"stats"}, {"stuck"}, {"inspect", "--scope", "s", "--key", "k"}, {"purge"}, {"migrate", "status"}} {
		_, errOut, code := c.run(args...)
		require.Equal(t, 1, code, "idem %v", args)
		require.Contains(t, errOut, "no SQLite database at "+path, "idem %v", args)
		_, err := os.Stat(path)
		require.ErrorIs(t, err, fs.ErrNotExist, "idem %v created the file", args)
	}
	c.ok("migrate", "up")
	require.FileExists(t, path)
	c.ok("stats")
}

// forEachSeeded runs f as a parallel subtest per backend, on a migrated
// store seeded by seed.
func forEachSeeded(t *testing.T, f func(t *testing.T, c cli, d idemdriver.Driver)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t: t, url: url}
			c.ok(b.migrateUp()...)
			seed(t, d)
			f(t, c, d)
		})
	}
}

// The 3 a.m. commands (issue 13 item 11) on every database: list by state
// and scope, a page at a time; inspect --body; inspect without --scope
// searching every scope instead of the "global" one.
func TestListAndInspectAcrossScopes(t *testing.T) {
	forEachSeeded(t, func(t *testing.T, c cli, d idemdriver.Driver) {

		// list --state, with and without --scope
		out := c.ok("list", "--state", "processing")
		require.Regexp(t, `SCOPE\s+KEY\s+STATE`, out)
		require.Regexp(t, `acct_1\s+busy\s+PROCESSING\s+1\s+1\s+POST /v1/payments`, out)
		require.Regexp(t, `acct_2\s+dead\s+PROCESSING`, out)
		require.NotContains(t, out, "paid")
		require.NotContains(t, out, "next page")
		l := c.json("list", "--state", "SUCCEEDED")
		recs := l["records"].([]any)
		require.Len(t, recs, 2)
		require.Equal(t, "acct_1", recs[0].(map[string]any)["scope"])
		require.Equal(t, "paid", recs[0].(map[string]any)["key"])
		require.EqualValues(t, 201, recs[0].(map[string]any)["response_status"])
		require.Equal(t, "old", recs[1].(map[string]any)["key"], "expired records are listed until purged")
		require.Nil(t, l["next"])
		l = c.json("list", "--state", "FAILED", "--scope", "acct_1")
		require.Len(t, l["records"], 1)
		require.Equal(t, "failed", l["records"].([]any)[0].(map[string]any)["key"])
		require.Empty(t, c.json("list", "--state", "FAILED", "--scope", "acct_2")["records"])
		require.Contains(t, c.ok("list", "--state", "FAILED", "--scope", "acct_2"), "no record")

		// pages: every record once, in (scope, key) order
		var seen []string
		after := []string{}
		for range 10 {
			page := c.json(append([]string{"list", "--limit", "2"}, after...)...)
			for _, r := range page["records"].([]any) {
				m := r.(map[string]any)
				seen = append(seen, m["scope"].(string)+"/"+m["key"].(string))
			}
			next, ok := page["next"].(map[string]any)
			if !ok {
				break
			}
			after = []string{"--after-scope", next["after_scope"].(string), "--after-key", next["after_key"].(string)}
		}
		require.Equal(t, []string{"acct_1/busy", "acct_1/failed", "acct_1/paid", "acct_2/dead", "acct_2/old"}, seen)
		out = c.ok("list", "--limit", "2")
		require.Contains(t, out, "next page: idem list --limit 2 --after-scope acct_1 --after-key failed")
		for _, bad := range [][]string{{"list", "--state", "DONE"}, {"list", "--limit", "0"}, {"list", "--after-scope", "a"}} {
			_, _, code := c.run(bad...)
			require.Equal(t, 2, code, bad)
		}

		// inspect --body: the whole body, not its first 64 bytes
		whole := `{"id":"pay_1","amount":1000,"currency":"JPY","customer":"cus_42","status":"succeeded"}`
		out = c.ok("inspect", "--scope", "acct_1", "--key", "paid", "--body")
		require.Contains(t, out, fmt.Sprintf("body (%d bytes):\n%s\n", len(whole), whole))
		rec := c.json("inspect", "--scope", "acct_1", "--key", "paid", "--body")
		resp := rec["response"].(map[string]any)
		require.Equal(t, whole, resp["body"])
		require.Equal(t, base64.StdEncoding.EncodeToString([]byte(whole)), resp["body_base64"])
		require.NotContains(t, c.json("inspect", "--scope", "acct_1", "--key", "paid")["response"], "body")

		// inspect without --scope: every scope is searched
		rec = c.json("inspect", "--key", "dead")
		require.Equal(t, "acct_2", rec["scope"], "found in its scope, not looked up in \"global\"")
		_, errOut, code := c.run("inspect", "--key", "nope")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, `no record for key "nope" in any scope`)
		claimed, err := d.Claim(context.Background(), idemdriver.ClaimParams{Scope: "acct_3", Key: "busy", Method: "POST",
			Path: "/v1/payments", Fingerprint: fp("busy"), LeaseDuration: time.Minute, Retention: time.Hour})
		require.NoError(t, err)
		require.True(t, claimed.Claimed)
		out, errOut, code = c.run("inspect", "--key", "busy")
		require.Equal(t, 2, code, "two scopes hold the key: --scope must choose")
		require.Contains(t, errOut, `2 scopes hold key "busy" (listed above): give --scope`)
		require.Regexp(t, `acct_1\s+busy`, out)
		require.Regexp(t, `acct_3\s+busy`, out)
		require.Equal(t, "acct_3", c.json("inspect", "--key", "busy", "--scope", "acct_3")["scope"])
	})
}

// stuck says whose worker died (the claim's owner); release removes one
// record, fenced, refusing a live lease or a stored response without
// --force (issue 13 item 11), on every database.
func TestStuckOwnerAndRelease(t *testing.T) {
	forEachSeeded(t, func(t *testing.T, c cli, d idemdriver.Driver) {
		ctx := context.Background()

		// stuck and inspect name the owner
		require.Regexp(t, `acct_2\s+dead\s+9m\d+s ago.*web-1/dead\n`, c.ok("stuck"))
		require.Equal(t, "web-1/dead", c.json("stuck")["stuck"].([]any)[0].(map[string]any)["owner"])
		require.Regexp(t, `owner\s+web-1/busy\n`, c.ok("inspect", "--scope", "acct_1", "--key", "busy"))
		require.Equal(t, "web-1/busy", c.json("inspect", "--scope", "acct_1", "--key", "busy")["owner"])
		require.Regexp(t, `acct_1\s+failed\s+FAILED.*web-1/failed`, c.ok("list", "--state", "FAILED"))

		// a stuck record: refused without --force (regression: it was
		// released, and the next request ran under a new created_at, so a
		// new relayed key, and the provider charged a second time); the
		// record stays as it was.
		_, errOut, code := c.run("release", "--scope", "acct_2", "--key", "dead")
		require.Equal(t, 1, code, errOut)
		for _, want := range []string{"not released", "its lease ran out", "the next request with the key takes it over under the same relayed key",
			"nothing to release", "would charge again", "--force"} {
			require.Contains(t, errOut, want)
		}
		dead := c.json("inspect", "--scope", "acct_2", "--key", "dead")
		require.Equal(t, "PROCESSING", dead["state"], "nothing removed")
		require.EqualValues(t, 1, dead["fencing_token"])
		require.Contains(t, c.ok("release", "--scope", "acct_2", "--key", "dead", "--force"),
			"released acct_2/dead (PROCESSING, fencing token 1): its next request runs as new")
		_, errOut, code = c.run("inspect", "--scope", "acct_2", "--key", "dead")
		require.Equal(t, 1, code, errOut)
		res, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct_2", Key: "dead", Method: "POST", Path: "/v1/other",
			Fingerprint: fp("other"), LeaseDuration: time.Second, Retention: time.Hour})
		require.NoError(t, err)
		require.True(t, res.Claimed, "another request takes the released key")

		// a live lease: refused, then --force
		_, errOut, code = c.run("release", "--scope", "acct_1", "--key", "busy")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "not released: its lease is live for")
		require.Contains(t, errOut, "(web-1/busy)")
		require.Contains(t, errOut, "--force")
		require.Equal(t, "PROCESSING", c.json("inspect", "--scope", "acct_1", "--key", "busy")["state"], "nothing removed")
		rel := c.json("release", "--scope", "acct_1", "--key", "busy", "--force")["released"].(map[string]any)
		require.Equal(t, "web-1/busy", rel["owner"])
		_, _, code = c.run("inspect", "--scope", "acct_1", "--key", "busy")
		require.Equal(t, 1, code)

		// FAILED: refused without --force (regression, as the stuck record:
		// a FAILED attempt may have charged before it failed), then --force
		_, errOut, code = c.run("release", "--scope", "acct_1", "--key", "failed")
		require.Equal(t, 1, code, errOut)
		for _, want := range []string{"not released", "it FAILED", "runs again under the same relayed key",
			"would charge again", "no side effect happened", "reconciled", "--force"} {
			require.Contains(t, errOut, want)
		}
		require.Equal(t, "FAILED", c.json("inspect", "--scope", "acct_1", "--key", "failed")["state"], "nothing removed")
		require.Contains(t, c.ok("release", "--scope", "acct_1", "--key", "failed", "--force"), "released acct_1/failed (FAILED")

		// SUCCEEDED with a response: refused, then --force
		_, errOut, code = c.run("release", "--scope", "acct_1", "--key", "paid")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, "it succeeded and its 201 response is replayed")
		require.Contains(t, c.ok("release", "--scope", "acct_1", "--key", "paid", "--force"), "released acct_1/paid (SUCCEEDED")

		// fenced: a record that changed since it was read is kept
		rec, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct_2", Key: "dead"})
		require.NoError(t, err)
		removed, err := d.(idemdriver.Remover).Remove(ctx, idemdriver.RemoveParams{State: idemdriver.StateFailed,
			FenceParams: idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt}})
		require.NoError(t, err)
		require.False(t, removed, "the record is PROCESSING, not the FAILED record read")
		removed, err = d.(idemdriver.Remover).Remove(ctx, idemdriver.RemoveParams{State: rec.State,
			FenceParams: idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken + 1, CreatedAt: rec.CreatedAt}})
		require.NoError(t, err)
		require.False(t, removed, "another fencing token")

		_, errOut, code = c.run("release", "--scope", "acct_1", "--key", "nope")
		require.Equal(t, 1, code)
		require.Contains(t, errOut, `no record for scope "acct_1" and key "nope"`)
		for _, bad := range [][]string{{"release", "--key", "k"}, {"release", "--scope", "s"}} {
			_, _, code := c.run(bad...)
			require.Equal(t, 2, code, bad)
		}
	})
}

// The help of release, stuck and idem itself says what release costs
// (regression: `idem --help` called release "the fix", and `idem release
// --help` recommended it for a stuck or FAILED record, whose release makes
// the next request run under a new relayed key: a second charge).
func TestReleaseHelpWarns(t *testing.T) {
	help := func(args ...string) string {
		var out, errb bytes.Buffer
		require.Zero(t, run(context.Background(), append(args, "--help"), &out, &errb), errb.String())
		return strings.Join(strings.Fields(out.String()), " ") // lines rejoined
	}
	root := help()
	require.NotContains(t, root, "the fix")
	rel := help("release")
	for _, want := range []string{"relayed key", "takes it over", "charge again", "no side effect happened", "reconciled", "--force"} {
		require.Contains(t, rel, want)
	}
	require.NotContains(t, rel, "released (Driver.Release)")
	stuck := help("stuck")
	require.Contains(t, stuck, "takes it over")
	require.Contains(t, stuck, "release is not needed")
}

// A SUCCEEDED record without its response (damaged) is refused too: its
// side effect happened, and released, the next request would run it again.
func TestReleaseRefusesDamagedSucceeded(t *testing.T) {
	why := releaseRefusal(idemdriver.Record{State: idemdriver.StateSucceeded})
	require.Contains(t, why, "its response is missing")
	require.Contains(t, why, "its side effect happened")
}

// On a database without idem's table, a command says where to look
// (regression: it printed only `relation "idem_keys" does not exist`,
// MySQL's error 1146 or SQLite's "no such table").
func TestMissingTableHint(t *testing.T) {
	for _, b := range backends {
		if b.partitioned {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, _ := b.setup(t, false)
			c := cli{t: t, url: url}
			for _, args := range [][]string{{"stats"}, {"stuck"}, {"list"}, {"inspect", "--scope", "s", "--key", "k"}} {
				_, errOut, code := c.run(args...)
				require.Equal(t, 1, code, "idem %v: %s", args, errOut)
				require.Contains(t, errOut, "idem_keys", "idem %v", args)
				require.Contains(t, errOut, "hint: idem's table is not in this database", "idem %v", args)
				require.Contains(t, errOut, "`idem migrate up`", "idem %v", args)
			}
			c.ok("migrate", "status")
		})
	}
}

// The URL's idem_schema and idem_pooler reach idempgx.Options (regression:
// pgx sent them to the server as run-time parameters, so a URL for
// pgbouncer with idem's schema named could not be used at all).
func TestPostgresURLParams(t *testing.T) {
	t.Parallel()
	base := dbtest.RequireURL(t, dbtest.EnvPostgres)
	_, schema := dbtest.PostgresURL(t)
	for _, u := range []string{os.Getenv("TEST_PGBOUNCER_URL"), base} {
		if u == "" {
			continue // no pgbouncer (TEST_PGBOUNCER_URL) to test through
		}
		sep := "?"
		if strings.Contains(u, "?") {
			sep = "&"
		}
		c := cli{t: t, url: u + sep + "idem_pooler=transaction&idem_schema=" + schema}
		c.ok("migrate", "up")
		require.Regexp(t, `records\s+0\n`, c.ok("stats"))
		require.Contains(t, c.ok("migrate", "status"), "applied")
		pool, err := pgxpool.New(context.Background(), base)
		require.NoError(t, err)
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_tables WHERE schemaname = $1 AND tablename = 'idem_keys'`, schema).Scan(&n))
		pool.Close()
		require.Equal(t, 1, n, "idem_keys is in %s", schema)
		c.ok("migrate", "down")
	}
}

// failingWriter fails every write, as a closed pipe or a full disk does.
type failingWriter struct{ writes int }

func (w *failingWriter) Write([]byte) (int, error) {
	w.writes++
	return 0, errors.New("write /dev/stdout: broken pipe")
}

// TestFailedOutputExitsNonZero: a command whose results cannot be written
// to stdout fails (exit status 1) and says why on stderr, table or JSON.
func TestFailedOutputExitsNonZero(t *testing.T) {
	url := "sqlite:" + filepath.Join(t.TempDir(), "idem.db")
	for _, args := range [][]string{{"migrate", "up"}, {"migrate", "status", "--json"}, {"stats"}, {"list"}} {
		var out failingWriter
		var errb bytes.Buffer
		code := run(context.Background(), append([]string{"--database-url", url}, args...), &out, &errb)
		require.Equal(t, 1, code, "%v: %s", args, errb.String())
		require.Positive(t, out.writes, args)
		require.Contains(t, errb.String(), "broken pipe", args)
	}
}

// clearLease empties the lease bound of the record (scope, key) in d's
// database, as a hand edit or a partial restore would: a PROCESSING record
// that cannot be a valid one (idemdriver.Record.Damaged).
func clearLease(t *testing.T, d idemdriver.Driver, scope, key string) {
	t.Helper()
	switch d := d.(type) {
	case *idempgx.Driver:
		tag, err := d.Pool().Exec(context.Background(), `UPDATE idem_keys SET locked_until = NULL WHERE scope = $1 AND key = $2`, scope, key)
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
	case *idemmysql.Driver:
		dbtest.TamperSQL(t, d.DB(), scope, key, map[string]any{"locked_until": nil})
	case *idemsqlite.Driver:
		dbtest.TamperSQL(t, d.DB(), scope, key, map[string]any{"locked_until": nil})
	default:
		t.Fatalf("clearLease: %T", d)
	}
}

// A PROCESSING record without a lease bound (issue 32 item 6) is listed by
// stuck as damaged, before the records past their lease, and counted by
// stats; inspect says its next request is answered 500 record-damaged, and
// release refuses it without --force. Regression: stuck listed it not at
// all (locked_until <= now is not true of NULL), so an operator never saw
// the key that answered 503 forever.
func TestStuckListsDamaged(t *testing.T) {
	forEachSeeded(t, func(t *testing.T, c cli, d idemdriver.Driver) {
		clearLease(t, d, "acct_1", "busy")

		out := c.ok("stuck")
		require.Regexp(t, `(?s)acct_1\s+busy\s+DAMAGED: no lease\s+1\s+1\s+POST /v1/payments.*\nacct_2\s+dead\s+9m\d+s ago`, out)
		stuck := c.json("stuck")["stuck"].([]any)
		require.Len(t, stuck, 2)
		s0 := stuck[0].(map[string]any)
		require.Equal(t, "busy", s0["key"])
		require.Equal(t, true, s0["damaged"])
		require.Nil(t, s0["locked_until"])
		require.EqualValues(t, 0, s0["overdue_seconds"])
		require.Equal(t, false, stuck[1].(map[string]any)["damaged"])
		require.Len(t, c.json("stuck", "--limit", "1")["stuck"], 1)

		require.Regexp(t, `damaged \(PROCESSING, no lease\)\s+1\n`, c.ok("stats"))
		require.EqualValues(t, 1, c.json("stats")["damaged"])
		require.Contains(t, c.ok("inspect", "--scope", "acct_1", "--key", "busy"), "500 record-damaged")

		_, errOut, code := c.run("release", "--scope", "acct_1", "--key", "busy")
		require.Equal(t, 1, code, errOut)
		require.Contains(t, errOut, "it is damaged (PROCESSING without a lease bound)")
		require.Contains(t, c.ok("release", "--scope", "acct_1", "--key", "busy", "--force"), "released acct_1/busy (PROCESSING")
		require.NotContains(t, c.ok("stuck"), "busy")
	})
}

// startSMS claims acct_1's key sms-1 on d and starts its at-most-once step
// "sms", which gets no result; it returns the step.
func startSMS(t *testing.T, d idemdriver.Driver) idemdriver.StepParams {
	t.Helper()
	ctx := context.Background()
	res, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct_1", Key: "sms-1", Method: "POST", Path: "/v1/sms",
		Fingerprint: fp("sms"), LeaseDuration: time.Minute, Retention: time.Hour})
	require.NoError(t, err)
	sp := idemdriver.StepParams{Scope: "acct_1", Key: "sms-1", FencingToken: res.Record.FencingToken, CreatedAt: res.Record.CreatedAt, Name: "sms"}
	_, err = d.(idemdriver.Stepper).StartStep(ctx, idemdriver.StartStepParams{StepParams: sp, Relay: []byte("r"), AtMostOnce: true})
	require.NoError(t, err)
	return sp
}

// Regression (a fresh user's operator): migrate down dropped idem_steps,
// and idem_keys, with their rows and no warning; after migrate up, the
// retry of a recorded execution ran its at-most-once step (an SMS) a second
// time. A rollback that drops records or steps is now refused, and rolls
// back only with --force. So is (two more fresh users' operators) the
// rollback of the migration that brought at_most_once, or the UNKNOWN state
// (MariaDB's 00008), while such a step is started without a result: the
// retry ran it again as an ordinary step, or got 503 after its call.
func TestMigrateDownKeepsRecordsAndSteps(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t: t, url: url}
			c.ok(b.migrateUp()...)
			startSMS(t, d)

			var refused []string
			for range 20 {
				_, errOut, code := c.run("migrate", "down")
				if code == 0 {
					continue
				}
				if strings.Contains(errOut, "no migration is applied") {
					break
				}
				require.Contains(t, errOut, "nothing was rolled back", errOut)
				if strings.Contains(errOut, "takes away what keeps an at-most-once step") {
					refused = append(refused, "at-most-once")
				} else {
					table := regexp.MustCompile(`drops (\w+),`).FindStringSubmatch(errOut)
					require.NotNil(t, table, errOut)
					refused = append(refused, table[1])
				}
				require.Contains(t, c.ok("migrate", "down", "--force"), "rolled back")
			}
			want := []string{"at-most-once", "idem_steps", "idem_keys"}
			if b.name == "MySQL" { // at_most_once (00007) and the UNKNOWN state (00008) came apart
				want = append([]string{"at-most-once"}, want...)
			}
			require.Equal(t, want, refused)
		})
	}
}

// Regression (a fresh user's operator): with an UNKNOWN record, migrate
// down on PostgreSQL and MariaDB printed the database's raw CHECK error;
// SQLite named the cause. Each now says an UNKNOWN record remains.
func TestMigrateDownNamesAnUnknownRecord(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t: t, url: url}
			c.ok(b.migrateUp()...)
			sp := startSMS(t, d)
			require.NoError(t, d.(idemdriver.Stepper).MarkUnknown(context.Background(), idemdriver.UnknownParams{StepParams: sp, Reason: idemdriver.ReasonStepUncertain}))
			for range 20 {
				_, errOut, code := c.run("migrate", "down")
				if code == 0 {
					continue
				}
				if b.partitioned { // its UNKNOWN records have a partition of their own
					require.Contains(t, errOut, "drops idem_keys_unknown, which holds rows")
					return
				}
				if strings.Contains(errOut, "takes away what keeps an at-most-once step") {
					// Its at-most-once step's start is refused first; --force
					// overrides that, never the UNKNOWN record.
					_, errOut, code = c.run("migrate", "down", "--force")
					require.NotZero(t, code)
				}
				require.Contains(t, errOut, "an UNKNOWN record remains")
				return
			}
			t.Fatal("migrate down never refused")
		})
	}
}
