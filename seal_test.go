package idem_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

func sealKey(id string, b byte) seal.Key {
	return seal.Key{ID: id, Secret: bytes.Repeat([]byte{b}, 32)}
}

var hashSecret = []byte("0123456789abcdef-hash-secret")

// dumpRows reads every column of every idem_keys row of db as the database
// returns it: the raw bytes of text and blob columns, integers as text.
func dumpRows(t *testing.T, db *sql.DB) [][]byte {
	t.Helper()
	rows, err := db.QueryContext(t.Context(), `SELECT * FROM idem_keys`)
	require.NoError(t, err)
	defer func() { _ = rows.Close() }()
	cols, err := rows.Columns()
	require.NoError(t, err)
	var out [][]byte
	for rows.Next() {
		vals := make([]sql.RawBytes, len(cols))
		dest := make([]any, len(cols))
		for i := range vals {
			dest[i] = &vals[i]
		}
		require.NoError(t, rows.Scan(dest...))
		for _, v := range vals {
			out = append(out, bytes.Clone(v))
		}
	}
	require.NoError(t, rows.Err())
	return out
}

// markedHandler answers 201 with a body and a Location that carry the
// request's marker (its key's number), counting its runs per key.
type markedHandler struct {
	mu   sync.Mutex
	runs map[string]int
}

func (h *markedHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	n := r.Header.Get("X-N")
	h.mu.Lock()
	h.runs[n]++
	h.mu.Unlock()
	w.Header().Set("Location", "/orders/HDRMARK-"+n)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = fmt.Fprintf(w, `{"payment":"BODYMARK-%s"}`, n)
}

// A storm of requests on many keys, several duplicates each, with sealing,
// key hashing and the kept request on: every key runs once and replays
// byte for byte, and no column of any row holds a body, a header value, a
// request body, a query or a client key in plain text.
func TestSealedStormLeavesNoPlainText(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	h := &markedHandler{runs: map[string]int{}}
	obs := &events{}
	mw := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Observer: obs, Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("k2025", 1)}, KeyHashSecret: hashSecret, KeepRequestBytes: 1 << 10}}})
	srv := mw.Handler(h)
	const keys, dups = 24, 3
	var wg sync.WaitGroup
	bodies := make([][]string, keys)
	for i := range keys {
		bodies[i] = make([]string, dups)
		for j := range dups {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := fmt.Sprint(i)
				for {
					rec := send(srv, http.MethodPost, "/orders?note=QRYMARK-"+n, "CLIENTKEY-"+n, `{"card":"REQMARK-`+n+`"}`,
						func(r *http.Request) { r.Header.Set("X-N", n) })
					// A duplicate in flight, or SQLite's one writer busy under
					// the storm (503): a client retries with the same key.
					if rec.Code == http.StatusConflict || rec.Code == http.StatusServiceUnavailable {
						time.Sleep(5 * time.Millisecond)
						continue
					}
					require.Equal(t, http.StatusCreated, rec.Code, rec.Body.String())
					require.Equal(t, "/orders/HDRMARK-"+n, rec.Header().Get("Location"))
					bodies[i][j] = rec.Body.String()
					return
				}
			}()
		}
	}
	wg.Wait()
	// Every key ran once. Under load a run may also end
	// unrecorded (SQLite's one writer busy past CompleteTimeout: 503, or the
	// lease lost): its client retries and the key runs again, as the
	// contract allows (section 5). So each run is accounted for by its event.
	evs := obs.take()
	for i := range keys {
		stored := mw.Engine().StoredKey("CLIENTKEY-" + fmt.Sprint(i))
		var ran, recorded int
		var unrecorded []string
		for _, e := range evs {
			if e.Key != stored || e.Handler == 0 {
				continue
			}
			ran++
			switch {
			case (e.Kind == idem.EventExecuted || e.Kind == idem.EventTakenOver) && e.Outcome == idem.Succeeded && e.Status == http.StatusCreated:
				recorded++
			case e.Kind == idem.EventCompletionFailed || e.Kind == idem.EventLeaseLost ||
				(e.Kind == idem.EventExecuted && e.Outcome == idem.Failed && e.Status >= 500):
				unrecorded = append(unrecorded, fmt.Sprintf("%v %d: %v", e.Kind, e.Status, e.Err))
			default:
				t.Errorf("key %d: a run ended %v %d %v", i, e.Kind, e.Status, e.Outcome)
			}
		}
		// A run answered 503 may still have been recorded (its commit's
		// answer lost), so at most one recorded run, and at most one more
		// run per 503.
		require.LessOrEqual(t, recorded, 1, "key %d: one recorded outcome", i)
		require.Equal(t, ran, h.runs[fmt.Sprint(i)], "key %d: every run observed", i)
		require.Positive(t, ran, "key %d ran", i)
		require.LessOrEqual(t, ran, 1+len(unrecorded), "key %d: a run again only after one answered 503: %v", i, unrecorded)
		for j := range dups {
			require.Equal(t, fmt.Sprintf(`{"payment":"BODYMARK-%d"}`, i), bodies[i][j])
		}
	}
	cells := dumpRows(t, store.DB())
	require.NotEmpty(t, cells)
	var rows int
	for _, c := range cells {
		for _, marker := range []string{"BODYMARK", "HDRMARK", "REQMARK", "QRYMARK", "CLIENTKEY", "application/json", "/orders/"} {
			require.NotContains(t, string(c), marker, "a column holds %s in plain text", marker)
		}
		if strings.HasPrefix(string(c), "h1_") {
			rows++
		}
	}
	require.Equal(t, keys, rows, "every row's key is the hashed one")
	// The same dump without sealing shows them: the check can see a marker.
	plain := openSQLite(t)
	srv = newMiddleware(t, plain, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{KeepRequestBytes: 1 << 10}}}).Handler(h)
	send(srv, http.MethodPost, "/orders?note=QRYMARK-x", "CLIENTKEY-x", `{"card":"REQMARK-x"}`, func(r *http.Request) { r.Header.Set("X-N", "x") })
	all := string(bytes.Join(dumpRows(t, plain.DB()), []byte{0}))
	for _, marker := range []string{"BODYMARK", "HDRMARK", "REQMARK", "QRYMARK", "CLIENTKEY"} {
		require.Contains(t, all, marker)
	}
}

// Rotation: records sealed with A replay under [B, A]; new records are
// sealed with B. Records written before sealing replay with ReplayPlain
// (the table's migration to sealing), and answer 500 seal-broken without.
func TestSealKeyRotation(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	c := &counter{status: http.StatusCreated}
	plain := newMiddleware(t, store, idem.Options{}).Handler(c)
	require.Equal(t, http.StatusCreated, send(plain, http.MethodPost, "/p", "plain", `{}`).Code)
	a := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("A", 1)}, ReplayPlain: true}}}).Handler(c)
	require.Equal(t, http.StatusCreated, send(a, http.MethodPost, "/p", "ka", `{}`).Code)
	require.Equal(t, "A", record(t, store, idem.SingleTenantScope, "ka").Response.SealKey)
	require.Empty(t, record(t, store, idem.SingleTenantScope, "plain").Response.SealKey)

	bakeys := []seal.Key{sealKey("B", 2), sealKey("A", 1)}
	ba := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: bakeys, ReplayPlain: true}}}).Handler(c)
	for _, k := range []string{"ka", "plain"} {
		rec := send(ba, http.MethodPost, "/p", k, `{}`)
		require.Equal(t, http.StatusCreated, rec.Code, k)
		require.Equal(t, "true", rec.Header().Get(idem.HeaderReplayed), k)
	}
	require.Equal(t, http.StatusCreated, send(ba, http.MethodPost, "/p", "kb", `{}`).Code)
	require.Equal(t, "B", record(t, store, idem.SingleTenantScope, "kb").Response.SealKey)
	require.Equal(t, 3, c.runs, "plain, ka and kb ran once each")

	sealedOnly := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: bakeys}}}).Handler(c)
	rec := send(sealedOnly, http.MethodPost, "/p", "plain", `{}`)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	requireProblem(t, rec.Body.Bytes(), "seal-broken")
	require.Equal(t, http.StatusCreated, send(sealedOnly, http.MethodPost, "/p", "ka", `{}`).Code)
	require.Equal(t, 3, c.runs, "a plain record is not run again")
}

// A record sealed under a key no longer configured answers 500
// seal-key-missing, and the handler does not run again: the record stays
// SUCCEEDED. Do returns ErrSealKeyMissing.
func TestSealKeyMissingNeverRunsAgain(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	c := &counter{status: http.StatusCreated}
	a := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("A", 1)}}}})
	require.Equal(t, http.StatusCreated, send(a.Handler(c), http.MethodPost, "/p", "k", `{}`).Code)
	_, err := a.Engine().Do(t.Context(), idem.DoParams{Scope: "s", Key: "d", Payload: []byte("x")},
		func(context.Context) (idem.Result, error) { return idem.Result{Status: 201, Body: []byte("ok")}, nil })
	require.NoError(t, err)

	b := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("B", 2)}}}})
	for range 2 {
		rec := send(b.Handler(c), http.MethodPost, "/p", "k", `{}`)
		require.Equal(t, http.StatusInternalServerError, rec.Code)
		requireProblem(t, rec.Body.Bytes(), "seal-key-missing")
		require.Empty(t, rec.Header().Get(idem.HeaderReplayed))
	}
	require.Equal(t, 1, c.runs, "the handler never ran again")
	require.Equal(t, idemdriver.StateSucceeded, record(t, store, idem.SingleTenantScope, "k").State)

	var runs int
	_, err = b.Engine().Do(t.Context(), idem.DoParams{Scope: "s", Key: "d", Payload: []byte("x")},
		func(context.Context) (idem.Result, error) { runs++; return idem.Result{}, nil })
	require.ErrorIs(t, err, idem.ErrSealKeyMissing)
	require.ErrorIs(t, err, seal.ErrKeyMissing)
	require.Zero(t, runs)

	// Unsealed, no keyring at all: the same answer.
	none := newMiddleware(t, store, idem.Options{})
	rec := send(none.Handler(c), http.MethodPost, "/p", "k", `{}`)
	require.Equal(t, http.StatusInternalServerError, rec.Code)
	requireProblem(t, rec.Body.Bytes(), "seal-key-missing")
	require.Equal(t, 1, c.runs)
}

func requireProblem(t *testing.T, body []byte, kind string) {
	t.Helper()
	var p idem.Problem
	require.NoError(t, json.Unmarshal(body, &p), "%s", body)
	require.Equal(t, idem.ProblemTypeBase+kind, p.Type, "%s", body)
}

// A sealed blob altered in place, copied from another record, or beside an
// edited status answers 500 seal-broken; the handler never runs again.
func TestSealBrokenNeverRunsAgain(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	c := &counter{status: http.StatusCreated}
	srv := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("A", 1)}}}}).Handler(c)
	for _, k := range []string{"flip", "copy", "donor", "status"} {
		require.Equal(t, http.StatusCreated, send(srv, http.MethodPost, "/p", k, `{}`).Code)
	}
	db := store.DB()
	exec := func(q string, args ...any) {
		t.Helper()
		res, err := db.ExecContext(t.Context(), q, args...)
		require.NoError(t, err)
		n, err := res.RowsAffected()
		require.NoError(t, err)
		require.EqualValues(t, 1, n, q)
	}
	var blob []byte
	require.NoError(t, db.QueryRowContext(t.Context(), `SELECT response_body FROM idem_keys WHERE key = 'flip'`).Scan(&blob))
	blob[len(blob)-20] ^= 1
	exec(`UPDATE idem_keys SET response_body = ? WHERE key = 'flip'`, blob)
	exec(`UPDATE idem_keys SET response_body = (SELECT response_body FROM idem_keys WHERE key = 'donor') WHERE key = 'copy'`)
	exec(`UPDATE idem_keys SET response_status = 200 WHERE key = 'status'`)
	for _, k := range []string{"flip", "copy", "status"} {
		rec := send(srv, http.MethodPost, "/p", k, `{}`)
		require.Equal(t, http.StatusInternalServerError, rec.Code, k)
		requireProblem(t, rec.Body.Bytes(), "seal-broken")
		require.Equal(t, idemdriver.StateSucceeded, record(t, store, idem.SingleTenantScope, k).State)
	}
	require.Equal(t, http.StatusCreated, send(srv, http.MethodPost, "/p", "donor", `{}`).Code, "the donor still replays")
	require.Equal(t, 4, c.runs, "no key ran twice")
}

// With KeyHashSecret the record is stored under seal.HashKey of the key
// (Engine.StoredKey), never under the key itself; the handler's Execution
// and RelayKey still name the client's key.
func TestKeyHashing(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	mw := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{KeyHashSecret: hashSecret}, RelaySecret: []byte("r")}})
	var exec idem.Execution
	var relay string
	srv := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		exec, _ = idem.ExecutionFromContext(r.Context())
		relay, _ = idem.RelayKey(r.Context(), "charge")
		w.WriteHeader(http.StatusCreated)
	}))
	rec := send(srv, http.MethodPost, "/p", "order-42", `{}`)
	require.Equal(t, http.StatusCreated, rec.Code)
	require.Equal(t, "order-42", rec.Header().Get(idem.HeaderKey), "the answer echoes the key as sent")
	stored := seal.HashKey(hashSecret, "order-42")
	require.Equal(t, stored, mw.Engine().StoredKey("order-42"))
	require.Len(t, stored, seal.HashedKeyLength)
	require.Equal(t, idemdriver.StateSucceeded, record(t, store, idem.SingleTenantScope, stored).State)
	_, err := store.Get(t.Context(), idemdriver.GetParams{Scope: idem.SingleTenantScope, Key: "order-42"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound, "no record under the client's key")
	require.Equal(t, "order-42", exec.Key)
	require.Equal(t, idem.DeriveKey([]byte("r"), idem.SingleTenantScope, "order-42", exec.Created, "charge"), relay,
		"the relayed key derives from the client's key")
	require.Equal(t, "true", send(srv, http.MethodPost, "/p", "order-42", `{}`).Header().Get(idem.HeaderReplayed))
	require.NotEqual(t, seal.HashKey([]byte("another secret, 16+"), "order-42"), stored)
}

// keptRequest opens the request kept in the record of (scope, key).
func keptRequest(t *testing.T, store idem.Store, keys []seal.Key, scope, key string) (seal.Request, bool) {
	t.Helper()
	rec := record(t, store, scope, key)
	if rec.Response == nil || rec.Response.Request == nil {
		return seal.Request{}, false
	}
	kr, err := seal.NewKeyring(keys)
	require.NoError(t, err)
	resp, err := kr.OpenResponse(seal.LifeOf(rec), *rec.Response)
	require.NoError(t, err)
	req, err := seal.DecodeRequest(resp.Request)
	require.NoError(t, err)
	return req, true
}

// KeepRequestBytes keeps the request's body (cut at the cap, its size and
// the cut flagged), query and Content-Type with a SUCCEEDED record, sealed
// or not; a FAILED record keeps none; the purge removes it with the record.
func TestKeptRequest(t *testing.T) {
	t.Parallel()
	for _, sealed := range []bool{false, true} {
		t.Run(fmt.Sprint("sealed=", sealed), func(t *testing.T) {
			t.Parallel()
			store := openSQLite(t)
			var keys []seal.Key
			if sealed {
				keys = []seal.Key{sealKey("A", 1)}
			}
			status := http.StatusCreated
			mw := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: keys, KeepRequestBytes: 8}}})
			srv := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(status) }))
			send(srv, http.MethodPost, "/p?a=1&b=2", "short", `{"a":1}`)
			send(srv, http.MethodPost, "/p", "long", `{"amount":1000}`, func(r *http.Request) { r.Header.Set("Content-Type", "text/plain") })
			status = http.StatusServiceUnavailable
			send(srv, http.MethodPost, "/p", "failed", `{}`)

			req, ok := keptRequest(t, store, keys, idem.SingleTenantScope, "short")
			require.True(t, ok)
			require.Equal(t, seal.Request{ContentType: "application/json", Query: "a=1&b=2", Size: 7, Body: []byte(`{"a":1}`)}, req)
			req, ok = keptRequest(t, store, keys, idem.SingleTenantScope, "long")
			require.True(t, ok)
			require.Equal(t, seal.Request{ContentType: "text/plain", Size: 15, Truncated: true, Body: []byte(`{"amount`)}, req)
			require.Equal(t, idemdriver.StateFailed, record(t, store, idem.SingleTenantScope, "failed").State)
			_, ok = keptRequest(t, store, keys, idem.SingleTenantScope, "failed")
			require.False(t, ok, "a FAILED record keeps no request")

			n, err := store.PurgeExpired(t.Context(), idemdriver.PurgeParams{Limit: 100, ClockOffset: idem.DefaultRetention + time.Minute})
			require.NoError(t, err)
			require.EqualValues(t, 3, n)
			var left int
			require.NoError(t, store.DB().QueryRowContext(t.Context(), `SELECT count(*) FROM idem_keys WHERE request IS NOT NULL`).Scan(&left))
			require.Zero(t, left, "the purge removed the kept requests with their records")
		})
	}
}

// Do keeps its Payload as the request.
func TestDoKeepsPayload(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	g, err := idem.NewEngineWith(store, idem.EngineOptions{Sealing: idem.SealingOptions{KeepRequestBytes: 100, KeyHashSecret: hashSecret}})
	require.NoError(t, err)
	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: []byte("pay 10")},
		func(context.Context) (idem.Result, error) { return idem.Result{Status: 200}, nil })
	require.NoError(t, err)
	req, ok := keptRequest(t, store, nil, "s", g.StoredKey("k"))
	require.True(t, ok)
	require.Equal(t, seal.Request{Size: 6, Body: []byte("pay 10")}, req)
}

// The new fields are validated, each error naming its field.
func TestSealingConfigValidation(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	for _, tc := range []struct {
		name string
		cfg  idem.EngineOptions
		want []string
	}{
		{"short secret", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{ID: "a", Secret: make([]byte, 20)}}}},
			[]string{"Sealing.Keys[0].Secret is 20 bytes; AES takes 16, 24 or 32"}},
		{"empty id", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{Secret: make([]byte, 16)}}}}, []string{"Sealing.Keys[0].ID is empty"}},
		{"long id", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{ID: strings.Repeat("a", 33), Secret: make([]byte, 16)}}}},
			[]string{"Sealing.Keys[0].ID is 33 bytes; at most 32"}},
		{"bad id", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{ID: "a:b", Secret: make([]byte, 24)}}}}, []string{`Sealing.Keys[0].ID "a:b" holds a character`}},
		{"duplicate", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("a", 1), sealKey("b", 2), sealKey("a", 3)}}},
			[]string{`Sealing.Keys[2].ID "a" repeats Sealing.Keys[0].ID`}},
		{"both wrong", idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{{}}}}, []string{"Sealing.Keys[0].ID is empty", "Sealing.Keys[0].Secret is 0 bytes"}},
		{"hash secret", idem.EngineOptions{Sealing: idem.SealingOptions{KeyHashSecret: []byte("short")}}, []string{"KeyHashSecret is 5 bytes; it needs at least 16"}},
		{"keep", idem.EngineOptions{Sealing: idem.SealingOptions{KeepRequestBytes: -1}}, []string{"KeepRequestBytes must not be negative"}},
		{"replay plain unsealed", idem.EngineOptions{Sealing: idem.SealingOptions{ReplayPlain: true}}, []string{"ReplayPlain applies to a sealed engine only"}},
	} {
		_, err := idem.NewEngineWith(store, tc.cfg)
		require.Error(t, err, tc.name)
		for _, w := range tc.want {
			require.Contains(t, err.Error(), w, tc.name)
		}
		_, err = idem.NewMiddleware(store, idem.Options{Engine: tc.cfg, Scope: idem.SingleTenant})
		require.Error(t, err, tc.name)
	}
	_, err := idem.NewEngineWith(store, idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("new", 1), {ID: "old.2024-01", Secret: make([]byte, 16)}}, KeyHashSecret: make([]byte, 16), KeepRequestBytes: 1}})
	require.NoError(t, err)
}

// A sealed record replays byte for byte from the store and then from the
// replay cache (which holds the opened response, in memory only).
func TestSealedReplayCache(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	h := &markedHandler{runs: map[string]int{}}
	srv := newMiddleware(t, store, idem.Options{
		Replay: idem.ReplayOptions{Cache: idem.ReplayCacheOptions{Bytes: 1 << 20}},
		Engine: idem.EngineOptions{Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("A", 1)}, KeyHashSecret: hashSecret, KeepRequestBytes: 64}},
	}).Handler(h)
	var got []string
	for range 3 {
		rec := send(srv, http.MethodPost, "/p", "k", `{}`, func(r *http.Request) { r.Header.Set("X-N", "1") })
		got = append(got, fmt.Sprint(rec.Code)+rec.Header().Get("Location")+rec.Body.String())
	}
	require.Equal(t, got[0], got[1])
	require.Equal(t, got[0], got[2])
	require.Equal(t, "201/orders/HDRMARK-1"+`{"payment":"BODYMARK-1"}`, got[0])
	require.Equal(t, 1, h.runs["1"])
}
