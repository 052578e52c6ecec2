// Package idemdrivertest is the conformance suite every idem driver runs:
// each row of the decision table (CONTRACT section 3), races of many
// goroutines on one key counted by winners and handler runs, fencing, the
// completion in the business transaction, expiry, scopes, and the HTTP
// middleware's cases on the driver. A new database is "make this suite
// pass".
//
// Time moves through the drivers' clock-offset parameter (see Clock); no
// test sleeps to reach a lease or retention boundary.
package idemdrivertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/racetest"
)

// Harness tells the suite how to make databases for one driver.
type Harness struct {
	// NewDriver returns a migrated driver on a fresh, empty database that is
	// dropped when t ends.
	NewDriver func(t *testing.T) idemdriver.Driver
	// Unreachable returns a driver whose database cannot be reached (a closed
	// pool, a port nobody listens on).
	Unreachable func(t *testing.T) idemdriver.Driver
	// Business creates a business table beside d's records and returns hooks
	// to write and count its rows.
	Business func(t *testing.T, d idemdriver.Driver) Business
	// NewCountingDriver is NewDriver with a counter of the SQL statements
	// the driver sends (BEGIN and COMMIT included).
	NewCountingDriver func(t *testing.T) (idemdriver.Driver, func() int64)
	// Budget gives the statements one request costs, per outcome: "first"
	// (claim + completion), "first-claim-tx" (idem's statements around one
	// business write in the claim's transaction: the write itself is not
	// counted), "replay", "in-flight" and "key-reused"; with an
	// idemdriver.TxClaimer, "first-one-commit" (as first-claim-tx, in the
	// one-commit mode) and "replay-one-commit".
	// CONTRACT section 10 sets the targets;
	// a driver states its real figures here and the suite holds it to them.
	Budget map[string]int
	// SingleWriter is true for databases with one writer at a time (SQLite):
	// a claim cannot run while a business transaction is open, so the suite
	// does not open one across a takeover.
	SingleWriter bool

	// Maintenance declares that the driver implements the optional
	// interfaces of retention and operations: idemdriver.Purger,
	// MaintenanceLocker, Inspector and Migrator. Their cases run whenever the
	// driver implements them; with Maintenance true, a driver that lacks one
	// fails instead of skipping.
	Maintenance bool
	// Partitioned declares that NewDriver returns a partitioned store
	// (idemdriver.Partitioner reporting Partitioned, and RetentionLimiter):
	// the partition cases must run, and fail if it is not.
	Partitioned bool
	// SecondDriver returns another driver on the same database as d, through
	// a pool (or connection) of its own, as another process would have: the
	// cases where two processes meet (two maintainers) use it. Required when
	// Maintenance is true.
	SecondDriver func(t *testing.T, d idemdriver.Driver) idemdriver.Driver
	// Dump returns every column of every idem_keys row of d's database, as
	// the database returns it (text and binary columns as their bytes): the
	// sealing cases check that no column holds a response, a request or a
	// client key in plain text. Required.
	Dump func(t *testing.T, d idemdriver.Driver) [][]byte
	// Tamper sets columns of the idem_keys row (scope, key) of d's database
	// by SQL, as someone who can write the table would (a hand edit, a
	// partial restore, a leaked credential): set maps each column name to
	// its new value, nil for NULL. The cases of damaged and tampered
	// records use it. Required.
	Tamper func(t *testing.T, d idemdriver.Driver, scope, key string, set map[string]any)
	// MultiMaster declares that SecondDriver writes through another node of
	// a multi-master cluster (Galera), whose row locks do not reach the
	// first: two one-commit claims of one key on two nodes both run, and
	// one loses certification at COMMIT, answered from the winner's record
	// (docs/deployment.md). The one-commit wait cases, whose duplicates
	// wait on the owner's row lock, then meet in one node.
	MultiMaster bool
	// Starve, when set, takes every connection of d's pool that the
	// request path uses (its claims, completions and business
	// transactions), as a burst of claims keeps them, and returns the
	// function that gives them back. The case Renew/OutlivesAStarvedPool
	// then holds the driver's idemdriver.Renewer to renewing leases
	// meanwhile; it skips without Starve (SQLite's pool has no bound).
	Starve func(t *testing.T, d idemdriver.Driver) (release func())
}

// Business writes rows of a test business table inside a claim's transaction.
type Business interface {
	// Insert writes one row with id in tx, the driver's native transaction (pgx.Tx, *sql.Tx).
	Insert(ctx context.Context, tx any, id string) error
	// Count returns the committed rows with id.
	Count(ctx context.Context, id string) (int, error)
}

const (
	lease     = 30 * time.Second
	retention = 24 * time.Hour
	racers    = 64
)

// Run runs the whole suite against h.
func Run(t *testing.T, h Harness) {
	t.Run("Driver", func(t *testing.T) { runDriver(t, h) })
	t.Run("Middleware", func(t *testing.T) { runMiddleware(t, h) })
	t.Run("Retention", func(t *testing.T) { runRetention(t, h) })
	t.Run("OneCommit", func(t *testing.T) { runOneCommit(t, h) })
	t.Run("Engine", func(t *testing.T) { runEngine(t, h) })
	t.Run("Renew", func(t *testing.T) { runRenew(t, h) })
	t.Run("Steps", func(t *testing.T) { runSteps(t, h) })
	t.Run("Unknown", func(t *testing.T) { runUnknown(t, h) })
	t.Run("Abandoned", func(t *testing.T) { runAbandoned(t, h) })
}

func fingerprint(s string) []byte {
	sum := sha256.Sum256([]byte(s))
	return sum[:]
}

func params(scope, key, body string) idemdriver.ClaimParams {
	return idemdriver.ClaimParams{
		Scope: scope, Key: key, Method: "POST", Path: "/v1/payments",
		Fingerprint: fingerprint(body), LeaseDuration: lease, Retention: retention,
	}
}

func fence(rec idemdriver.Record) idemdriver.FenceParams {
	return idemdriver.FenceParams{Scope: rec.Scope, Key: rec.Key, FencingToken: rec.FencingToken, CreatedAt: rec.CreatedAt,
		LeaseDuration: lease}
}

func okResponse(body string) idemdriver.Response {
	return idemdriver.Response{Status: 201, Header: map[string][]string{"Content-Type": {"application/json"}},
		Body: []byte(body), BodyStored: true, BodySize: int64(len(body))}
}

// The calls below fail t when the store returns an error, and return what it
// answered: a case asserts the answer (a claim won or lost, a fenced write
// that took effect or was refused).

// claim claims p on d.
func claim(t *testing.T, d idemdriver.Driver, p idemdriver.ClaimParams) idemdriver.ClaimResult {
	t.Helper()
	res, err := d.Claim(context.Background(), p)
	require.NoError(t, err, "claim %s/%s", p.Scope, p.Key)
	return res
}

// record reads (scope, key) on d; msgAndArgs describe a failure.
func record(t *testing.T, d idemdriver.Driver, scope, key string, msgAndArgs ...any) idemdriver.Record {
	t.Helper()
	rec, err := d.Get(context.Background(), idemdriver.GetParams{Scope: scope, Key: key})
	require.NoError(t, err, msgAndArgs...)
	return rec
}

// requireGone checks that d has no record of (scope, key): Get answers
// idemdriver.ErrNotFound.
func requireGone(t *testing.T, d idemdriver.Driver, scope, key string, msgAndArgs ...any) {
	t.Helper()
	_, err := d.Get(context.Background(), idemdriver.GetParams{Scope: scope, Key: key})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, msgAndArgs...)
}

// rows counts biz's committed rows with id.
func rows(t *testing.T, biz Business, id string) int {
	t.Helper()
	n, err := biz.Count(context.Background(), id)
	require.NoError(t, err, "count the business rows %s", id)
	return n
}

// completer is a Driver or a Tx: what completes an execution.
type completer interface {
	Complete(ctx context.Context, p idemdriver.CompleteParams) (bool, error)
}

// complete records resp as f's outcome on c, and reports whether the fence held.
func complete(t *testing.T, c completer, f idemdriver.FenceParams, resp idemdriver.Response) bool {
	t.Helper()
	ok, err := c.Complete(context.Background(), idemdriver.CompleteParams{FenceParams: f, Response: resp})
	require.NoError(t, err, "complete %s/%s", f.Scope, f.Key)
	return ok
}

// wrote calls write, a fenced write bound to its driver (Heartbeat, Fail or
// Release), with f, and reports whether the fence held.
func wrote(t *testing.T, write func(context.Context, idemdriver.FenceParams) (bool, error), f idemdriver.FenceParams) bool {
	t.Helper()
	ok, err := write(context.Background(), f)
	require.NoError(t, err, "fenced write on %s/%s", f.Scope, f.Key)
	return ok
}

// setup brings (scope, key) into a state: "none", "PROCESSING" (live lease),
// "EXPIRED_LEASE", "SUCCEEDED", "FAILED", "EXPIRED" (SUCCEEDED, past
// retention), and past retention while unfinished: "EXPIRED_FAILED",
// "EXPIRED_DEAD" (PROCESSING past its lease) and "EXPIRED_LIVE"
// (PROCESSING, its lease still running: a handler that outlived the
// record's retention). It returns the shifted driver to use afterwards and
// the stored record.
func setup(t *testing.T, d idemdriver.Driver, state string, p idemdriver.ClaimParams) (*ShiftedDriver, idemdriver.Record) {
	t.Helper()
	clock := &Clock{}
	sd := Shift(d, clock)
	if state == "none" {
		return sd, idemdriver.Record{}
	}
	if state == "EXPIRED_LIVE" {
		p.Retention = lease / 2
	}
	res := claim(t, sd, p)
	require.True(t, res.Claimed)
	switch state {
	case "PROCESSING":
	case "EXPIRED_LEASE":
		clock.Advance(lease + time.Second)
	case "EXPIRED_LIVE":
		clock.Advance(lease/2 + time.Second)
	case "EXPIRED_DEAD":
		clock.Advance(retention + time.Second)
	case "EXPIRED_FAILED":
		require.True(t, wrote(t, sd.Fail, fence(res.Record)))
		clock.Advance(retention + time.Second)
	case "SUCCEEDED":
		require.True(t, complete(t, sd, fence(res.Record), okResponse(`{"id":"pay_1"}`)))
	case "FAILED":
		require.True(t, wrote(t, sd.Fail, fence(res.Record)))
	case "EXPIRED":
		require.True(t, complete(t, sd, fence(res.Record), okResponse(`{"id":"pay_1"}`)))
		clock.Advance(retention + time.Second)
	default:
		t.Fatalf("unknown state %q", state)
	}
	return sd, res.Record
}

// suiteCase is one named case of the suite: its name is the subtest's
// (what -run selects).
type suiteCase struct {
	name string
	run  func(*testing.T, Harness)
}

// runCases runs cases as subtests of t, in order.
func runCases(t *testing.T, h Harness, cases []suiteCase) {
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { c.run(t, h) })
	}
}

func runDriver(t *testing.T, h Harness) {
	runCases(t, h, []suiteCase{
		{"ClaimNew", driverClaimNew},
		{"MigrateTwice", driverMigrateTwice},
		{"DecisionTable", driverDecisionTable},
		{"MethodOrPathDiffers", driverMethodOrPathDiffers},
		{"ReplayByteExact", driverReplayByteExact},
		{"CutResponseIsMissing", driverCutResponseIsMissing},
		{"DamagedProcessing", driverDamagedProcessing},
		{"ScopesIndependent", driverScopesIndependent},
		{"Fencing", driverFencing},
		{"HeartbeatExtendsLease", driverHeartbeatExtendsLease},
		{"CompleteInBusinessTx", driverCompleteInBusinessTx},
		{"CompleteCommit", driverCompleteCommit},
		{"ConcurrentClaim", driverConcurrentClaim},
		{"ConcurrentTakeover", driverConcurrentClaimable("EXPIRED_LEASE", "b", 2)},
		{"ConcurrentReclaimAfterFailed", driverConcurrentClaimable("FAILED", "b", 2)},
		{"ConcurrentExpiredIsNew", driverConcurrentClaimable("EXPIRED", "other payload, after expiry", 1)},
		{"Owner", onFreshDriver(driverOwner)},
		{"LeaseCountsFromTheWrite", onFreshDriver(driverLeaseCountsFromTheWrite)},
		{"Release", onFreshDriver(driverRelease)},
		{"NotifyWhenMarked", onFreshDriver(driverNotifyWhenMarked)},
		{"Unstorable", onFreshDriver(driverUnstorable)},
		{"SealedColumns", driverSealedColumns},
		{"ClaimClearsSealedColumns", driverClaimClearsSealedColumns},
		{"Unreachable", driverUnreachable},
	})
}

// onFreshDriver makes a case of run, which needs nothing but a fresh driver.
func onFreshDriver(run func(*testing.T, idemdriver.Driver)) func(*testing.T, Harness) {
	return func(t *testing.T, h Harness) {
		t.Parallel()
		run(t, h.NewDriver(t))
	}
}

func driverClaimNew(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	res := claim(t, d, params("acct_1", "k1", "a"))
	require.True(t, res.Claimed)
	rec := res.Record
	require.Equal(t, idemdriver.StateProcessing, rec.State)
	require.Equal(t, "acct_1", rec.Scope)
	require.Equal(t, "k1", rec.Key)
	require.Equal(t, "POST", rec.Method)
	require.Equal(t, "/v1/payments", rec.Path)
	require.Equal(t, fingerprint("a"), rec.Fingerprint)
	require.Equal(t, 1, rec.Attempts)
	require.Positive(t, rec.FencingToken)
	require.Nil(t, rec.Response)
	require.InDelta(t, lease.Seconds(), rec.LeaseLeft.Seconds(), 5)
	require.NotNil(t, rec.LockedUntil)
	require.WithinDuration(t, rec.CreatedAt.Add(retention), rec.ExpiresAt, time.Millisecond)
	require.WithinDuration(t, rec.CreatedAt.Add(lease), *rec.LockedUntil, time.Millisecond)

	got := record(t, d, "acct_1", "k1")
	require.Equal(t, rec.FencingToken, got.FencingToken)
	requireGone(t, d, "acct_1", "nope")
}

func driverMigrateTwice(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	require.NoError(t, d.Migrate(context.Background()))
}

// The decision table, row by row, at the driver: what the claim decides
// for each stored state with the same and with a different request. Each
// row names its idemdriver.Decision: Decide must name it for the record
// as read at the claim's clock, and the driver's claim must do it.
func driverDecisionTable(t *testing.T, h Harness) {
	t.Parallel()
	const (
		same   = ""
		body   = "body"
		method = "method"
		path   = "path"
	)
	cases := []struct {
		state       string
		other       string // "" for the same request, else what differs
		wantClaimed bool
		wantState   idemdriver.State
		want        idemdriver.Decision
	}{
		{"none", same, true, idemdriver.StateProcessing, idemdriver.DecisionNew},
		{"PROCESSING", same, false, idemdriver.StateProcessing, idemdriver.DecisionInFlight},
		{"PROCESSING", body, false, idemdriver.StateProcessing, idemdriver.DecisionKeyReused},
		{"PROCESSING", method, false, idemdriver.StateProcessing, idemdriver.DecisionKeyReused},
		{"EXPIRED_LEASE", same, true, idemdriver.StateProcessing, idemdriver.DecisionTakeOver},
		{"EXPIRED_LEASE", body, false, idemdriver.StateProcessing, idemdriver.DecisionKeyReused},
		{"EXPIRED_LEASE", path, false, idemdriver.StateProcessing, idemdriver.DecisionKeyReused},
		{"SUCCEEDED", same, false, idemdriver.StateSucceeded, idemdriver.DecisionReplay},
		{"SUCCEEDED", body, false, idemdriver.StateSucceeded, idemdriver.DecisionKeyReused},
		{"SUCCEEDED", method, false, idemdriver.StateSucceeded, idemdriver.DecisionKeyReused},
		{"SUCCEEDED", path, false, idemdriver.StateSucceeded, idemdriver.DecisionKeyReused},
		{"FAILED", same, true, idemdriver.StateProcessing, idemdriver.DecisionReclaim},
		{"FAILED", body, false, idemdriver.StateFailed, idemdriver.DecisionKeyReused},
		{"FAILED", method, false, idemdriver.StateFailed, idemdriver.DecisionKeyReused},
		{"FAILED", path, false, idemdriver.StateFailed, idemdriver.DecisionKeyReused},
		{"EXPIRED", same, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		{"EXPIRED", body, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		{"EXPIRED", path, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		// Unfinished past retention: the same request continues the
		// record's life (a retry of an execution whose outcome is
		// unknown keeps its relayed key); another request starts a new
		// one; a live lease is never taken, expired or not.
		{"EXPIRED_FAILED", same, true, idemdriver.StateProcessing, idemdriver.DecisionReclaim},
		{"EXPIRED_FAILED", body, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		{"EXPIRED_DEAD", same, true, idemdriver.StateProcessing, idemdriver.DecisionTakeOver},
		{"EXPIRED_DEAD", body, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		{"EXPIRED_DEAD", method, true, idemdriver.StateProcessing, idemdriver.DecisionNewLife},
		{"EXPIRED_LIVE", same, false, idemdriver.StateProcessing, idemdriver.DecisionInFlight},
		{"EXPIRED_LIVE", body, false, idemdriver.StateProcessing, idemdriver.DecisionKeyReused},
	}
	d := h.NewDriver(t)
	for i, tc := range cases {
		t.Run(fmt.Sprintf("%s/other=%s", tc.state, tc.other), func(t *testing.T) {
			key := fmt.Sprintf("dt-%d", i)
			sd, before := setup(t, d, tc.state, params("acct", key, "body"))
			p := params("acct", key, "body")
			switch tc.other {
			case body:
				p.Fingerprint = fingerprint("other body")
			case method:
				p.Method = "PATCH"
			case path:
				p.Path = "/v1/refunds"
			}
			// The rule: Decide on the record as the claim will read it.
			var read *idemdriver.Record
			if tc.state != "none" {
				rec := record(t, sd, "acct", key)
				read = &rec
			}
			expired := tc.state == "EXPIRED" || tc.state == "EXPIRED_FAILED" || tc.state == "EXPIRED_DEAD" || tc.state == "EXPIRED_LIVE"
			require.Equal(t, tc.want, idemdriver.Decide(read, expired, p), "Decide names the row")
			require.Equal(t, tc.wantClaimed, tc.want.Claims())

			res := claim(t, sd, p)
			requireDecision(t, tc.want, read, res, p)
			require.Equal(t, tc.wantClaimed, res.Claimed)
			require.Equal(t, tc.want == idemdriver.DecisionTakeOver, res.TookOver, "TookOver says a takeover, and only a takeover")
			require.Equal(t, tc.wantState, res.Record.State)
			if tc.wantClaimed {
				require.Equal(t, p.Fingerprint, res.Record.Fingerprint)
				require.Greater(t, res.Record.FencingToken, before.FencingToken)
			} else {
				// The row it lost to, untouched: the core answers 422 from
				// its fingerprint, 409 from its lease, or replays it.
				require.Equal(t, before.FencingToken, res.Record.FencingToken)
				require.Equal(t, fingerprint("body"), res.Record.Fingerprint)
			}
			if tc.state == "PROCESSING" || tc.state == "EXPIRED_LIVE" {
				require.Positive(t, res.Record.LeaseLeft)
				require.LessOrEqual(t, res.Record.LeaseLeft, lease)
			}
			if tc.wantClaimed {
				// Every claim keeps the record for a whole retention
				// from now, so the outcome it writes can be replayed.
				require.WithinDuration(t, res.Record.UpdatedAt.Add(retention), res.Record.ExpiresAt, time.Millisecond)
			}
			if tc.state == "SUCCEEDED" {
				require.NotNil(t, res.Record.Response)
				require.Equal(t, `{"id":"pay_1"}`, string(res.Record.Response.Body))
			}
			continues := tc.other == same && (tc.state == "EXPIRED_FAILED" || tc.state == "EXPIRED_DEAD")
			switch {
			case continues:
				require.Equal(t, 2, res.Record.Attempts)
				require.True(t, before.CreatedAt.Equal(res.Record.CreatedAt),
					"the same unfinished request continues the record's life: created_at %s, then %s", before.CreatedAt, res.Record.CreatedAt)
			case tc.state == "EXPIRED_FAILED" || tc.state == "EXPIRED_DEAD":
				require.Equal(t, 1, res.Record.Attempts, "another request starts over")
				require.True(t, res.Record.CreatedAt.After(before.CreatedAt), "another request starts a new life")
			}
			switch tc.state {
			case "FAILED", "EXPIRED_LEASE":
				if tc.wantClaimed {
					require.Equal(t, 2, res.Record.Attempts)
					// The same life of the key: the relayed key derived
					// from CreatedAt must not change (CONTRACT section 7).
					require.True(t, before.CreatedAt.Equal(res.Record.CreatedAt),
						"a takeover or re-claim keeps created_at: %s, then %s", before.CreatedAt, res.Record.CreatedAt)
				}
			case "EXPIRED":
				require.Equal(t, 1, res.Record.Attempts, "an expired record starts over")
				require.Nil(t, res.Record.Response)
				require.True(t, res.Record.CreatedAt.After(before.CreatedAt), "an expired record starts a new life")
			}
		})
	}
}

func driverMethodOrPathDiffers(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	sd, before := setup(t, d, "FAILED", params("acct", "k", "body"))
	p := params("acct", "k", "body")
	p.Path = "/v1/refunds"
	res := claim(t, sd, p)
	require.False(t, res.Claimed)
	require.Equal(t, "/v1/payments", res.Record.Path)
	p = params("acct", "k", "body")
	p.Method = "PATCH"
	res = claim(t, sd, p)
	require.False(t, res.Claimed)
	require.Equal(t, before.FencingToken, res.Record.FencingToken)
}

func driverReplayByteExact(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	res := claim(t, d, params("acct", "bin", "b"))
	body := make([]byte, 0, 512)
	for i := 0; i < 512; i++ {
		body = append(body, byte(i))
	}
	resp := idemdriver.Response{Status: 202, Body: body, BodyStored: true, BodySize: int64(len(body)),
		Header: map[string][]string{"Content-Type": {"application/octet-stream"}, "Link": {"<a>; rel=x", "<b>; rel=y"}}}
	require.True(t, complete(t, d, fence(res.Record), resp))
	again := claim(t, d, params("acct", "bin", "b"))
	require.False(t, again.Claimed)
	require.Equal(t, idemdriver.StateSucceeded, again.Record.State)
	require.Equal(t, resp.Status, again.Record.Response.Status)
	require.True(t, bytes.Equal(body, again.Record.Response.Body))
	require.Equal(t, resp.Header, again.Record.Response.Header)
	require.NotNil(t, again.Record.CompletedAt)
	require.Zero(t, again.Record.LeaseLeft)

	// An empty body and a body that was not stored.
	res = claim(t, d, params("acct", "empty", "b"))
	require.True(t, complete(t, d, fence(res.Record), idemdriver.Response{Status: 204, BodyStored: true}))
	rec := record(t, d, "acct", "empty")
	require.Equal(t, 204, rec.Response.Status)
	require.Empty(t, rec.Response.Body)
	require.True(t, rec.Response.BodyStored)

	res = claim(t, d, params("acct", "big", "b"))
	require.True(t, complete(t, d, fence(res.Record), idemdriver.Response{Status: 201, BodyStored: false, BodySize: 5 << 20}))
	rec = record(t, d, "acct", "big")
	require.False(t, rec.Response.BodyStored)
	require.Equal(t, int64(5<<20), rec.Response.BodySize)
}

// A SUCCEEDED record whose stored body is not as long as the size recorded
// with it (a restore that cut it, a column NULLed by hand) is read with no
// response, as one with no status is: the engine answers it 500
// response-missing (CONTRACT section 3), never a replay of what is left. A
// completion cannot cut a body, so the case plants the damage through the
// seam: a body shorter than its BodySize.
func driverCutResponseIsMissing(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	p := params("acct", "cut", "b")
	res := claim(t, d, p)
	cut := idemdriver.Response{Status: 201, Body: []byte(`{"id":`), BodyStored: true, BodySize: 63,
		Header: map[string][]string{"Location": {"/payments/pay_1"}}}
	require.True(t, complete(t, d, fence(res.Record), cut))
	again := claim(t, d, p)
	require.False(t, again.Claimed)
	require.Equal(t, idemdriver.StateSucceeded, again.Record.State)
	require.Nil(t, again.Record.Response, "the claim's read")
	require.Nil(t, record(t, d, "acct", "cut").Response, "Get")
}

func driverScopesIndependent(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	a := claim(t, d, params("merchant_a", "same-key", "a"))
	require.True(t, a.Claimed)
	b := claim(t, d, params("merchant_b", "same-key", "b"))
	require.True(t, b.Claimed, "another scope's key never meets this one")
	require.True(t, complete(t, d, fence(a.Record), okResponse("A")))
	rb := record(t, d, "merchant_b", "same-key")
	require.Equal(t, idemdriver.StateProcessing, rb.State)
	// Keys are case-sensitive.
	c := claim(t, d, params("merchant_a", "SAME-KEY", "a"))
	require.True(t, c.Claimed)
}

func driverFencing(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	sd, old := setup(t, d, "EXPIRED_LEASE", params("acct", "k", "body"))
	// The owner died; a retry takes over.
	take := claim(t, sd, params("acct", "k", "body"))
	require.True(t, take.Claimed)
	require.Greater(t, take.Record.FencingToken, old.FencingToken)

	// The old owner wakes up: every write it attempts is refused.
	require.False(t, wrote(t, sd.Heartbeat, fence(old)))
	require.False(t, complete(t, sd, fence(old), okResponse("stale")))
	require.False(t, wrote(t, sd.Fail, fence(old)))
	require.False(t, wrote(t, sd.Release, fence(old)), "a worker that lost the record cannot release the new owner's")
	rec := record(t, d, "acct", "k")
	require.Equal(t, idemdriver.StateProcessing, rec.State)
	require.Equal(t, take.Record.FencingToken, rec.FencingToken)

	// The new owner's writes go through; a completed record refuses them all.
	require.True(t, wrote(t, sd.Heartbeat, fence(take.Record)))
	require.True(t, complete(t, sd, fence(take.Record), okResponse("new")))
	require.False(t, complete(t, sd, fence(take.Record), okResponse("twice")), "a completed record is final")
	require.False(t, wrote(t, sd.Fail, fence(take.Record)))
	require.False(t, wrote(t, sd.Release, fence(take.Record)), "a completed record is not released")
	rec = record(t, d, "acct", "k")
	require.Equal(t, "new", string(rec.Response.Body))
}

func driverHeartbeatExtendsLease(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	clock := &Clock{}
	sd := Shift(d, clock)
	res := claim(t, sd, params("acct", "k", "body"))
	clock.Advance(lease - 5*time.Second)
	require.True(t, wrote(t, sd.Heartbeat, fence(res.Record)))
	// Past the first lease, but within the renewed one: no takeover.
	clock.Advance(10 * time.Second)
	again := claim(t, sd, params("acct", "k", "body"))
	require.False(t, again.Claimed)
	require.InDelta(t, (lease - 10*time.Second).Seconds(), again.Record.LeaseLeft.Seconds(), 5)
}

func driverCompleteInBusinessTx(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	biz := h.Business(t, d)
	ctx := context.Background()

	// Commit together: the business row and SUCCEEDED, or neither.
	res := claim(t, d, params("acct", "tx-ok", "b"))
	tx, err := d.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, biz.Insert(ctx, tx.Native(), "row-ok"))
	require.True(t, complete(t, tx, fence(res.Record), okResponse("ok")))
	rec := record(t, d, "acct", "tx-ok")
	require.Equal(t, idemdriver.StateProcessing, rec.State, "the completion is invisible before commit")
	require.NoError(t, tx.Commit(ctx))
	require.Equal(t, 1, rows(t, biz, "row-ok"))
	rec = record(t, d, "acct", "tx-ok")
	require.Equal(t, idemdriver.StateSucceeded, rec.State)

	// Rolled back: neither.
	res = claim(t, d, params("acct", "tx-rb", "b"))
	tx, err = d.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, biz.Insert(ctx, tx.Native(), "row-rb"))
	require.True(t, complete(t, tx, fence(res.Record), okResponse("rb")))
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, rows(t, biz, "row-rb"))
	rec = record(t, d, "acct", "tx-rb")
	require.Equal(t, idemdriver.StateProcessing, rec.State)

	// Fenced out: a worker whose lease was taken over cannot complete in
	// its transaction, and its business writes never commit. With a
	// single-writer database the old owner's transaction can only begin
	// after the takeover; elsewhere it is also open across it.
	orders := []string{"begin-after-takeover"}
	if !h.SingleWriter {
		orders = append(orders, "begin-before-takeover")
	}
	for _, order := range orders {
		clock := &Clock{}
		sd := Shift(d, clock)
		key, row := "tx-fenced-"+order, "row-fenced-"+order
		old := claim(t, sd, params("acct", key, "b"))
		var tx idemdriver.Tx
		if order == "begin-before-takeover" {
			tx, err = sd.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, biz.Insert(ctx, tx.Native(), row))
		}
		clock.Advance(lease + time.Second)
		take := claim(t, sd, params("acct", key, "b"))
		require.True(t, take.Claimed)
		if tx == nil {
			tx, err = sd.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, biz.Insert(ctx, tx.Native(), row))
		}
		require.False(t, complete(t, tx, fence(old.Record), okResponse("stale")), order)
		require.NoError(t, tx.Rollback(ctx))
		require.Zero(t, rows(t, biz, row), "a fenced-out worker's business writes never commit (%s)", order)
		rec = record(t, d, "acct", key)
		require.Equal(t, take.Record.FencingToken, rec.FencingToken)
	}
}

// A driver that sends the completion and the COMMIT together
// (idemdriver.CompleteCommitter) keeps the same three promises in that
// one call, and the COMMIT never goes through without the completion.
func driverCompleteCommit(t *testing.T, h Harness) {
	t.Parallel()
	clock := &Clock{}
	sd := Shift(h.NewDriver(t), clock)
	biz := h.Business(t, sd.Driver)
	ctx := context.Background()
	begin := func(row string) (idemdriver.Tx, idemdriver.CompleteCommitter) {
		t.Helper()
		tx, err := sd.Begin(ctx)
		require.NoError(t, err)
		cc, ok := tx.(idemdriver.CompleteCommitter)
		if !ok {
			require.NoError(t, tx.Rollback(ctx))
			t.Skipf("%T does not implement idemdriver.CompleteCommitter", tx)
		}
		if row != "" {
			require.NoError(t, biz.Insert(ctx, tx.Native(), row))
		}
		return tx, cc
	}
	completeCommit := func(cc idemdriver.CompleteCommitter, rec idemdriver.Record, body string) (bool, error) {
		return cc.CompleteCommit(ctx, idemdriver.CompleteParams{FenceParams: fence(rec), Response: okResponse(body)})
	}

	// Both commit, in the one call.
	res := claim(t, sd, params("acct", "cc-ok", "b"))
	tx, cc := begin("cc-row-ok")
	ok, err := completeCommit(cc, res.Record, "ok")
	require.NoError(t, err)
	require.True(t, ok)
	require.Equal(t, 1, rows(t, biz, "cc-row-ok"))
	require.Equal(t, idemdriver.StateSucceeded, record(t, sd, "acct", "cc-ok").State)
	require.NoError(t, tx.Rollback(ctx), "a Rollback after the commit is a no-op")
	require.Equal(t, 1, rows(t, biz, "cc-row-ok"))

	// Fenced out: the lease was taken over while the transaction was
	// open; the completion fails, so the COMMIT sent with it must not
	// commit the business row.
	old := claim(t, sd, params("acct", "cc-fenced", "b"))
	tx, cc = begin("cc-row-fenced")
	clock.Advance(lease + time.Second)
	take := claim(t, sd, params("acct", "cc-fenced", "b"))
	require.True(t, take.Claimed)
	ok, err = completeCommit(cc, old.Record, "stale")
	require.NoError(t, err)
	require.False(t, ok, "a fenced-out completion reports false")
	require.NoError(t, tx.Rollback(ctx))
	require.Zero(t, rows(t, biz, "cc-row-fenced"), "a fenced-out worker's business writes never commit")
	rec := record(t, sd, "acct", "cc-fenced")
	require.Equal(t, idemdriver.StateProcessing, rec.State)
	require.Equal(t, take.Record.FencingToken, rec.FencingToken)

	// The handler ended the transaction itself: ErrTxDone, nothing
	// recorded.
	res = claim(t, sd, params("acct", "cc-done", "b"))
	tx, cc = begin("")
	require.NoError(t, tx.Commit(ctx))
	_, err = completeCommit(cc, res.Record, "late")
	require.ErrorIs(t, err, idemdriver.ErrTxDone)
	require.Equal(t, idemdriver.StateProcessing, record(t, sd, "acct", "cc-done").State)
}

func driverConcurrentClaim(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	winners, results := race(t, d, params("acct", "hot", "b"))
	require.Equal(t, 1, winners)
	for _, r := range results {
		require.Equal(t, idemdriver.StateProcessing, r.Record.State)
		if !r.Claimed {
			require.Positive(t, r.Record.LeaseLeft, "losers see the winner's live lease")
		}
	}
}

// race races racers claims of p on sd: many goroutines, exactly one winner,
// no errors.
func race(t *testing.T, sd idemdriver.Driver, p idemdriver.ClaimParams) (winners int, records []idemdriver.ClaimResult) {
	t.Helper()
	records, err := racetest.Race(racers, func(int) (idemdriver.ClaimResult, error) { return sd.Claim(context.Background(), p) })
	require.NoError(t, err)
	for _, r := range records {
		if r.Claimed {
			winners++
		}
	}
	return winners, records
}

// requireOneOwner checks a race's results: one winner, and every loser
// answered from the winner's record (the live lease it must wait for),
// never from the row as it was before the race. A loser that read the old
// row would answer 422 for a duplicate after expiry (the old payload),
// or 409 with a lease that has run out.
func requireOneOwner(t *testing.T, winners int, results []idemdriver.ClaimResult, p idemdriver.ClaimParams, old idemdriver.Record) {
	t.Helper()
	require.Equal(t, 1, winners)
	var won idemdriver.Record
	for _, r := range results {
		if r.Claimed {
			won = r.Record
		}
	}
	require.Greater(t, won.FencingToken, old.FencingToken)
	for _, r := range results {
		require.Equal(t, won.FencingToken, r.Record.FencingToken, "every loser sees the winner's claim")
		require.Equal(t, idemdriver.StateProcessing, r.Record.State)
		require.Equal(t, p.Fingerprint, r.Record.Fingerprint)
		require.Positive(t, r.Record.LeaseLeft, "the winner's live lease")
	}
}

// Each race of a claimable row runs on raceRounds keys: a loser reading
// a stale row is a narrow window, and one race rarely hits it.
const raceRounds = 8

// driverConcurrentClaimable races claims (with body) on a row in state: the
// claim that wins continues the record's life (attempts 2) or, past
// retention and with another payload, starts a new one (attempts 1); tokens
// never go back, even across expiry.
func driverConcurrentClaimable(state, body string, attempts int) func(*testing.T, Harness) {
	return func(t *testing.T, h Harness) {
		t.Parallel()
		d := h.NewDriver(t)
		for i := range raceRounds {
			key := fmt.Sprintf("hot-%d", i)
			sd, old := setup(t, d, state, params("acct", key, "b"))
			p := params("acct", key, body)
			winners, results := race(t, sd, p)
			requireOneOwner(t, winners, results, p, old)
			rec := record(t, d, "acct", key)
			require.Equal(t, attempts, rec.Attempts)
			require.Greater(t, rec.FencingToken, old.FencingToken, "tokens never go back, even across expiry")
		}
	}
}

func driverUnreachable(t *testing.T, h Harness) {
	t.Parallel()
	d := h.Unreachable(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := d.Claim(ctx, params("acct", "k", "b"))
	require.Error(t, err)
}

// driverOwner: every claim stores who claimed (ClaimParams.Owner), and the
// record, Get and Stuck return it.
func driverOwner(t *testing.T, d idemdriver.Driver) {
	ctx := context.Background()
	clock := &Clock{}
	sd := Shift(d, clock)
	p := params("acct", "k", "body")
	p.Owner = "host-a/4242"
	res := claim(t, sd, p)
	require.True(t, res.Claimed)
	require.Equal(t, "host-a/4242", res.Record.Owner)
	rec := record(t, sd, "acct", "k")
	require.Equal(t, "host-a/4242", rec.Owner)

	// The duplicate that loses sees whose execution it waits for.
	dup := p
	dup.Owner = "host-b/7"
	lost := claim(t, sd, dup)
	require.False(t, lost.Claimed)
	require.Equal(t, "host-a/4242", lost.Record.Owner)

	// The owner dies: the stuck list names it; the takeover records its own.
	clock.Advance(lease + time.Second)
	if in, ok := d.(idemdriver.Inspector); ok {
		stuck, err := in.Stuck(ctx, idemdriver.StuckParams{Limit: 10, ClockOffset: clock.Offset()})
		require.NoError(t, err)
		require.Len(t, stuck, 1)
		require.Equal(t, "host-a/4242", stuck[0].Owner)
	}
	take := claim(t, sd, dup)
	require.True(t, take.Claimed)
	require.Equal(t, "host-b/7", take.Record.Owner)
	rec = record(t, sd, "acct", "k")
	require.Equal(t, "host-b/7", rec.Owner)

	// The longest owner every driver stores, byte-exact.
	long := params("acct", "k-long-owner", "body")
	long.Owner = string(bytes.Repeat([]byte("o"), idemdriver.MaxOwnerBytes))
	res = claim(t, d, long)
	require.Equal(t, long.Owner, res.Record.Owner)
	rec = record(t, d, "acct", "k-long-owner")
	require.Equal(t, long.Owner, rec.Owner)
}

// driverRelease: Release removes this execution's record, fenced like
// Complete, so that the next request with the key runs as new;
// a caller that lost the record removes nothing.
func driverRelease(t *testing.T, d idemdriver.Driver) {
	res := claim(t, d, params("acct", "k", "body"))
	require.True(t, res.Claimed)
	require.True(t, wrote(t, d.Release, fence(res.Record)))
	requireGone(t, d, "acct", "k")
	require.False(t, wrote(t, d.Release, fence(res.Record)), "a released record is gone")

	// The corrected request with the same key (another body) runs as new.
	again := claim(t, d, params("acct", "k", "corrected body"))
	require.True(t, again.Claimed, "a released key is not burnt")
	require.Equal(t, 1, again.Record.Attempts)
	require.Equal(t, fingerprint("corrected body"), again.Record.Fingerprint)
	// The first execution's fence no longer matches (a purged key starts
	// again at token 1: created_at tells the lives apart).
	require.False(t, wrote(t, d.Release, fence(res.Record)))
	rec := record(t, d, "acct", "k")
	require.Equal(t, again.Record.FencingToken, rec.FencingToken)

	// A failed execution is over: its record is not released (the fence
	// requires PROCESSING); Fencing covers lost and completed ones.
	sd, failed := setup(t, d, "FAILED", params("acct", "failed", "body"))
	require.False(t, wrote(t, sd.Release, fence(failed)))
	rec = record(t, sd, "acct", "failed")
	require.Equal(t, idemdriver.StateFailed, rec.State)
}

// driverUnstorable: a scope or path the database cannot store (a NUL byte,
// invalid UTF-8) is either stored byte-exact (columns of bytes) or refused
// with an error wrapping idemdriver.ErrUnstorable, never a store error the
// core would answer 503.
func driverUnstorable(t *testing.T, d idemdriver.Driver) {
	ctx := context.Background()
	odd := map[string]string{"nul": "acct\x00evil", "invalid-utf8": "acct\xff\xfe", "lone-continuation": "\x80"}
	for name, v := range odd {
		for _, field := range []string{"scope", "path"} {
			p := params("acct", "k-"+name+"-"+field, "body")
			if field == "scope" {
				p.Scope = v
			} else {
				p.Path = "/v1/" + v
			}
			res, err := d.Claim(ctx, p)
			if err != nil {
				require.ErrorIs(t, err, idemdriver.ErrUnstorable, "%s in the %s: %v", name, field, err)
				_, err = d.Get(ctx, idemdriver.GetParams{Scope: p.Scope, Key: p.Key})
				if err != nil && !errors.Is(err, idemdriver.ErrNotFound) {
					require.ErrorIs(t, err, idemdriver.ErrUnstorable, "Get, %s in the %s", name, field)
				}
				continue
			}
			// Stored: byte-exact, and found again by the same bytes only.
			require.True(t, res.Claimed, "%s in the %s", name, field)
			require.Equal(t, p.Scope, res.Record.Scope)
			require.Equal(t, p.Path, res.Record.Path)
			rec := record(t, d, p.Scope, p.Key, "%s in the %s", name, field)
			require.Equal(t, p.Scope, rec.Scope)
			require.Equal(t, p.Path, rec.Path)
			dup := claim(t, d, p)
			require.False(t, dup.Claimed, "%s in the %s: the same bytes find the record", name, field)
			require.True(t, complete(t, d, fence(res.Record), okResponse("ok")))
		}
	}
	// Nothing is confused with the plain scope.
	requireGone(t, d, "acct", "k-nul-scope")
}

// requireDecision checks that a claim by p did what want says, given the
// record read before it (nil: none): a claim that wins writes the life
// want names (continued: created_at kept, attempts+1; new: attempts 1 and,
// for a new life, a later created_at); a claim that loses returns the row it
// read, untouched, from which Decide gives the core's answer (replay, 409,
// 422).
func requireDecision(t *testing.T, want idemdriver.Decision, read *idemdriver.Record, res idemdriver.ClaimResult, p idemdriver.ClaimParams) {
	t.Helper()
	require.Equal(t, want.Claims(), res.Claimed, "decision %s", want)
	if !res.Claimed {
		require.NotNil(t, read)
		require.Equal(t, read.FencingToken, res.Record.FencingToken, "the row it lost to is the row read")
		require.Equal(t, read.State, res.Record.State)
		require.Equal(t, want, idemdriver.Decide(&res.Record, false, p), "the core's answer from the record it lost to")
		return
	}
	rec := res.Record
	require.Equal(t, idemdriver.StateProcessing, rec.State)
	require.Positive(t, rec.LeaseLeft, "a claim is born with a live lease")
	switch {
	case want == idemdriver.DecisionNew:
		require.Nil(t, read)
		require.Equal(t, 1, rec.Attempts)
	case want.Continues():
		require.Equal(t, read.Attempts+1, rec.Attempts, "decision %s continues the life", want)
		require.True(t, read.CreatedAt.Equal(rec.CreatedAt), "decision %s keeps created_at", want)
		require.Greater(t, rec.FencingToken, read.FencingToken)
	default: // DecisionNewLife
		require.Equal(t, idemdriver.DecisionNewLife, want)
		require.Equal(t, 1, rec.Attempts, "a new life starts at attempt 1")
		require.True(t, rec.CreatedAt.After(read.CreatedAt), "a new life starts at a new created_at")
		require.Greater(t, rec.FencingToken, read.FencingToken, "tokens never go back, even across expiry")
		require.Nil(t, rec.Response)
	}
}

// driverLeaseCountsFromTheWrite: a lease counts from when the claim's write takes effect,
// not from when its statement started. A takeover that
// waits on the record's row lock longer than the lease (the old owner's
// business transaction holds it, then rolls back) must not write a
// locked_until already in the past: a duplicate arriving right after would
// take the key over while the first still runs.
func driverLeaseCountsFromTheWrite(t *testing.T, d idemdriver.Driver) {
	const short = time.Second
	ctx := context.Background()
	clock := &Clock{}
	sd := Shift(d, clock)
	old := claim(t, sd, params("acct", "k", "body"))
	// The old owner completes in its business transaction: the row is
	// locked until that transaction ends.
	tx, err := sd.Begin(ctx)
	require.NoError(t, err)
	// Should the case fail before the checked Rollback below, this one ends
	// the transaction; after it, it has nothing to do and its error
	// (the transaction is done) says nothing.
	defer func() { _ = tx.Rollback(ctx) }()
	require.True(t, complete(t, tx, fence(old.Record), okResponse("old")))

	// Its lease runs out (as the database sees it), and a retry takes over.
	clock.Advance(lease + time.Second)
	p := params("acct", "k", "body")
	p.LeaseDuration = short
	done := make(chan idemdriver.ClaimResult, 1)
	errc := make(chan error, 1)
	go func() {
		res, err := sd.Claim(ctx, p)
		errc <- err
		done <- res
	}()
	// The takeover waits on the row lock for longer than its lease.
	select {
	case err := <-errc:
		t.Fatalf("the takeover did not wait for the old owner's transaction (its claim returned %v)", err)
	case <-time.After(short + short/2):
	}
	rolledBack := time.Now()
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, <-errc)
	take := <-done
	require.True(t, take.Claimed, "the old owner rolled back: the dead lease is taken over")
	rec := record(t, sd, "acct", "k")
	require.Equal(t, take.Record.FencingToken, rec.FencingToken)
	// The lease ends a whole lease after the write, which came after the
	// rollback; counted from the statement's start it would end half a lease
	// before the rollback. Compared with this process's clock moved by the
	// offset (the database on the same host, its clock the same within half
	// a lease), not with the database's now at a later read, which a loaded
	// machine can put past the lease's end.
	require.NotNil(t, rec.LockedUntil)
	require.True(t, rec.LockedUntil.After(rolledBack.Add(clock.Offset()+short/2)),
		"the lease counts from the write: locked_until %s, rolled back at %s (moved by %s)", rec.LockedUntil, rolledBack, clock.Offset())
	require.LessOrEqual(t, rec.LeaseLeft, short)
	require.Positive(t, take.Record.LeaseLeft)
	require.LessOrEqual(t, take.Record.LeaseLeft, short, "the claim reports no more lease than it has")
	// A duplicate right after is answered 409, not a second execution: the
	// clock moved back by the time since the rollback, which a loaded
	// machine may have made longer than the lease.
	clock.Advance(-time.Since(rolledBack))
	dup := claim(t, sd, params("acct", "k", "body"))
	require.False(t, dup.Claimed)
	require.Equal(t, idemdriver.DecisionInFlight, idemdriver.Decide(&dup.Record, false, p))
}
