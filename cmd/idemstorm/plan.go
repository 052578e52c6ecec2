package main

import (
	"encoding/json"
	"fmt"
)

// currencies are the currencies the logical payments use, in turn.
var currencies = []string{"JPY", "EUR", "USD"}

// logical is one logical payment: what a customer means to pay once. Its
// copies and retries all send the same body with the same key.
type logical struct {
	Index       int    `json:"index"`
	Merchant    string `json:"merchant"`
	Key         string `json:"key"`
	Amount      int64  `json:"amount"`
	Currency    string `json:"currency"`
	Customer    string `json:"customer"`
	Description string `json:"description"`
	body        []byte
}

// plan is the storm's logical payments.
type plan struct {
	runID      string
	duplicates int
	merchants  []string
	payments   []logical
	// byDescription finds a logical payment by its description.
	byDescription map[string]int
}

// merchantName is the name of merchant m of run runID: unique to the run,
// so that runs sharing a database (or a Redis) never meet.
func merchantName(runID string, m int) string { return fmt.Sprintf("storm-%s-m%03d", runID, m) }

// description identifies logical payment i of run runID in the ledger.
func description(runID string, i int) string { return fmt.Sprintf("idemstorm %s #%d", runID, i) }

// newPlan lays out n logical payments over m merchants: payment i belongs to
// merchant i mod m, with key order-<i div m>, so that every key is used by
// (up to) m merchants: keys collide across scopes, never within one.
func newPlan(runID string, n, duplicates, m int) *plan {
	p := &plan{runID: runID, duplicates: duplicates, byDescription: make(map[string]int, n)}
	for j := range m {
		p.merchants = append(p.merchants, merchantName(runID, j))
	}
	for i := range n {
		lp := logical{
			Index:       i,
			Merchant:    p.merchants[i%m],
			Key:         fmt.Sprintf("order-%04d", i/m),
			Amount:      int64(100 + i),
			Currency:    currencies[(i/m)%len(currencies)],
			Customer:    fmt.Sprintf("cus_%d", i),
			Description: description(runID, i),
		}
		lp.body, _ = json.Marshal(map[string]any{
			"amount": lp.Amount, "currency": lp.Currency, "customer": lp.Customer, "description": lp.Description,
		})
		p.payments = append(p.payments, lp)
		p.byDescription[lp.Description] = i
	}
	return p
}

// ofMerchant returns the indexes of merchant's logical payments.
func (p *plan) ofMerchant(merchant string) []int {
	var out []int
	for _, lp := range p.payments {
		if lp.Merchant == merchant {
			out = append(out, lp.Index)
		}
	}
	return out
}
