package idemdrivertest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// The cases of sealing at rest, key hashing and the kept request (package
// seal, docs/sealing.md): the driver stores Response.SealKey, Sealed and
// Request as given, every completion path writes them, every claim clears
// them; the engine replays a sealed record, rotates keys, and never runs a
// record it cannot open again.

// sealedResponse is a response as the core hands a sealed one to a driver:
// opaque blobs and tags, no headers, no body.
func sealedResponse(marker string) idemdriver.Response {
	return idemdriver.Response{Status: 201, BodyStored: true, BodySize: 42, SealKey: "key-2025.1",
		Sealed: []byte("\x01SEALED-" + marker + "\x00\xff"), Request: []byte("\x01REQ-" + marker + "\x00\xfe"),
		SealTag: []byte("\x02TAG-" + marker + "\x00\xfd"), SealTagDropped: []byte("\x02DROPPEDTAG-" + marker)}
}

// asStored is resp as a driver returns it: SealTagDropped is never stored.
func asStored(resp idemdriver.Response) *idemdriver.Response {
	resp.SealTagDropped = nil
	return &resp
}

// completions are the ways an execution's outcome reaches the store: alone
// (Driver.Complete), in the business transaction (Tx.Complete then Commit,
// or CompleteCommit when the Tx has it) and, with a TxClaimer, in the
// one-commit claim's transaction.
func completions(d idemdriver.Driver) []string {
	ways := []string{"alone", "tx"}
	if _, ok := d.(idemdriver.TxClaimer); ok {
		ways = append(ways, "one-commit")
	}
	return ways
}

// completeVia claims p and records resp by way (completions).
func completeVia(t *testing.T, d idemdriver.Driver, way string, p idemdriver.ClaimParams, resp idemdriver.Response) {
	t.Helper()
	ctx := context.Background()
	var tx idemdriver.Tx
	var res idemdriver.ClaimResult
	switch way {
	case "one-commit":
		var err error
		res, tx, err = d.(idemdriver.TxClaimer).ClaimTx(ctx, p, 5*time.Second)
		require.NoError(t, err)
	case "tx":
		res = claim(t, d, p)
		var err error
		tx, err = d.Begin(ctx)
		require.NoError(t, err)
	default:
		res = claim(t, d, p)
	}
	require.True(t, res.Claimed)
	cp := idemdriver.CompleteParams{FenceParams: fence(res.Record), Response: resp}
	switch cc, ok := tx.(idemdriver.CompleteCommitter); {
	case tx == nil:
		require.True(t, complete(t, d, cp.FenceParams, resp))
	case ok:
		done, err := cc.CompleteCommit(ctx, cp)
		require.NoError(t, err)
		require.True(t, done)
	default:
		require.True(t, complete(t, tx, cp.FenceParams, resp))
		require.NoError(t, tx.Commit(ctx))
	}
}

// The sealed columns round-trip through every completion path: Get and
// List return SealKey, Sealed and Request as written (no headers, no body);
// a claim's replay returns SealKey and Sealed. A plain response keeps its
// meaning, with its Request.
func driverSealedColumns(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	for _, way := range completions(d) {
		sealed, plain := sealedResponse(way), okResponse(`{"id":1}`)
		plain.Request = []byte("plain request " + way)
		completeVia(t, d, way, params("acct", "sealed-"+way, "a"), sealed)
		completeVia(t, d, way, params("acct", "plain-"+way, "a"), plain)

		rec := record(t, d, "acct", "sealed-"+way)
		require.Equal(t, idemdriver.StateSucceeded, rec.State, way)
		require.Equal(t, asStored(sealed), rec.Response, "%s: Get returns the sealed columns as written", way)
		got := record(t, d, "acct", "plain-"+way).Response
		require.Equal(t, plain.Header, got.Header, way)
		require.Equal(t, plain.Body, got.Body, way)
		require.Empty(t, got.SealKey, way)
		require.Nil(t, got.Sealed, way)
		require.Equal(t, plain.Request, got.Request, way)

		res := claim(t, d, params("acct", "sealed-"+way, "a"))
		require.False(t, res.Claimed, way)
		require.Equal(t, sealed.SealKey, res.Record.Response.SealKey, "%s: the replay carries the key id", way)
		require.Equal(t, sealed.Sealed, res.Record.Response.Sealed, "%s: and the blob", way)
		require.Equal(t, sealed.SealTag, res.Record.Response.SealTag, "%s: and the tag", way)
		require.Nil(t, res.Record.Response.SealTagDropped, way)
		require.Equal(t, sealed.BodySize, res.Record.Response.BodySize, way)
	}
	if l, ok := d.(idemdriver.Lister); ok {
		recs, err := l.List(context.Background(), idemdriver.ListParams{Key: "sealed-alone", Limit: 10})
		require.NoError(t, err)
		require.Len(t, recs, 1)
		require.Equal(t, asStored(sealedResponse("alone")), recs[0].Response, "List returns the kept request too")
	}
}

// A claim that starts a new life of an expired sealed record (or takes it
// over) clears seal_key and the kept request with the response: no column
// of the row holds them once the new execution failed.
func driverClaimClearsSealedColumns(t *testing.T, h Harness) {
	t.Parallel()
	require.NotNil(t, h.Dump, "Harness.Dump is required")
	d := h.NewDriver(t)
	completeVia(t, d, "alone", params("acct", "k", "a"), sealedResponse("OLDLIFE"))
	require.Contains(t, string(bytes.Join(h.Dump(t, d), nil)), "REQ-OLDLIFE", "the dump shows the kept request")
	require.Contains(t, string(bytes.Join(h.Dump(t, d), nil)), "TAG-OLDLIFE", "and the seal tag")
	require.NotContains(t, string(bytes.Join(h.Dump(t, d), nil)), "DROPPEDTAG", "and never the tag of a dropped blob")
	clock := &Clock{}
	sd := Shift(d, clock)
	clock.Advance(retention + time.Second)
	res := claim(t, sd, params("acct", "k", "b"))
	require.True(t, res.Claimed, "an expired record is a new life")
	require.True(t, wrote(t, sd.Fail, fence(res.Record)))
	for _, cell := range h.Dump(t, d) {
		require.NotContains(t, string(cell), "OLDLIFE", "the new life holds nothing of the old one's response, request or seal tag")
		require.NotEqual(t, "key-2025.1", string(cell), "nor its seal key")
	}
}

func sealingKey(id string, b byte) seal.Key {
	return seal.Key{ID: id, Secret: bytes.Repeat([]byte{b}, 32)}
}

var keyHashSecret = []byte("conformance key-hash secret")

// sealedResult is fn's Result of a sealed Do: marked body and headers.
func sealedResult(runs *atomic.Int32, marker string) func(context.Context) (idem.Result, error) {
	return func(context.Context) (idem.Result, error) {
		runs.Add(1)
		return idem.Result{Status: 201, Header: map[string][]string{"Location": {"/charges/HDRMARK-" + marker}},
			Body: []byte(`{"charge":"BODYMARK-` + marker + `"}`)}, nil
	}
}

// A sealed, hashed Do is replayed byte for byte; its record names its key
// and holds no header nor body in plain; its request is kept, sealed.
func engineSealedReplay(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	keys := []seal.Key{sealingKey("A", 1)}
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys, KeyHashSecret: keyHashSecret, KeepRequestBytes: 64}})
	var runs atomic.Int32
	first, err := g.Do(t.Context(), doParams("client-key", "REQMARK pay 10"), sealedResult(&runs, "1"))
	require.NoError(t, err)
	again, err := g.Do(t.Context(), doParams("client-key", "REQMARK pay 10"), sealedResult(&runs, "2"))
	require.NoError(t, err)
	require.Equal(t, first, again, "the replay is the stored Result")
	require.Equal(t, "/charges/HDRMARK-1", again.Header["Location"][0])
	require.EqualValues(t, 1, runs.Load())

	stored := seal.HashKey(keyHashSecret, "client-key")
	require.Equal(t, stored, g.StoredKey("client-key"))
	requireGone(t, d, "acct", "client-key", "no record under the client's key")
	rec := record(t, d, "acct", stored)
	require.Equal(t, "A", rec.Response.SealKey)
	require.Nil(t, rec.Response.Header)
	require.Nil(t, rec.Response.Body)
	require.NotContains(t, string(rec.Response.Sealed), "BODYMARK")
	require.NotContains(t, string(rec.Response.Request), "REQMARK")
	kr, err := seal.NewKeyring(keys)
	require.NoError(t, err)
	opened, err := kr.OpenResponse(seal.LifeOf(rec), *rec.Response)
	require.NoError(t, err)
	req, err := seal.DecodeRequest(opened.Request)
	require.NoError(t, err)
	require.Equal(t, seal.Request{Size: 14, Body: []byte("REQMARK pay 10")}, req)
}

// Rotation: records sealed with A replay under [B, A], new ones are sealed
// with B; plain records written before sealing replay with ReplayPlain
// (the migration of a table to sealing), and answer ErrSealBroken without.
func engineSealRotation(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	plain, d := newEngine(t, h, oneCommit, idem.EngineOptions{})
	a := engineOn(t, d, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1)}, ReplayPlain: true}})
	bakeys := []seal.Key{sealingKey("B", 2), sealingKey("A", 1)}
	ba := engineOn(t, d, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: bakeys, ReplayPlain: true}})
	var runs atomic.Int32
	_, err := plain.Do(t.Context(), doParams("plain", "x"), sealedResult(&runs, "p"))
	require.NoError(t, err)
	_, err = a.Do(t.Context(), doParams("ka", "x"), sealedResult(&runs, "a"))
	require.NoError(t, err)
	for key, marker := range map[string]string{"plain": "p", "ka": "a"} {
		out, err := ba.Do(t.Context(), doParams(key, "x"), sealedResult(&runs, "again"))
		require.NoError(t, err, key)
		require.Equal(t, `{"charge":"BODYMARK-`+marker+`"}`, string(out.Body), key)
	}
	sealedOnly := engineOn(t, d, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: bakeys}})
	_, err = sealedOnly.Do(t.Context(), doParams("plain", "x"), sealedResult(&runs, "again"))
	require.ErrorIs(t, err, idem.ErrSealBroken, "once ReplayPlain is removed, a plain record is refused")
	out, err := sealedOnly.Do(t.Context(), doParams("ka", "x"), sealedResult(&runs, "again"))
	require.NoError(t, err)
	require.Equal(t, `{"charge":"BODYMARK-a"}`, string(out.Body))
	_, err = ba.Do(t.Context(), doParams("kb", "x"), sealedResult(&runs, "b"))
	require.NoError(t, err)
	require.EqualValues(t, 3, runs.Load())
	require.Equal(t, "A", record(t, d, "acct", "ka").Response.SealKey)
	require.Equal(t, "B", record(t, d, "acct", "kb").Response.SealKey)
	require.Empty(t, record(t, d, "acct", "plain").Response.SealKey)
}

// engineOn is another engine on d, as another process would be.
func engineOn(t *testing.T, d idemdriver.Driver, oneCommit bool, cfg idem.EngineOptions) *idem.Engine {
	t.Helper()
	cfg.OneCommit.Enabled = oneCommit
	g, err := idem.NewEngineWith(d, cfg)
	require.NoError(t, err)
	return g
}

// A record sealed under a key not configured (config [B] only) answers
// ErrSealKeyMissing and fn never runs again: the record stays SUCCEEDED.
func engineSealKeyMissing(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	a, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1)}}})
	b := engineOn(t, d, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("B", 2)}}})
	var runs atomic.Int32
	_, err := a.Do(t.Context(), doParams("k", "x"), sealedResult(&runs, "1"))
	require.NoError(t, err)
	for range 3 {
		_, err = b.Do(t.Context(), doParams("k", "x"), sealedResult(&runs, "2"))
		require.ErrorIs(t, err, idem.ErrSealKeyMissing)
	}
	require.EqualValues(t, 1, runs.Load(), "fn never ran again")
	require.Equal(t, idemdriver.StateSucceeded, record(t, d, "acct", "k").State)
	out, err := a.Do(t.Context(), doParams("k", "x"), sealedResult(&runs, "3"))
	require.NoError(t, err, "with its key, it replays again")
	require.Equal(t, `{"charge":"BODYMARK-1"}`, string(out.Body))
}

// A sealed blob that does not authenticate (copied from another record, or
// altered) answers ErrSealBroken and fn never runs. The records are written
// through the driver as the engine would have.
func engineSealBroken(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	keys := []seal.Key{sealingKey("A", 1)}
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys}})
	var runs atomic.Int32
	_, err := g.Do(t.Context(), doParams("donor", "x"), sealedResult(&runs, "1"))
	require.NoError(t, err)
	donor := record(t, d, "acct", "donor").Response
	sum := sha256.Sum256([]byte("x"))
	p := idemdriver.ClaimParams{Scope: "acct", Method: "DO", Path: "orders", Fingerprint: sum[:], LeaseDuration: lease, Retention: retention}
	p.Key = "copied"
	completeVia(t, d, "alone", p, *donor)
	altered := *donor
	altered.Sealed = bytes.Clone(donor.Sealed)
	altered.Sealed[len(altered.Sealed)-1] ^= 1
	p.Key = "altered"
	completeVia(t, d, "alone", p, altered)
	for _, key := range []string{"copied", "altered"} {
		_, err := g.Do(t.Context(), doParams(key, "x"), sealedResult(&runs, "2"))
		require.ErrorIs(t, err, idem.ErrSealBroken, key)
		require.Equal(t, idemdriver.StateSucceeded, record(t, d, "acct", key).State, key)
	}
	require.EqualValues(t, 1, runs.Load(), "fn never ran for a broken record")
}

// A storm of Do calls on many keys, duplicates racing each, with sealing,
// key hashing and the kept request on: each key runs once, and no column of
// any row (Harness.Dump, read raw) holds a body, a header value, a payload
// or a client key in plain text.
func engineSealedStorm(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	require.NotNil(t, h.Dump, "Harness.Dump is required")
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1)}, KeyHashSecret: keyHashSecret, KeepRequestBytes: 256}})
	const keys, dups = 24, 3
	runs := make([]atomic.Int32, keys)
	unrecorded := make([]atomic.Int32, keys) // runs whose outcome the store did not take
	var wg sync.WaitGroup
	errs := make(chan error, keys*dups)
	for i := range keys {
		for range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := fmt.Sprint(i)
				for {
					var ran atomic.Bool
					fn := sealedResult(&runs[i], n)
					out, err := g.Do(context.Background(), doParams("CLIENTKEY-"+n, "REQMARK-"+n), func(ctx context.Context) (idem.Result, error) {
						ran.Store(true)
						return fn(ctx)
					})
					if errors.Is(err, idem.ErrInFlight) {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					// The store did not answer in time on a loaded machine: a
					// client retries. After a run, the outcome was not recorded
					// and the retry may run again (CONTRACT section 5).
					if errors.Is(err, idem.ErrStoreUnavailable) || errors.Is(err, idem.ErrLeaseLost) {
						if ran.Load() {
							unrecorded[i].Add(1)
						}
						time.Sleep(5 * time.Millisecond)
						continue
					}
					if err == nil && string(out.Body) != `{"charge":"BODYMARK-`+n+`"}` {
						err = fmt.Errorf("key %d answered %q", i, out.Body)
					}
					errs <- err
					return
				}
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	for i := range keys {
		// A run answered "store unavailable" may also have been recorded
		// (its commit's answer lost): at most, not exactly, one more run.
		require.GreaterOrEqual(t, runs[i].Load(), int32(1), "key %d ran", i)
		require.LessOrEqual(t, runs[i].Load(), 1+unrecorded[i].Load(), "key %d ran once, and again only after a run answered unavailable", i)
	}
	cells := h.Dump(t, d)
	hashed := 0
	for _, c := range cells {
		for _, marker := range []string{"BODYMARK", "HDRMARK", "REQMARK", "CLIENTKEY", "/charges/"} {
			require.NotContains(t, string(c), marker, "a column holds %s in plain text", marker)
		}
		if string(c) == g.StoredKey(fmt.Sprint("CLIENTKEY-", 0)) {
			hashed++
		}
	}
	require.Equal(t, 1, hashed, "the dump holds the stored keys (it sees the rows)")
}

// The downgrade of sealing: someone who can write idem_keys but holds no
// sealing key empties a record's seal_key and puts a plain response in its
// place (or writes a plain record for a key a client will send). An
// engine with Sealing.Keys answers such a record ErrSealBroken, never its
// body, and fn never runs; the record stays SUCCEEDED. With ReplayPlain
// (a table switched to sealing while records written plain live) the plain
// record replays, and new records are still sealed.
func engineSealDowngrade(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	keys := []seal.Key{sealingKey("A", 1)}
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys}})
	var runs atomic.Int32
	_, err := g.Do(t.Context(), doParams("donor", "x"), sealedResult(&runs, "1"))
	require.NoError(t, err)
	donor := record(t, d, "acct", "donor").Response
	sum := sha256.Sum256([]byte("x"))
	p := idemdriver.ClaimParams{Scope: "acct", Method: "DO", Path: "orders", Fingerprint: sum[:], LeaseDuration: lease, Retention: retention}
	planted := idemdriver.Response{Status: 201, Header: map[string][]string{"Location": {"/charges/PLANTED"}},
		Body: []byte(`{"charge":"PLANTED"}`), BodyStored: true, BodySize: 20}
	p.Key = "planted" // a plain response where a sealed one belongs
	completeVia(t, d, "alone", p, planted)
	// The sealed blob kept, its seal_key emptied and its size made the
	// blob's: read as a plain body.
	emptied := *donor
	emptied.SealKey, emptied.Body, emptied.Sealed, emptied.BodySize = "", donor.Sealed, nil, int64(len(donor.Sealed))
	p.Key = "emptied"
	completeVia(t, d, "alone", p, emptied)
	// Its seal_key alone emptied: the blob is not as long as the size
	// recorded with it, so the record reads as damaged (no response), under
	// ReplayPlain too (below).
	onlyKey := emptied
	onlyKey.BodySize = donor.BodySize
	p.Key = "only-key-emptied"
	completeVia(t, d, "alone", p, onlyKey)
	require.Nil(t, record(t, d, "acct", "only-key-emptied").Response)
	for range 2 {
		out, err := g.Do(t.Context(), doParams("only-key-emptied", "x"), sealedResult(&runs, "2"))
		require.ErrorIs(t, err, idem.ErrResponseMissing)
		require.Empty(t, out.Body)
	}
	for _, key := range []string{"planted", "emptied"} {
		require.Empty(t, record(t, d, "acct", key).Response.SealKey, "%s: the row is plain", key)
		for range 2 {
			out, err := g.Do(t.Context(), doParams(key, "x"), sealedResult(&runs, "2"))
			require.ErrorIs(t, err, idem.ErrSealBroken, key)
			require.NotContains(t, string(out.Body), "PLANTED", key)
			require.Empty(t, out.Header, key)
		}
		require.Equal(t, idemdriver.StateSucceeded, record(t, d, "acct", key).State, key)
	}
	require.EqualValues(t, 1, runs.Load(), "fn never ran for a plain record")
	out, err := g.Do(t.Context(), doParams("donor", "x"), sealedResult(&runs, "3"))
	require.NoError(t, err, "a sealed record still replays")
	require.Equal(t, `{"charge":"BODYMARK-1"}`, string(out.Body))

	migrating := engineOn(t, d, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys, ReplayPlain: true}})
	out, err = migrating.Do(t.Context(), doParams("planted", "x"), sealedResult(&runs, "4"))
	require.NoError(t, err, "ReplayPlain replays a plain record")
	require.Equal(t, `{"charge":"PLANTED"}`, string(out.Body))
	out, err = migrating.Do(t.Context(), doParams("only-key-emptied", "x"), sealedResult(&runs, "4"))
	require.ErrorIs(t, err, idem.ErrResponseMissing, "never the blob as a plain body")
	require.Empty(t, out.Body)
	_, err = migrating.Do(t.Context(), doParams("new", "x"), sealedResult(&runs, "5"))
	require.NoError(t, err)
	require.Equal(t, "A", record(t, d, "acct", "new").Response.SealKey, "ReplayPlain still seals")
	require.EqualValues(t, 2, runs.Load())
}

// The downgrade over HTTP: a record written plain (by a server without
// Sealing.Keys, as an attacker would write it) answers a sealed server 500
// seal-broken, as problem details, never the plain body, and the handler
// does not run; behind the replay cache too, which still replays the
// server's own sealed records. A server with ReplayPlain replays it.
func middlewareSealedOnly(t *testing.T, h Harness) {
	t.Parallel()
	d := h.NewDriver(t)
	plain := newServer(t, d, idem.Options{}, &app{})
	first := plain.post(t, "planted", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	keys := []seal.Key{sealingKey("A", 1)}
	sealed := newServer(t, d, idem.Options{
		Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys}, Logger: slog.New(slog.DiscardHandler)},
		Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}},
	}, &app{})
	own := sealed.post(t, "own", `{"amount":2}`)
	require.Equal(t, http.StatusCreated, own.status, "%s", own.body)
	for range 2 {
		a := sealed.post(t, "planted", `{"amount":1}`)
		requireProblem(t, a, http.StatusInternalServerError, "seal-broken")
		require.NotContains(t, string(a.body), `"run"`, "never the plain body")
		require.Empty(t, a.header.Get(idem.HeaderReplayed))
		require.Empty(t, a.header.Get("Location"))
		requireReplay(t, own, sealed.post(t, "own", `{"amount":2}`)) // the second from the cache
	}
	require.EqualValues(t, 1, sealed.app.runs.Load(), "the sealed server's handler ran for its own key only")
	migrating := newServer(t, d, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys, ReplayPlain: true}}}, &app{})
	requireReplay(t, first, migrating.post(t, "planted", `{"amount":1}`))
	require.Zero(t, migrating.app.runs.Load())
}

// The seal binds the plain columns beside it even where the blob is gone.
// Someone who can write idem_keys but holds no sealing key empties a
// sealed record's blob (response_body empty, response_body_stored false), as
// a completion too large for MariaDB's packet is stored, and edits its
// status: the record must not answer as a response not stored under the
// forged status (410 with status 200, the attack), nor as one
// under its own status (an emptied record is no dropped one). Each answers
// ErrSealBroken, and fn never runs again.
func engineSealTagBindsColumns(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	require.NotNil(t, h.Tamper, "Harness.Tamper is required")
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1)}}})
	var runs atomic.Int32
	for key, set := range map[string]map[string]any{
		"forged-status":    {"response_body": []byte{}, "response_body_stored": false, "response_status": 200},
		"emptied":          {"response_body": []byte{}, "response_body_stored": false},
		"status-only":      {"response_status": 200},
		"size-only":        {"response_body_size": 7},
		"stored-flag-only": {"response_body_stored": false},
	} {
		first, err := g.Do(t.Context(), doParams(key, "x"), sealedResult(&runs, key))
		require.NoError(t, err, key)
		require.Equal(t, 201, first.Status)
		rec := record(t, d, "acct", key)
		h.Tamper(t, d, rec.Scope, rec.Key, set)
		for range 2 {
			out, err := g.Do(t.Context(), doParams(key, "x"), sealedResult(&runs, "again"))
			require.ErrorIs(t, err, idem.ErrSealBroken, "%s: %v", key, set)
			require.NotErrorIs(t, err, idem.ErrResponseNotStored, key)
			require.NotEqual(t, 200, out.Status, "%s: never the forged status", key)
			require.Empty(t, out.Body, key)
		}
	}
	require.EqualValues(t, 5, runs.Load(), "fn ran once per key, never for a tampered record")
}

// The attack over HTTP: a sealed record's blob emptied and its
// status edited answers 500 seal-broken, never 410 response-not-stored,
// and the handler does not run again.
func middlewareSealTagBindsStatus(t *testing.T, h Harness) {
	t.Parallel()
	require.NotNil(t, h.Tamper, "Harness.Tamper is required")
	d := h.NewDriver(t)
	s := newServer(t, d, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1)}}, Logger: slog.New(slog.DiscardHandler)}}, &app{})
	first := s.post(t, "k", `{"amount":1}`)
	require.Equal(t, http.StatusCreated, first.status, "%s", first.body)
	h.Tamper(t, d, "global", "k", map[string]any{"response_body": []byte{}, "response_body_stored": false, "response_status": 200})
	for range 2 {
		requireProblem(t, s.post(t, "k", `{"amount":1}`), http.StatusInternalServerError, "seal-broken")
	}
	require.EqualValues(t, 1, s.app.runs.Load())
}

// format1Sealed is a response as idem before seal tags sealed it for scope
// "acct" and key "k1" under key "v1" (32 bytes of 7): a format-1 blob, no
// seal tag. Status 201, body {"id":"ch_1"}, Location /charges/1.
func format1Sealed(t *testing.T) idemdriver.Response {
	t.Helper()
	blob, err := hex.DecodeString("0112c8264dc559ba30340179fcee48695e80814f9ede99db636a91bf07f60b7439cc34fbd1a71520f837b3d65e" +
		"7a6398f021c0fd0d56522e2b70cc7689841004cc08ca967c90c4")
	require.NoError(t, err)
	return idemdriver.Response{Status: 201, BodyStored: true, BodySize: 13, SealKey: "v1", Sealed: blob}
}

// A record sealed before seal tags (format 1: a blob, no tag) still
// replays after the upgrade, through every driver's NULL seal_tag; one
// whose blob was emptied and status edited (the attack seal tags close)
// authenticates nothing and answers ErrSealBroken.
func engineSealFormat1StillOpens(t *testing.T, h Harness, oneCommit bool) {
	t.Parallel()
	g, d := newEngine(t, h, oneCommit, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealingKey("A", 1), sealingKey("v1", 7)}}})
	p := idemdriver.ClaimParams{Scope: "acct", Key: "k1", Method: "DO", Path: "orders", Fingerprint: fingerprint("x"),
		LeaseDuration: lease, Retention: retention}
	completeVia(t, d, "alone", p, format1Sealed(t))
	require.Empty(t, record(t, d, "acct", "k1").Response.SealTag, "no tag")
	var runs atomic.Int32
	for range 2 {
		out, err := g.Do(t.Context(), doParams("k1", "x"), sealedResult(&runs, "again"))
		require.NoError(t, err)
		require.Equal(t, idem.Result{Status: 201, Header: map[string][]string{"Location": {"/charges/1"}}, Body: []byte(`{"id":"ch_1"}`)}, out)
	}
	emptied := format1Sealed(t)
	emptied.Sealed, emptied.BodyStored, emptied.Status = nil, false, 200
	p.Key = "k2"
	completeVia(t, d, "alone", p, emptied)
	out, err := g.Do(t.Context(), doParams("k2", "x"), sealedResult(&runs, "again"))
	require.ErrorIs(t, err, idem.ErrSealBroken)
	require.NotEqual(t, 200, out.Status)
	require.Zero(t, runs.Load())
}
