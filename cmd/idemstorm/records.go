package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/idemgo/idem/cmd/internal/dburl"
	"github.com/idemgo/idem/idemdriver"
)

// stuckLimit bounds the stuck records read (the idem stuck query).
const stuckLimit = 10000

// RecordsCheck is what idem's own records say about the run's keys, read
// from the database: the state of each logical payment's key, and the
// run's records that are PROCESSING past their lease (`idem stuck`).
type RecordsCheck struct {
	// Skipped says why the check did not run.
	Skipped string `json:"skipped,omitempty"`
	// Checked is the number of keys read; ByState counts them per state
	// ("ABSENT" for no record).
	Checked int            `json:"checked"`
	ByState map[string]int `json:"by_state,omitempty"`
	// NotSucceeded lists examples of keys not SUCCEEDED.
	NotSucceeded []string `json:"not_succeeded,omitempty"`
	// Stuck counts the run's records PROCESSING past their lease.
	Stuck        int      `json:"stuck"`
	StuckRecords []string `json:"stuck_records,omitempty"`
	// TableStuck is the whole table's stuck count (other runs included).
	TableStuck int64 `json:"table_stuck"`
}

// checkRecords reads idem's record of every logical payment's key, and the
// run's stuck records.
func checkRecords(ctx context.Context, databaseURL string, p *plan) (_ *RecordsCheck, err error) {
	// The URL rules and the opener are paymentsd's own (cmd/internal/dburl),
	// so the check reads the database the servers wrote.
	kind, target, err := dburl.Parse(databaseURL)
	if err != nil {
		return nil, err
	}
	store, err := dburl.Open(ctx, kind, target, dburl.Options{MustExist: true})
	if err != nil {
		return nil, err
	}
	defer func() {
		if cerr := store.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("closing the database: %w", cerr)
		}
	}()
	d := store.Driver
	rc := &RecordsCheck{ByState: map[string]int{}}
	for _, lp := range p.payments {
		r, err := d.Get(ctx, idemdriver.GetParams{Scope: lp.Merchant, Key: lp.Key})
		state := string(r.State)
		if errors.Is(err, idemdriver.ErrNotFound) {
			state, err = "ABSENT", nil
		}
		if err != nil {
			return nil, fmt.Errorf("record %s/%s: %w", lp.Merchant, lp.Key, err)
		}
		rc.Checked++
		rc.ByState[state]++
		if state != string(idemdriver.StateSucceeded) && len(rc.NotSucceeded) < maxExamples {
			rc.NotSucceeded = append(rc.NotSucceeded, fmt.Sprintf("%s/%s: %s (attempts %d, fencing token %d)", lp.Merchant, lp.Key, state, r.Attempts, r.FencingToken))
		}
	}
	stuck, err := d.Stuck(ctx, idemdriver.StuckParams{Limit: stuckLimit})
	if err != nil {
		return nil, fmt.Errorf("stuck records: %w", err)
	}
	prefix := "storm-" + p.runID + "-"
	for _, s := range stuck {
		if !strings.HasPrefix(s.Scope, prefix) {
			continue
		}
		rc.Stuck++
		if len(rc.StuckRecords) < maxExamples {
			rc.StuckRecords = append(rc.StuckRecords, fmt.Sprintf("%s/%s: overdue %s, fencing token %d", s.Scope, s.Key, s.Overdue, s.FencingToken))
		}
	}
	st, err := d.Stats(ctx, idemdriver.StatsParams{})
	if err != nil {
		return nil, fmt.Errorf("stats: %w", err)
	}
	rc.TableStuck = st.Stuck
	return rc, nil
}
