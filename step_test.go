package idem_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemsqlite"
	"github.com/idemgo/idem/seal"
)

type charge struct {
	ID     string `json:"id"`
	Amount int    `json:"amount"`
}

// A step whose execution failed after it is not run again by the retry: the
// retry gets the recorded result, and the relayed key is the same.
func TestStepRunsOnceAcrossRetries(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	var runs atomic.Int32
	var relays []string
	fail := true
	fn := func(ctx context.Context) (idem.Result, error) {
		c, err := idem.Step(ctx, "charge", func(ctx context.Context) (charge, error) {
			runs.Add(1)
			k, err := idem.RelayKey(ctx, "charge")
			relays = append(relays, k)
			return charge{ID: "ch_1", Amount: 500}, err
		})
		if err != nil {
			return idem.Result{}, err
		}
		if fail {
			fail = false
			return idem.Result{}, errors.New("the ledger write failed after the charge")
		}
		return idem.Result{Status: 201, Body: []byte(c.ID)}, nil
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err := g.Do(t.Context(), p, fn)
	require.Error(t, err)
	require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State)
	out, err := g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, "ch_1", string(out.Body))
	require.EqualValues(t, 1, runs.Load(), "the charge ran once")
	require.Len(t, relays, 1)
	rec := record(t, d, "s", "k")
	list, err := d.Steps(t.Context(), idemdriver.StepParams{Scope: "s", Key: "k", CreatedAt: rec.CreatedAt})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.True(t, list[0].Done)
	require.Equal(t, relays[0], string(list[0].Relay), "the start marker carries the relayed key")
}

// How fn's error ends a step: StepFinal is recorded and given back on every
// run; StepNotApplied and an uncertain error run the step again on the
// retry, under the same relayed key.
func TestStepErrorsSayWhatHappened(t *testing.T) {
	t.Parallel()
	declined := errors.New("card declined")
	for _, tc := range []struct {
		name      string
		first     error
		runsAfter int32
	}{
		{"final", idem.StepFinal(declined), 1},
		{"not-applied", idem.StepNotApplied(errors.New("connection refused")), 2},
		{"uncertain", errors.New("read timeout"), 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g, _ := newEngine(t, nil, idem.EngineOptions{})
			var runs atomic.Int32
			relays := map[string]bool{}
			var stepErrs []error
			fn := func(ctx context.Context) (idem.Result, error) {
				_, err := idem.Step(ctx, "charge", func(ctx context.Context) (charge, error) {
					k, _ := idem.RelayKey(ctx, "charge")
					relays[k] = true
					if runs.Add(1) == 1 {
						return charge{}, tc.first
					}
					return charge{ID: "ch_2"}, nil
				})
				stepErrs = append(stepErrs, err)
				return idem.Result{}, err
			}
			p := idem.DoParams{Scope: "s", Key: "k"}
			_, err := g.Do(t.Context(), p, fn)
			require.Error(t, err)
			_, _ = g.Do(t.Context(), p, fn)
			require.Equal(t, tc.runsAfter, runs.Load())
			require.Len(t, relays, 1, "one relayed key for every run")
			if tc.name == "final" {
				var se *idem.StepError
				require.ErrorAs(t, stepErrs[0], &se)
				require.ErrorIs(t, stepErrs[0], declined, "the recording run wraps fn's error")
				require.ErrorAs(t, stepErrs[1], &se, "a re-execution gets the recorded error")
				require.Equal(t, "card declined", se.Message)
				require.Equal(t, "charge", se.Step)
			}
		})
	}
}

// What Step refuses, before fn runs.
func TestStepRefusals(t *testing.T) {
	t.Parallel()
	never := func(context.Context) (int, error) { panic("the step must not run") }
	_, err := idem.Step(t.Context(), "charge", never)
	require.ErrorIs(t, err, idem.ErrNoExecution)

	g, _ := newEngine(t, nil, idem.EngineOptions{})
	do := func(key string, fn func(ctx context.Context) error) error {
		_, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: key}, func(ctx context.Context) (idem.Result, error) {
			return idem.Result{}, fn(ctx)
		})
		return err
	}
	one := func(context.Context) (int, error) { return 1, nil }
	require.NoError(t, do("names", func(ctx context.Context) error {
		for _, bad := range []string{"", "a b", "é", string(bytes.Repeat([]byte("n"), 129)), "idem:request", "idem:charge"} {
			if _, err := idem.Step(ctx, bad, never); !errors.Is(err, idem.ErrStepName) {
				return fmt.Errorf("name %q: %w", bad, err)
			}
		}
		_, err := idem.Step(ctx, string(bytes.Repeat([]byte("n"), 128)), one)
		return err
	}))
	require.ErrorIs(t, do("repeated", func(ctx context.Context) error {
		if _, err := idem.Step(ctx, "sms/1", one); err != nil {
			return err
		}
		_, err := idem.Step(ctx, "sms/1", never)
		return err
	}), idem.ErrStepRepeated)
	require.ErrorIs(t, do("after-tx", func(ctx context.Context) error {
		if _, err := idem.Tx[any](ctx); err != nil {
			return err
		}
		_, err := idem.Step(ctx, "charge", never)
		return err
	}), idem.ErrStepNotAllowed, "SQLite: the claim's transaction holds the write lock")

	require.ErrorContains(t, do("reconcile-type", func(ctx context.Context) error {
		_, err := idem.Step(ctx, "transfer", never, idem.AtMostOnce(),
			idem.Reconcile(func(context.Context, string) (string, error) { return "", nil })) // not the step's int
		return err
	}), "Reconcile's type must be the step's")

	oneCommit, _ := newEngine(t, nil, idem.EngineOptions{OneCommit: idem.OneCommitOptions{Enabled: true}})
	_, err = oneCommit.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", never)
		return idem.Result{}, err
	})
	require.ErrorIs(t, err, idem.ErrStepNotAllowed, "one-commit mode")
}

// ReleaseKey is refused once a step of the record's life started, in this
// execution or an earlier one that this one has not reached yet.
func TestReleaseKeyAfterAStepIsRefused(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err := g.Do(t.Context(), p, func(ctx context.Context) (idem.Result, error) {
		if _, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { return 0, errors.New("timeout") }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{}, nil
	})
	require.Error(t, err)
	_, err = g.Do(t.Context(), p, func(ctx context.Context) (idem.Result, error) {
		return idem.Result{}, idem.ReleaseKey(ctx) // before it reaches the step
	})
	require.ErrorIs(t, err, idem.ErrStepStarted)
	require.Equal(t, idemdriver.StateFailed, record(t, d, "s", "k").State, "not released")

	_, err = g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k2"}, func(ctx context.Context) (idem.Result, error) {
		return idem.Result{}, idem.ReleaseKey(ctx)
	})
	require.ErrorIs(t, err, idem.ErrReleased, "no step: released as before")
	_, err = d.Get(t.Context(), idemdriver.GetParams{Scope: "s", Key: "k2"})
	require.ErrorIs(t, err, idemdriver.ErrNotFound)
}

// A takeover resumes: a recorded step gives its result back, a started one
// runs again under the same relayed key.
func TestStepResumesAfterTakeover(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	payload := []byte("p")
	fp := sha256.Sum256(payload)
	res, err := d.Claim(t.Context(), idemdriver.ClaimParams{Scope: "s", Key: "k", Method: "DO", Fingerprint: fp[:],
		LeaseDuration: time.Second, Retention: 24 * time.Hour, ClockOffset: -time.Hour})
	require.NoError(t, err)
	rec := res.Record
	life := idemdriver.StepParams{Scope: "s", Key: "k", CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken}
	started := func(name string) idemdriver.StartStepParams {
		p := life
		p.Name = name
		return idemdriver.StartStepParams{StepParams: p, Relay: []byte("r")}
	}
	_, err = d.StartStep(t.Context(), started("charge"))
	require.NoError(t, err)
	_, err = d.FinishStep(t.Context(), idemdriver.FinishStepParams{StepParams: started("charge").StepParams,
		Result: []byte(`{"v":1,"value":{"id":"ch_dead","amount":7}}`)})
	require.NoError(t, err)
	_, err = d.StartStep(t.Context(), started("email"))
	require.NoError(t, err)

	var chargeRuns, emailRuns int
	var emailRelay string
	out, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k", Payload: payload}, func(ctx context.Context) (idem.Result, error) {
		c, err := idem.Step(ctx, "charge", func(context.Context) (charge, error) { chargeRuns++; return charge{}, nil })
		if err != nil {
			return idem.Result{}, err
		}
		_, err = idem.Step(ctx, "email", func(ctx context.Context) (bool, error) {
			emailRuns++
			emailRelay, _ = idem.RelayKey(ctx, "email")
			return true, nil
		})
		return idem.Result{Body: []byte(c.ID)}, err
	})
	require.NoError(t, err)
	require.Equal(t, "ch_dead", string(out.Body), "the dead owner's recorded charge")
	require.Equal(t, 0, chargeRuns)
	require.Equal(t, 1, emailRuns, "the started email runs again")
	require.Equal(t, idem.DeriveKey(nil, "s", "k", rec.CreatedAt, "email"), emailRelay, "under the life's relayed key")
}

// A recorded result that no longer decodes into the step's type is never
// answered by running the step again.
func TestStepResultUndecodable(t *testing.T) {
	t.Parallel()
	g, d := newEngine(t, nil, idem.EngineOptions{})
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err := g.Do(t.Context(), p, func(ctx context.Context) (idem.Result, error) {
		if _, err := idem.Step(ctx, "charge", func(context.Context) (string, error) { return "ch_1", nil }); err != nil {
			return idem.Result{}, err
		}
		return idem.Result{}, errors.New("later failure")
	})
	require.Error(t, err)
	runs := 0
	_, err = g.Do(t.Context(), p, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (charge, error) { runs++; return charge{}, nil })
		return idem.Result{}, err
	})
	require.ErrorIs(t, err, idem.ErrStepResultUndecodable)
	require.ErrorIs(t, err, idem.ErrOutcomeUnknown, "held for an operator")
	require.Equal(t, 0, runs)
	rec := record(t, d, "s", "k")
	require.Equal(t, idemdriver.StateUnknown, rec.State)
	list, err := d.Steps(t.Context(), idemdriver.StepParams{Scope: "s", Key: "k", CreatedAt: rec.CreatedAt})
	require.NoError(t, err)
	require.Equal(t, idemdriver.ReasonStepResultUndecodable, list[0].Reason)
}

// With sealing, a step's relayed key and result are stored sealed (no
// plain text of either in idem_steps) and still read back.
func TestStepSealed(t *testing.T) {
	t.Parallel()
	store := openSQLite(t)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, err := idem.Step(r.Context(), "charge", func(context.Context) (charge, error) {
			return charge{ID: "ch_secret_result", Amount: 1}, nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		if r.Header.Get("X-Fail") != "" {
			http.Error(w, "ledger down", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusCreated)
		_, _ = w.Write([]byte(c.ID))
	})
	mw := newMiddleware(t, store, idem.Options{Engine: idem.EngineOptions{
		Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("k1", 1)}, KeyHashSecret: hashSecret}}})
	srv := mw.Handler(h)
	first := send(srv, "POST", "/pay", "client-key-1", "{}", func(r *http.Request) { r.Header.Set("X-Fail", "1") })
	require.Equal(t, http.StatusServiceUnavailable, first.Code)
	second := send(srv, "POST", "/pay", "client-key-1", "{}")
	require.Equal(t, http.StatusCreated, second.Code)
	require.Equal(t, "ch_secret_result", second.Body.String())

	rows, err := store.DB().QueryContext(t.Context(), `SELECT relay, result, seal_key FROM idem_steps`)
	require.NoError(t, err)
	defer rows.Close()
	n := 0
	for rows.Next() {
		var relay, result []byte
		var keyID string
		require.NoError(t, rows.Scan(&relay, &result, &keyID))
		require.Equal(t, "k1", keyID)
		require.NotContains(t, string(relay), "idr1_")
		require.NotContains(t, string(result), "ch_secret_result")
		n++
	}
	require.NoError(t, rows.Err())
	require.Equal(t, 1, n)
}

// Under sealing, a step stored plain is refused as a plain record is
// (docs/sealing.md, "sealed records only"): a result planted with an
// emptied seal_key is never returned, and the step is not run for it;
// Sealing.ReplayPlain reads it, as it reads plain records. Regression: a
// plain step was read under sealing, a forged result returned.
func TestStepStoredPlainUnderSealing(t *testing.T) {
	t.Parallel()
	for _, replayPlain := range []bool{false, true} {
		t.Run(fmt.Sprintf("ReplayPlain=%v", replayPlain), func(t *testing.T) {
			t.Parallel()
			g, d := newEngine(t, nil, idem.EngineOptions{
				Sealing: idem.SealingOptions{Keys: []seal.Key{sealKey("k1", 1)}, ReplayPlain: replayPlain}})
			runs, ledgerDown := 0, true
			fn := func(ctx context.Context) (idem.Result, error) {
				c, err := idem.Step(ctx, "charge", func(context.Context) (charge, error) { runs++; return charge{ID: "ch_real"}, nil })
				if err != nil {
					return idem.Result{}, err
				}
				if ledgerDown {
					ledgerDown = false
					return idem.Result{}, errors.New("ledger down")
				}
				return idem.Result{Body: []byte(c.ID)}, nil
			}
			p := idem.DoParams{Scope: "s", Key: "k"}
			_, err := g.Do(t.Context(), p, fn)
			require.Error(t, err)
			_, err = d.DB().ExecContext(t.Context(), `UPDATE idem_steps SET seal_key = '', result = ?`,
				[]byte(`{"v":1,"value":{"id":"ch_forged","amount":0}}`))
			require.NoError(t, err)
			out, err := g.Do(t.Context(), p, fn)
			if replayPlain {
				require.NoError(t, err)
				require.Equal(t, "ch_forged", string(out.Body), "ReplayPlain reads plain steps")
			} else {
				require.ErrorIs(t, err, idem.ErrSealBroken)
			}
			require.Equal(t, 1, runs, "the step is not run again either way")
		})
	}
}

// failingFinish is a SQLite store whose FinishStep fails while fail is set.
type failingFinish struct {
	*idemsqlite.Driver
	fail atomic.Bool
}

func (f *failingFinish) FinishStep(ctx context.Context, p idemdriver.FinishStepParams) (idemdriver.Step, error) {
	if f.fail.Load() {
		return idemdriver.Step{}, errors.New("disk full")
	}
	return f.Driver.FinishStep(ctx, p)
}

// A result that cannot be recorded: ErrStepNotRecorded, and the step stays
// started, so the retry runs it again under the same relayed key.
func TestStepNotRecordedStaysStarted(t *testing.T) {
	t.Parallel()
	store := &failingFinish{Driver: openSQLite(t)}
	store.fail.Store(true)
	g, _ := newEngine(t, store, idem.EngineOptions{})
	relays := map[string]int{}
	fn := func(ctx context.Context) (idem.Result, error) {
		id, err := idem.Step(ctx, "charge", func(ctx context.Context) (string, error) {
			k, _ := idem.RelayKey(ctx, "charge")
			relays[k]++
			return "ch_1", nil
		})
		return idem.Result{Body: []byte(id)}, err
	}
	p := idem.DoParams{Scope: "s", Key: "k"}
	_, err := g.Do(t.Context(), p, fn)
	require.ErrorIs(t, err, idem.ErrStepNotRecorded)
	require.ErrorIs(t, err, idem.ErrStoreUnavailable, "a store failure: a 503 to retry")
	rec := record(t, store, "s", "k")
	list, err := store.Steps(t.Context(), idemdriver.StepParams{Scope: "s", Key: "k", CreatedAt: rec.CreatedAt})
	require.NoError(t, err)
	require.Len(t, list, 1)
	require.False(t, list[0].Done, "started, no result")

	store.fail.Store(false)
	out, err := g.Do(t.Context(), p, fn)
	require.NoError(t, err)
	require.Equal(t, "ch_1", string(out.Body))
	require.Len(t, relays, 1, "one relayed key")
	for _, n := range relays {
		require.Equal(t, 2, n, "run again on the retry")
	}
}

// oldSchema is a SQLite store whose step statements meet a schema without
// their table or columns, as a driver reports it (idemdriver.ErrSchemaTooOld;
// each driver's own tests check that it does).
type oldSchema struct{ *idemsqlite.Driver }

func (oldSchema) StartStep(context.Context, idemdriver.StartStepParams) (idemdriver.Step, error) {
	return idemdriver.Step{}, fmt.Errorf("idemsqlite: %w: no such column: at_most_once", idemdriver.ErrSchemaTooOld)
}

// A store whose schema predates steps refuses them before fn runs
// (contract 11.3, rolling deploys): ErrStepNotAllowed, wrapping the
// driver's ErrSchemaTooOld.
func TestStepOnAnOldSchemaIsRefused(t *testing.T) {
	t.Parallel()
	g, _ := newEngine(t, oldSchema{openSQLite(t)}, idem.EngineOptions{})
	_, err := g.Do(t.Context(), idem.DoParams{Scope: "s", Key: "k"}, func(ctx context.Context) (idem.Result, error) {
		_, err := idem.Step(ctx, "charge", func(context.Context) (int, error) { panic("the step must not run") })
		return idem.Result{}, err
	})
	require.ErrorIs(t, err, idem.ErrStepNotAllowed)
	require.ErrorIs(t, err, idemdriver.ErrSchemaTooOld)
}
