package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemmysql"
	"github.com/idemgo/idem/idempgx"
	"github.com/idemgo/idem/idemsqlite"
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

// inspected is what checkRecords needs of a driver.
type inspected interface {
	idemdriver.Driver
	idemdriver.Inspector
}

// openInspected opens idem's store on the database paymentsd uses (the URL
// forms of paymentsd's --database-url).
func openInspected(ctx context.Context, databaseURL string) (inspected, func(), error) {
	switch {
	case strings.HasPrefix(databaseURL, "postgres://"), strings.HasPrefix(databaseURL, "postgresql://"):
		pool, err := pgxpool.New(ctx, databaseURL)
		if err != nil {
			return nil, nil, err
		}
		_, partitioned, err := idempgx.IsPartitioned(ctx, pool)
		if err != nil {
			pool.Close()
			return nil, nil, err
		}
		if partitioned {
			return idempgx.NewPartitioned(pool, idempgx.PartitionConfig{}), pool.Close, nil
		}
		return idempgx.New(pool), pool.Close, nil
	case strings.HasPrefix(databaseURL, "mysql://"), strings.HasPrefix(databaseURL, "mariadb://"):
		d, err := idemmysql.Open(ctx, databaseURL)
		if err != nil {
			return nil, nil, err
		}
		return d, func() { d.Close() }, nil
	}
	path := databaseURL
	for _, prefix := range []string{"sqlite:", "file:"} {
		if rest, ok := strings.CutPrefix(path, prefix); ok {
			path = strings.TrimPrefix(rest, "//")
			break
		}
	}
	if path == "" || strings.Contains(path, "://") {
		return nil, nil, fmt.Errorf("unsupported database URL %q", redactURL(databaseURL))
	}
	d, err := idemsqlite.Open(ctx, path)
	if err != nil {
		return nil, nil, err
	}
	return d, func() { d.Close() }, nil
}

// checkRecords reads idem's record of every logical payment's key, and the
// run's stuck records.
func checkRecords(ctx context.Context, databaseURL string, p *plan) (*RecordsCheck, error) {
	d, closeFn, err := openInspected(ctx, databaseURL)
	if err != nil {
		return nil, err
	}
	defer closeFn()
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
