package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// resolveFlags are resolve's flags.
type resolveFlags struct {
	rf                  recordFlags
	step, result        string
	applied, notApplied bool
	by, why             string
	retention           time.Duration
}

func resolveCmd(g *globals, out io.Writer) *cobra.Command {
	var f resolveFlags
	c := &cobra.Command{
		Use:   "resolve --scope S --key K (--applied [--result JSON] | --not-applied) --by WHO --why TEXT --retention D",
		Short: "End an UNKNOWN record: its at-most-once step's effect happened (with its result) or did not",
		Long: `End an UNKNOWN record (docs/contract.md section 11.3): an at-most-once step
(idem.AtMostOnce) started and its outcome could not be known, or an execution
the completer could not finish (completer-gave-up, not-redrivable), so every
request of the key is answered 409 outcome-unknown and nothing runs it again.
idem inspect shows its steps, with the result of those that have one. Find
out from the callee (the bank's statement, the SMS gateway's log) what
happened, then say it here:

  --applied --result JSON   the effect happened; JSON is the step's result as
                            its handler's type encodes it ("tr_123", or an
                            object), recorded as the step's result (sealed
                            with --seal-key when the store seals). Without
                            --result, a step that has a recorded result
                            keeps it
  --not-applied             the effect did not happen; the step's start is
                            cleared, so the next execution runs it. Refused
                            for a step with a recorded result: its effect
                            happened

Either is a compare-and-set on the record as just read (its fencing token,
created_at and state UNKNOWN) and keeps --by, --why and the time on the step.
The record becomes FAILED with its retention running again and its attempts
counted from 0: the next request of the key resumes the execution in the same
life, and gets the step's result without running it (applied), or runs it (not
applied). Applied, that request is the client's retry or the completer's
re-drive; not applied, only the client's (the completer never starts a step
that did not happen). --step names the step when the record has several; by
default, the one that made it UNKNOWN. The result must decode into the step's
type (the JSON its handler's type encodes, with its field names: a field of
another name is ignored, and leaves the value empty): one that does not
decode makes the record UNKNOWN again (step-result-undecodable), and resolve
can then be run again. --retention is the server's Engine.Retention: a
shorter one lets the record expire early, and once a purge (or another
request of the key) has removed it, the next request starts a new life,
which runs an at-most-once step again. It is refused below 2s, shorter than
any server's (Lease.MaxExecution + Lease.Duration, each at least 1s). On a
partitioned store, now + --retention must fall in a partition that exists.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(cmd); err != nil {
				return err
			}
			return withRecord(cmd, g, out, f.rf, true, func(ctx context.Context, s *store, rec idemdriver.Record) error {
				return resolve(ctx, g, out, s, rec, f)
			})
		},
	}
	f.rf.add(c, "the key's scope (tenant, account)")
	fl := c.Flags()
	fl.StringVar(&f.step, "step", "", "the step to resolve (default: the one that made the record UNKNOWN)")
	fl.BoolVar(&f.applied, "applied", false, "the step's effect happened: record --result as its result")
	fl.StringVar(&f.result, "result", "", "with --applied: the step's result, as JSON")
	fl.BoolVar(&f.notApplied, "not-applied", false, "the step's effect did not happen: clear its start, so it runs again")
	fl.StringVar(&f.by, "by", "", "who resolves it (kept on the step; at most 200 bytes)")
	fl.StringVar(&f.why, "why", "", "why: the evidence (kept on the step; at most 200 bytes)")
	fl.DurationVar(&f.retention, "retention", 0, "the resolved record's retention from now: the server's Engine.Retention (required)")
	return c
}

// check validates f's flags.
func (f *resolveFlags) check(cmd *cobra.Command) error {
	switch {
	case f.rf.key == "" || !cmd.Flags().Changed("scope"):
		return usageError{errors.New("--scope and --key are required")}
	case f.applied == f.notApplied:
		return usageError{errors.New("give one of --applied (with --result) and --not-applied")}
	case f.applied && f.result != "" && !json.Valid([]byte(f.result)):
		return usageError{fmt.Errorf("--result must be the step's result as JSON (a string is quoted: '\"tr_123\"'), not %q", f.result)}
	case f.applied && strings.TrimSpace(f.result) == "null":
		return usageError{errors.New("--result null records no result: give the step's value as its handler's type encodes it")}
	case f.notApplied && f.result != "":
		return usageError{errors.New("--result goes with --applied only")}
	case f.by == "" || f.why == "":
		return usageError{errors.New("--by and --why are required: they are kept with the resolution")}
	case len(f.by) > 200 || len(f.why) > 200:
		return usageError{errors.New("--by and --why are at most 200 bytes each")}
	case strings.HasPrefix(f.step, idemdriver.InternalStepPrefix):
		return usageError{fmt.Errorf("--step %q is idem's own (the request kept for a re-drive), not one of the application's steps: "+
			"name the step that made the record UNKNOWN (see inspect), or leave --step out", f.step)}
	case !cmd.Flags().Changed("retention"):
		return usageError{fmt.Errorf("--retention is required: the server's Engine.Retention (%s unless it sets another), so that "+
			"the resolved record outlives its client's retries: once it has expired and a purge removed it, the next request "+
			"starts a new life, which runs an at-most-once step again", idem.DefaultRetention)}
	case f.retention < minRetention:
		return usageError{fmt.Errorf("--retention %s is shorter than any server's Engine.Retention (at least %s: Lease.MaxExecution + "+
			"Lease.Duration, each at least 1s): give the server's, so that the resolved record outlives its client's retries", f.retention, minRetention)}
	}
	return nil
}

// minRetention is the shortest Engine.Retention a server accepts:
// Lease.MaxExecution + Lease.Duration, each at least 1 s.
const minRetention = 2 * time.Second

// resolve ends rec, an UNKNOWN record, as f says.
func resolve(ctx context.Context, g *globals, out io.Writer, s *store, rec idemdriver.Record, f resolveFlags) error {
	if rec.State != idemdriver.StateUnknown {
		return fmt.Errorf("not resolved: the record is %s, not UNKNOWN; nothing to resolve", rec.State)
	}
	st, ok := s.Driver.(idemdriver.Stepper)
	if !ok {
		return errors.New("this store keeps no steps")
	}
	life := idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt, FencingToken: rec.FencingToken}
	steps, err := st.Steps(ctx, life)
	if err != nil {
		return err
	}
	step, err := unknownStep(steps, f.step)
	if err != nil {
		return err
	}
	if err := partitionedRetention(ctx, s, f.retention); err != nil {
		return err
	}
	p := idemdriver.ResolveStepParams{StepParams: life, Applied: f.applied, By: f.by, Why: f.why, Retention: f.retention}
	p.Name = step.Name
	kept := ""
	switch {
	case step.Done && f.notApplied:
		return fmt.Errorf("not resolved: step %q has a recorded result (see inspect): its effect happened. --not-applied would erase "+
			"that result, and the next request would run the step again; resolve it --applied (without --result, the recorded "+
			"result is kept)", step.Name)
	case step.Done && f.applied && f.result == "":
		p.Result, p.SealKey, kept = step.Result, step.SealKey, " (its recorded result kept)"
	case step.Done && f.applied:
		kept = " (its recorded result replaced by --result)"
	case f.applied && f.result == "":
		return usageError{fmt.Errorf("--result is required: step %q has no recorded result", step.Name)}
	}
	if f.applied && f.result != "" {
		if step.SealKey != "" && g.keyring == nil {
			return fmt.Errorf("not resolved: the record's steps are sealed (key %q): give --seal-key, so that the server can open the result", step.SealKey)
		}
		enc, err := idem.EncodeStepResult(json.RawMessage(f.result))
		if err != nil {
			return err
		}
		p.Result, p.SealKey = g.keyring.SealStep(seal.Life{Scope: rec.Scope, Key: rec.Key, Created: rec.CreatedAt}, seal.PartStepResult, step.Name, enc)
	}
	if err := st.ResolveStep(ctx, p); errors.Is(err, idemdriver.ErrNotFound) {
		return errors.New("not resolved: the record changed since it was read (resolved meanwhile?); inspect it again")
	} else if err != nil {
		return err
	}
	what, next := "not applied", "runs the step"
	if f.applied {
		what, next = "applied"+kept, "gets the step's result without running it"
	}
	return printLine(out, g.json,
		fmt.Sprintf("resolved %s/%s step %s: %s; the record is FAILED, and its next request resumes it and %s", rec.Scope, rec.Key, step.Name, what, next),
		map[string]any{"resolved": map[string]any{"scope": rec.Scope, "key": rec.Key, "step": step.Name, "applied": f.applied,
			"by": f.by, "why": f.why, "fencing_token": rec.FencingToken}})
}

// partitionedRetention refuses a retention whose expires_at (now +
// retention) no partition of a partitioned store holds: the last
// partition's end is the bound, whatever DaysAhead the application runs
// with (this process cannot know it).
func partitionedRetention(ctx context.Context, s *store, retention time.Duration) error {
	parts, ok := s.Driver.(idemdriver.Partitioner)
	insp, ok2 := s.Driver.(idemdriver.Inspector)
	if !ok || !ok2 || !parts.Partitioned() {
		return nil
	}
	list, err := parts.Partitions(ctx)
	if err != nil {
		return err
	}
	now, err := insp.Now(ctx, 0)
	if err != nil {
		return err
	}
	if len(list) == 0 || !now.Add(retention).Before(list[len(list)-1].To) {
		end := "none"
		if len(list) > 0 {
			end = list[len(list)-1].To.Format(time.RFC3339) + ", " + list[len(list)-1].To.Sub(now).Truncate(time.Minute).String() + " from now"
		}
		return usageError{fmt.Errorf("--retention %s ends past this store's last partition (its end: %s); give a shorter one, "+
			"or create partitions further ahead (idem partitions ensure --days-ahead N)", retention, end)}
	}
	return nil
}

// unknownStep picks the step to resolve: name, or the one that made the
// record UNKNOWN.
func unknownStep(steps []idemdriver.Step, name string) (idemdriver.Step, error) {
	for _, s := range steps {
		if (name != "" && s.Name == name) || (name == "" && s.Reason != "") {
			return s, nil
		}
	}
	if name != "" {
		return idemdriver.Step{}, fmt.Errorf("not resolved: the record has no step %q", name)
	}
	return idemdriver.Step{}, errors.New("not resolved: no step of the record says why it is UNKNOWN; name it with --step")
}

// stuckView is what stuck prints: the PROCESSING records past their lease
// or damaged, and the UNKNOWN ones.
type stuckView struct {
	stuck   []idemdriver.StuckRecord
	unknown []unknownRecord
}

// unknownRecord is an UNKNOWN record with the step that made it so.
type unknownRecord struct {
	idemdriver.Record
	step idemdriver.Step
}

// unknownRecords reads at most limit UNKNOWN records (in (scope, key)
// order) and their steps; none on a store without steps.
func unknownRecords(ctx context.Context, s *store, limit int) ([]unknownRecord, error) {
	st, ok := s.Driver.(idemdriver.Stepper)
	if !ok {
		return nil, nil
	}
	recs, err := s.Driver.List(ctx, idemdriver.ListParams{State: idemdriver.StateUnknown, Limit: limit})
	if err != nil {
		return nil, err
	}
	var out []unknownRecord
	for _, r := range recs {
		steps, err := st.Steps(ctx, idemdriver.StepParams{Scope: r.Scope, Key: r.Key, CreatedAt: r.CreatedAt})
		if err != nil {
			return nil, err
		}
		u := unknownRecord{Record: r}
		if step, err := unknownStep(steps, ""); err == nil {
			u.step = step
		}
		out = append(out, u)
	}
	return out, nil
}

// stepsOf reads the steps of rec's life, each with its relayed key when
// keyring opens it; none on a store without steps.
func stepsOf(ctx context.Context, s *store, keyring *seal.Keyring, rec idemdriver.Record) ([]stepView, error) {
	st, ok := s.Driver.(idemdriver.Stepper)
	if !ok {
		return nil, nil
	}
	steps, err := st.Steps(ctx, idemdriver.StepParams{Scope: rec.Scope, Key: rec.Key, CreatedAt: rec.CreatedAt})
	if errors.Is(err, idemdriver.ErrStepsUnsupported) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	views := make([]stepView, 0, len(steps))
	for _, step := range steps {
		v := stepView{Step: step}
		life := seal.Life{Scope: rec.Scope, Key: rec.Key, Created: rec.CreatedAt}
		if plain, err := keyring.OpenStep(life, seal.PartStepRelay, step.Name, step.SealKey, step.Relay); err == nil {
			v.relay = string(plain)
		}
		if plain, err := keyring.OpenStep(life, seal.PartStepResult, step.Name, step.SealKey, step.Result); err == nil && step.Done &&
			json.Valid(plain) {
			v.result = string(plain)
		}
		views = append(views, v)
	}
	return views, nil
}
