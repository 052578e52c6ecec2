package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync/atomic"
	"time"
)

// listLimit is paymentsd's largest GET /v1/payments?limit=N.
const listLimit = 100

// maxExamples bounds the examples each list of the report keeps.
const maxExamples = 20

// errNotFound is a 404 answer.
var errNotFound = errors.New("not found")

// apiClient reads paymentsd's API (and the provider's stats), retrying
// network errors and 5xx answers on the next server.
type apiClient struct {
	hosts []string
	http  *http.Client
	next  atomic.Int64
}

func newAPIClient(hosts []string) *apiClient {
	return &apiClient{hosts: hosts, http: &http.Client{Timeout: 30 * time.Second}}
}

// get GETs path from one of the servers as merchant and decodes the 200
// answer into v; a 404 is errNotFound.
func (c *apiClient) get(ctx context.Context, merchant, path string, v any) error {
	start := int(c.next.Add(1))
	return c.getURL(ctx, func(try int) string { return c.hosts[(start+try)%len(c.hosts)] + path }, merchant, v)
}

// getURL GETs the URL that at(try) gives (at most 10 tries, 200 ms apart).
func (c *apiClient) getURL(ctx context.Context, at func(try int) string, merchant string, v any) error {
	var last error
	for try := range 10 {
		if try > 0 && !sleepCtx(ctx, 200*time.Millisecond) {
			break
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, at(try), nil)
		if err != nil {
			return err
		}
		if merchant != "" {
			req.Header.Set("Authorization", "Bearer sk_test_"+merchant)
		}
		resp, err := c.http.Do(req)
		if err != nil {
			last = err
			continue
		}
		body, err := readBody(resp, 16<<20)
		switch {
		case err != nil:
			last = err
			continue
		case resp.StatusCode == http.StatusNotFound:
			return errNotFound
		case resp.StatusCode >= 500:
			last = fmt.Errorf("GET %s: %d %s", req.URL.Path, resp.StatusCode, truncate(string(body), 300))
			continue
		case resp.StatusCode != http.StatusOK:
			return fmt.Errorf("GET %s: %d %s", req.URL.Path, resp.StatusCode, truncate(string(body), 300))
		}
		if err := json.Unmarshal(body, v); err != nil {
			return fmt.Errorf("GET %s: %w", req.URL.Path, err)
		}
		return nil
	}
	if last == nil {
		last = ctx.Err()
	}
	return last
}

// The API's shapes.
type (
	apiPayment struct {
		ID          string  `json:"id"`
		Amount      int64   `json:"amount"`
		Currency    string  `json:"currency"`
		Customer    string  `json:"customer"`
		Description *string `json:"description"`
	}
	apiList struct {
		Data    []apiPayment `json:"data"`
		HasMore bool         `json:"has_more"`
	}
	apiBalance struct {
		Merchant string           `json:"merchant"`
		Payments int64            `json:"payments"`
		Totals   map[string]int64 `json:"totals"`
	}
	pspStats struct {
		Merchants map[string]struct {
			Charges int64            `json:"charges"`
			Amount  map[string]int64 `json:"amount"`
		} `json:"merchants"`
		Charges    int64 `json:"charges"`
		InProgress int64 `json:"in_progress"`
	}
)

// Reconciliation is what the API says about the storm's logical payments.
type Reconciliation struct {
	// Exact is true when every merchant could be listed whole (at most 100
	// payments); otherwise doubles are a lower bound (see doc.go).
	Exact bool `json:"exact"`
	// Expected is the number of logical payments; Found those present in
	// the ledger at least once; LedgerPayments the ledger's payment count
	// over the run's merchants (GET /v1/balance).
	Expected       int   `json:"expected"`
	Found          int   `json:"found"`
	LedgerPayments int64 `json:"ledger_payments"`
	// DoublePayments counts the ledger's extra payments: a logical payment
	// present n times counts n-1.
	DoublePayments int           `json:"double_payments"`
	Doubled        []DoubleEntry `json:"doubled,omitempty"`
	// Lost counts the logical payments a client was answered 201 for and
	// that the ledger does not hold.
	Lost        int   `json:"lost"`
	LostIndexes []int `json:"lost_indexes,omitempty"`
	// Unfinished counts the logical payments none of whose copies got a
	// 201 before the deadline; Rejected those answered a final error.
	Unfinished        int      `json:"unfinished"`
	UnfinishedIndexes []int    `json:"unfinished_indexes,omitempty"`
	Rejected          int      `json:"rejected"`
	RejectedExamples  []string `json:"rejected_examples,omitempty"`
	// DivergentAnswers counts the logical payments whose copies were
	// answered different payments (each ran the payment).
	DivergentAnswers int `json:"divergent_answers"`
	// UnrecordedAnswers counts the payment ids answered to a client that
	// the ledger does not hold.
	UnrecordedAnswers int `json:"unrecorded_answers"`
	// Unknown counts listed payments that belong to no logical payment of
	// the run; Mismatched those whose amount or currency differs from it.
	Unknown    int `json:"unknown"`
	Mismatched int `json:"mismatched"`
	// LedgerMismatch lists the merchants whose balance disagrees with their
	// listed payments (count or totals).
	LedgerMismatch []string                 `json:"ledger_mismatch,omitempty"`
	Merchants      []MerchantReconciliation `json:"merchants"`
	Provider       *ProviderReconciliation  `json:"provider,omitempty"`
}

// DoubleEntry is a logical payment found more than once.
type DoubleEntry struct {
	Index    int    `json:"index"`
	Merchant string `json:"merchant"`
	Key      string `json:"key"`
	Count    int    `json:"count"`
}

// MerchantReconciliation is one merchant's books.
type MerchantReconciliation struct {
	Merchant       string           `json:"merchant"`
	Expected       int              `json:"expected"`
	Listed         int              `json:"listed"`
	HasMore        bool             `json:"has_more"`
	LedgerPayments int64            `json:"ledger_payments"`
	LedgerTotals   map[string]int64 `json:"ledger_totals"`
	ExpectedTotals map[string]int64 `json:"expected_totals"`
	Doubles        int              `json:"doubles"`
	Lost           int              `json:"lost"`
	// ProviderCharges is the provider's charge count (with --psp-url).
	ProviderCharges *int64 `json:"provider_charges,omitempty"`
}

// ProviderReconciliation compares the provider's charges with the logical
// payments, per merchant.
type ProviderReconciliation struct {
	Charges  int64 `json:"charges"`
	Expected int   `json:"expected"`
	// DoubleCharges sums, per merchant, the charges beyond one per logical
	// payment; MissingCharges those short of it.
	DoubleCharges  int64 `json:"double_charges"`
	MissingCharges int64 `json:"missing_charges"`
	// Unbooked sums, per merchant, the charges beyond the ledger's
	// payments: charged, and no payment booked for it.
	Unbooked       int64    `json:"unbooked_charges"`
	AmountMismatch []string `json:"amount_mismatch,omitempty"`
}

// reconcile reads the books through the API and compares them with the
// plan and with what the clients were answered.
func reconcile(ctx context.Context, api *apiClient, pspURL string, p *plan, outcomes []outcome) (*Reconciliation, error) {
	rec := &Reconciliation{Exact: true, Expected: len(p.payments)}
	for i, o := range outcomes {
		lp := p.payments[i]
		switch {
		case !o.Finished:
			rec.Unfinished++
			addExample(&rec.UnfinishedIndexes, i)
		case len(o.PaymentIDs) > 1:
			rec.DivergentAnswers++
		}
		if len(o.Rejected) > 0 {
			rec.Rejected++
			if len(rec.RejectedExamples) < maxExamples {
				rec.RejectedExamples = append(rec.RejectedExamples, fmt.Sprintf("#%d %s/%s: %s", i, lp.Merchant, lp.Key, strings.Join(o.Rejected, "; ")))
			}
		}
	}
	var stats *pspStats
	if pspURL != "" {
		var err error
		if stats, err = settledStats(ctx, api, pspURL); err != nil {
			return nil, fmt.Errorf("provider stats: %w", err)
		}
		rec.Provider = &ProviderReconciliation{Expected: len(p.payments)}
	}
	for _, m := range p.merchants {
		mr, err := reconcileMerchant(ctx, api, p, outcomes, m, rec)
		if err != nil {
			return nil, fmt.Errorf("merchant %s: %w", m, err)
		}
		if stats != nil {
			reconcileProvider(stats, p, m, mr, rec.Provider)
		}
		rec.Merchants = append(rec.Merchants, *mr)
	}
	return rec, nil
}

// reconcileMerchant checks one merchant's ledger and adds its findings to rec.
func reconcileMerchant(ctx context.Context, api *apiClient, p *plan, outcomes []outcome, m string, rec *Reconciliation) (*MerchantReconciliation, error) {
	idx := p.ofMerchant(m)
	mr := &MerchantReconciliation{Merchant: m, Expected: len(idx), ExpectedTotals: map[string]int64{}}
	for _, i := range idx {
		mr.ExpectedTotals[p.payments[i].Currency] += p.payments[i].Amount
	}
	var b apiBalance
	if err := api.get(ctx, m, "/v1/balance", &b); err != nil {
		return nil, err
	}
	var l apiList
	if err := api.get(ctx, m, fmt.Sprintf("/v1/payments?limit=%d", listLimit), &l); err != nil {
		return nil, err
	}
	mr.LedgerPayments, mr.LedgerTotals, mr.Listed, mr.HasMore = b.Payments, b.Totals, len(l.Data), l.HasMore
	if mr.LedgerTotals == nil {
		mr.LedgerTotals = map[string]int64{}
	}
	rec.LedgerPayments += b.Payments

	counts := map[int]int{}
	listed := map[string]bool{} // payment ids
	listedTotals := map[string]int64{}
	unknown := 0
	for _, row := range l.Data {
		listed[row.ID] = true
		listedTotals[row.Currency] += row.Amount
		i, ok := -1, false
		if row.Description != nil {
			i, ok = p.byDescription[*row.Description]
		}
		if !ok || p.payments[i].Merchant != m {
			unknown++
			continue
		}
		counts[i]++
		if row.Amount != p.payments[i].Amount || row.Currency != p.payments[i].Currency {
			rec.Mismatched++
		}
	}
	rec.Unknown += unknown

	if l.HasMore {
		// Not every payment is listed: find the answered ones by id.
		rec.Exact = false
		for _, i := range idx {
			if counts[i] > 0 {
				continue
			}
			for _, id := range outcomes[i].PaymentIDs {
				var row apiPayment
				err := api.get(ctx, m, "/v1/payments/"+url.PathEscape(id), &row)
				if errors.Is(err, errNotFound) {
					continue
				}
				if err != nil {
					return nil, err
				}
				listed[id] = true
				if row.Description != nil && *row.Description == p.payments[i].Description {
					counts[i]++
				}
			}
		}
	}

	attributed, zeros := 0, 0
	for _, i := range idx {
		c := counts[i]
		attributed += c
		switch {
		case c > 1:
			mr.Doubles += c - 1
			if len(rec.Doubled) < maxExamples {
				rec.Doubled = append(rec.Doubled, DoubleEntry{Index: i, Merchant: m, Key: p.payments[i].Key, Count: c})
			}
		case c == 0:
			zeros++
			if outcomes[i].Finished {
				mr.Lost++
				addExample(&rec.LostIndexes, i)
			}
		}
		if c > 0 {
			rec.Found++
		}
		for _, id := range outcomes[i].PaymentIDs {
			if !listed[id] {
				rec.UnrecordedAnswers++
			}
		}
	}
	if l.HasMore {
		// Rows neither listed nor answered: doubles, unless they are the
		// unanswered payments' (a lower bound).
		unattributed := int(b.Payments) - attributed - unknown
		mr.Doubles += max(0, unattributed-zeros)
	} else if int64(len(l.Data)) != b.Payments || !maps.Equal(listedTotals, mr.LedgerTotals) {
		rec.LedgerMismatch = append(rec.LedgerMismatch,
			fmt.Sprintf("%s: %d payments listed (totals %v), the ledger has %d (totals %v)", m, len(l.Data), listedTotals, b.Payments, mr.LedgerTotals))
	}
	rec.DoublePayments += mr.Doubles
	rec.Lost += mr.Lost
	return mr, nil
}

// reconcileProvider compares the provider's charges for merchant m with its
// logical payments.
func reconcileProvider(st *pspStats, p *plan, m string, mr *MerchantReconciliation, pr *ProviderReconciliation) {
	ms := st.Merchants[m]
	charges := ms.Charges
	mr.ProviderCharges = &charges
	pr.Charges += charges
	expected := int64(mr.Expected)
	pr.DoubleCharges += max(0, charges-expected)
	pr.MissingCharges += max(0, expected-charges)
	pr.Unbooked += max(0, charges-mr.LedgerPayments)
	amount := ms.Amount
	if amount == nil {
		amount = map[string]int64{}
	}
	if charges == expected && !maps.Equal(amount, mr.ExpectedTotals) {
		pr.AmountMismatch = append(pr.AmountMismatch, fmt.Sprintf("%s: charged %v, expected %v", m, amount, mr.ExpectedTotals))
	}
}

// addExample appends i to list while it holds fewer than maxExamples.
func addExample(list *[]int, i int) {
	if len(*list) < maxExamples {
		*list = append(*list, i)
	}
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	return slices.Sorted(maps.Keys(m))
}

// readBody reads at most limit bytes of resp's body and closes it: the
// read's error, else the close's.
func readBody(resp *http.Response, limit int64) ([]byte, error) {
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit))
	if cerr := resp.Body.Close(); err == nil {
		err = cerr
	}
	return b, err
}

// settledStats reads the provider's stats once no charge is in progress
// there: a charge whose caller gave up (paymentsd's provider timeout) is
// still made, and counted, after the run's last answer. It reads every
// 100 ms until ctx ends (a provider that never settles fails the read).
func settledStats(ctx context.Context, api *apiClient, pspURL string) (*pspStats, error) {
	for {
		stats := &pspStats{}
		if err := api.getURL(ctx, func(int) string { return pspURL + "/v1/charges/stats" }, "", stats); err != nil {
			return nil, err
		}
		if stats.InProgress == 0 {
			return stats, nil
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%d charges still in progress at the provider: %w", stats.InProgress, context.Cause(ctx))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// completerGrace is paymentsd's --completer-grace with --burst --chaos, and
// completerSettle how long the storm waits for the completer to book
// every charge the kills left unbooked.
const (
	completerGrace  = time.Second
	completerSettle = 2 * time.Minute
)

// settleBooks waits, at most within, until every charge the provider made
// for the plan's merchants is booked in the ledger (no unbooked charge)
// and, with databaseURL, no key of the plan is left PROCESSING, reading
// them every second; it returns nil then or when within has passed (the
// reconciliation that follows reports what is left).
func settleBooks(ctx context.Context, api *apiClient, pspURL, databaseURL string, p *plan, outcomes []outcome, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for {
		rec, err := reconcile(ctx, api, pspURL, p, outcomes)
		processing := 0
		if err == nil && databaseURL != "" {
			var rc *RecordsCheck
			if rc, err = checkRecords(ctx, databaseURL, p); err == nil {
				processing = rc.ByState["PROCESSING"]
			}
		}
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			return fmt.Errorf("waiting for the completer: %w", err)
		case rec.Provider != nil && rec.Provider.Unbooked == 0 && processing == 0:
			return nil
		}
		if !sleepCtx(ctx, time.Second) {
			return nil
		}
	}
}
