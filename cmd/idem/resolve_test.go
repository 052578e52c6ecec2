package main

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
)

// idem resolve on every database with steps: an UNKNOWN record that an
// at-most-once step left is listed, inspected and counted as such, and
// resolved applied (the retry gets the given result, the step does not run)
// or not applied (the retry runs the step).
func TestResolve(t *testing.T) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			url, d := b.setup(t, b.partitioned)
			c := cli{t: t, url: url}
			c.ok(b.migrateUp()...)
			g, err := idem.NewEngineWith(d, idem.EngineOptions{Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			runs := map[string]int{}
			uncertain := true
			do := func(key string) (string, error) {
				out, err := g.Do(context.Background(), idem.DoParams{Scope: "acct", Key: key}, func(ctx context.Context) (idem.Result, error) {
					id, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) {
						runs[key]++
						if uncertain {
							return "", errors.New("the bank did not answer")
						}
						return "tr_" + key, nil
					}, idem.AtMostOnce())
					return idem.Result{Body: []byte(id)}, err
				})
				return string(out.Body), err
			}
			for _, key := range []string{"a", "b"} {
				_, err := do(key)
				require.ErrorIs(t, err, idem.ErrOutcomeUnknown)
			}
			uncertain = false

			require.Contains(t, c.ok("inspect", "--scope", "acct", "--key", "a"), "409 outcome-unknown")
			require.Contains(t, c.ok("list", "--state", "unknown"), "acct")
			require.Regexp(t, `UNKNOWN\s+2`, c.ok("stats"))
			require.Regexp(t, `(?s)UNKNOWN: the outcome cannot be known.*acct\s+a\s+transfer\s+step-uncertain`, c.ok("stuck"))
			unknown := c.json("stuck")["unknown"].([]any)
			require.Len(t, unknown, 2)
			require.Equal(t, "step-uncertain", unknown[0].(map[string]any)["reason"])

			_, errOut, code := c.run("release", "--scope", "acct", "--key", "a", "--force")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, "not released, even with --force: it is UNKNOWN", "never released: its next life would run the step again")
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", "tr_1", "--by", "ops", "--why", "x")
			require.Equal(t, 2, code, "a result that is not JSON: %s", errOut)
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", "null", "--by", "ops", "--why", "x")
			require.Equal(t, 2, code, "a null result: %s", errOut)
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"tr_bank"`)
			require.Equal(t, 2, code, "--by and --why are required: %s", errOut)
			// A fresh user's operator resolved with the default 24h on a 72h
			// server: the record expired before the client's retry, whose new
			// life ran the at-most-once step again. --retention is required.
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"tr_bank"`, "--by", "ops", "--why", "x")
			require.Equal(t, 2, code, "--retention is required: %s", errOut)
			require.Contains(t, errOut, "--retention is required")
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"x"`, "--by", "ops", "--why", "x",
				"--retention", "24h", "--step", "idem:request")
			require.Equal(t, 2, code, "idem's own step is not the application's to resolve: %s", errOut)
			require.Contains(t, errOut, "idem's own")
			// Regression (the next fresh user): --retention 1ms was taken, and
			// the record, purged at once, ran its at-most-once step again.
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"x"`, "--by", "ops", "--why", "x",
				"--retention", "1ms")
			require.Equal(t, 2, code, "shorter than any server's retention: %s", errOut)
			require.Contains(t, errOut, "shorter than any server's Engine.Retention")

			if b.partitioned {
				_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"tr_bank"`, "--by", "ops", "--why", "x", "--retention", "200h")
				require.Equal(t, 2, code)
				require.Contains(t, errOut, "--retention 200h0m0s ends past this store's last partition", "not the database's 'no partition'")
			}
			out := c.ok("resolve", "--scope", "acct", "--key", "a", "--applied", "--result", `"tr_bank"`, "--by", "ops@example.com", "--why", "INC-7 statement", "--retention", "24h")
			require.Contains(t, out, "resolved acct/a step transfer: applied")
			c.ok("resolve", "--scope", "acct", "--key", "b", "--not-applied", "--by", "ops@example.com", "--why", "not on the statement", "--retention", "24h")
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "a", "--not-applied", "--by", "ops", "--why", "again", "--retention", "24h")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, "not UNKNOWN")

			shown := c.ok("inspect", "--scope", "acct", "--key", "a")
			require.Regexp(t, `(?m)^steps:\n  transfer\s+done \(fencing token \d+, [^)]*\); at-most-once; UNKNOWN: step-uncertain; resolved by ops@example.com at [^:]+:[^;]*: INC-7 statement; relayed key idr1_`, shown)
			shownSteps := c.json("inspect", "--scope", "acct", "--key", "b")["steps"].([]any)
			require.Equal(t, "cleared", shownSteps[0].(map[string]any)["state"])

			got, err := do("a")
			require.NoError(t, err)
			require.Equal(t, "tr_bank", got, "the resolved result")
			require.Equal(t, 1, runs["a"], "not run again")
			got, err = do("b")
			require.NoError(t, err)
			require.Equal(t, "tr_b", got)
			require.Equal(t, 2, runs["b"], "run once more, not applied before")

			rec, err := d.Get(context.Background(), idemdriver.GetParams{Scope: "acct", Key: "a"})
			require.NoError(t, err)
			steps, err := d.(idemdriver.Stepper).Steps(context.Background(), idemdriver.StepParams{Scope: "acct", Key: "a", CreatedAt: rec.CreatedAt})
			require.NoError(t, err)
			require.Equal(t, "ops@example.com", steps[0].ResolvedBy)
			require.True(t, strings.HasPrefix(steps[0].ResolvedWhy, "INC-7"))

			// A record the completer gave up on after its step recorded a
			// result (here: fn failed after the step, then the give-up):
			// inspect shows that result, --not-applied is refused (it
			// would erase it, and the retry would run the step again:
			// a fresh user's second charge), --applied keeps it.
			ctx := context.Background()
			_, err = g.Do(ctx, idem.DoParams{Scope: "acct", Key: "c"}, func(ctx context.Context) (idem.Result, error) {
				_, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) { runs["c"]++; return "tr_c", nil }, idem.AtMostOnce())
				require.NoError(t, err)
				return idem.Result{}, errors.New("the ledger write failed")
			})
			require.Error(t, err)
			failed, err := d.Get(ctx, idemdriver.GetParams{Scope: "acct", Key: "c"})
			require.NoError(t, err)
			again, err := d.Claim(ctx, idemdriver.ClaimParams{Scope: "acct", Key: "c", Method: failed.Method, Path: failed.Path,
				Fingerprint: failed.Fingerprint, LeaseDuration: time.Minute, Retention: time.Hour})
			require.NoError(t, err)
			require.True(t, again.Claimed)
			require.NoError(t, d.(idemdriver.Stepper).MarkUnknown(ctx, idemdriver.UnknownParams{StepParams: idemdriver.StepParams{
				Scope: "acct", Key: "c", FencingToken: again.Record.FencingToken, CreatedAt: failed.CreatedAt, Name: "transfer"},
				Reason: idemdriver.ReasonCompleterGaveUp}))
			require.Contains(t, c.ok("inspect", "--scope", "acct", "--key", "c"), `result {"v":1,"value":"tr_c"}`)
			_, errOut, code = c.run("resolve", "--scope", "acct", "--key", "c", "--not-applied", "--by", "ops", "--why", "x", "--retention", "24h")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, `step "transfer" has a recorded result`)
			require.Contains(t, c.ok("resolve", "--scope", "acct", "--key", "c", "--applied", "--by", "ops", "--why", "x", "--retention", "24h"), "applied (its recorded result kept)")
			booked, err := g.Do(ctx, idem.DoParams{Scope: "acct", Key: "c"}, func(ctx context.Context) (idem.Result, error) {
				id, err := idem.Step(ctx, "transfer", func(context.Context) (string, error) { runs["c"]++; return "tr_again", nil }, idem.AtMostOnce())
				return idem.Result{Body: []byte(id)}, err
			})
			require.NoError(t, err)
			require.Equal(t, "tr_c", string(booked.Body), "the recorded result")
			require.Equal(t, 1, runs["c"], "the step ran once")
			_, errOut, code = c.run("release", "--scope", "acct", "--key", "c")
			require.Equal(t, 1, code)
			require.Contains(t, errOut, "steps of its life started (transfer: result recorded)", "release names the steps it would run again")
		})
	}
}
