package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idemgo/idem/idemclient"
)

// overloadedType ends the problem type of a request idem refused before its
// claim (EngineOptions.Admission.MaxInFlight): docs/problems.md#overloaded.
const overloadedType = "#overloaded"

// runBurst is --burst's load: every logical payment of cfg.plan sent once,
// all at the same moment (each on its own connection, released together),
// with no retry, no duplicate, no short deadline and no cancellation. A
// payment answered 201 is Finished; any other answer is Rejected with its
// status and problem type ("503 ...#overloaded" for one refused before its
// claim); one without an answer (a connection error, the deadline) is
// neither. It returns when every send has ended.
func runBurst(ctx context.Context, cfg loadConfig) *loadResult {
	res := &loadResult{outcomes: make([]outcome, len(cfg.plan.payments)), statuses: map[int]int64{}}
	tr := newBaseTransport(len(cfg.plan.payments) + 16)
	tr.MaxConnsPerHost = 0 // one connection each: they all go at once
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	ctx, cancel := context.WithTimeout(ctx, cfg.deadline)
	defer cancel()

	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range cfg.plan.payments {
		lp := &cfg.plan.payments[i]
		host := cfg.hosts[i%len(cfg.hosts)]
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, host+"/v1/payments", bytes.NewReader(lp.body))
		if err != nil {
			res.outcomes[i].Rejected = []string{err.Error()}
			continue
		}
		req.Header.Set("Authorization", "Bearer sk_test_"+lp.Merchant)
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set(idemclient.HeaderKey, lp.Key)
		wg.Go(func() {
			<-start
			res.outcomes[i] = burstSend(client, req, res)
			cfg.progress.Add(1)
		})
	}
	close(start)
	wg.Wait()
	return res
}

// burstSend sends req once and counts its answer in res.
func burstSend(client *http.Client, req *http.Request, res *loadResult) outcome {
	sent := time.Now()
	res.requests.Add(1)
	resp, err := client.Do(req)
	var body []byte
	if err == nil {
		body, err = readBody(resp, 1<<20)
	}
	if err != nil {
		res.attemptErrors.Add(1)
		return outcome{}
	}
	took := time.Since(sent)
	res.mu.Lock()
	res.statuses[resp.StatusCode]++
	res.attemptLatencies = append(res.attemptLatencies, took)
	res.mu.Unlock()
	var p struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	}
	_ = json.Unmarshal(body, &p)
	if resp.StatusCode == http.StatusCreated && p.ID != "" {
		return outcome{Finished: true, PaymentIDs: []string{p.ID}, Answers: 1, Latency: took}
	}
	return outcome{Rejected: []string{strconv.Itoa(resp.StatusCode) + " " + p.Type}}
}

// refusedBeforeClaim reports whether o is a burst's payment refused before
// its claim (503 overloaded), and only that.
func refusedBeforeClaim(o outcome) bool {
	return !o.Finished && len(o.Rejected) == 1 &&
		strings.HasPrefix(o.Rejected[0], "503 ") && strings.HasSuffix(o.Rejected[0], overloadedType)
}

// BurstSummary is what a --burst run's answers say: each payment either
// completed (201) or was refused before its claim (503 overloaded, nothing
// claimed or charged); any other answer, or none, is a failure.
type BurstSummary struct {
	Created int `json:"created_201"`
	Refused int `json:"refused_before_claim_503"`
	// Other counts the payments answered anything else (a lease lost to
	// the pool: 503 store-unavailable; a provider timeout: 504; ...) or
	// not at all; OtherExamples lists some.
	Other         int      `json:"other"`
	OtherExamples []string `json:"other_examples,omitempty"`
}

// burstSummary sorts the outcomes of a burst.
func burstSummary(p *plan, outcomes []outcome) *BurstSummary {
	s := &BurstSummary{}
	for i, o := range outcomes {
		switch {
		case o.Finished:
			s.Created++
		case refusedBeforeClaim(o):
			s.Refused++
		default:
			s.Other++
			if len(s.OtherExamples) < maxExamples {
				what := "no answer"
				if len(o.Rejected) > 0 {
					what = strings.Join(o.Rejected, "; ")
				}
				s.OtherExamples = append(s.OtherExamples, "#"+strconv.Itoa(i)+" "+p.payments[i].Merchant+"/"+p.payments[i].Key+": "+what)
			}
		}
	}
	return s
}
