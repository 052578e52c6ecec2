package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/schollz/progressbar/v3"

	"github.com/idemgo/idem/cmd/internal/command"
)

// Report is the whole outcome of a storm (--report writes it as JSON).
type Report struct {
	RunID          string          `json:"run_id"`
	Mode           string          `json:"mode"` // "idem" or "naive"
	StartedAt      time.Time       `json:"started_at"`
	Config         ConfigReport    `json:"config"`
	Load           *LoadSummary    `json:"load"`
	Servers        *ServersSummary `json:"servers,omitempty"`
	Reconciliation *Reconciliation `json:"reconciliation"`
	// Burst sorts the answers of a --burst run.
	Burst   *BurstSummary `json:"burst,omitempty"`
	Records *RecordsCheck `json:"records,omitempty"`
	Verdict Verdict       `json:"verdict"`
}

// ConfigReport is the storm's configuration.
type ConfigReport struct {
	Payments      int      `json:"payments"`
	Burst         bool     `json:"burst"`
	Duplicates    int      `json:"duplicates"`
	Merchants     int      `json:"merchants"`
	Concurrency   int      `json:"concurrency"`
	Servers       []string `json:"servers"`
	DatabaseURL   string   `json:"database_url,omitempty"`
	PSPURL        string   `json:"psp_url,omitempty"`
	Chaos         bool     `json:"chaos"`
	KillEvery     string   `json:"kill_every,omitempty"`
	TimeoutRate   float64  `json:"timeout_rate"`
	CancelRate    float64  `json:"cancel_rate"`
	ShortTimeout  string   `json:"short_timeout"`
	MaxRetryAfter string   `json:"max_retry_after"`
	Deadline      string   `json:"deadline"`
	PaymentsdArgs []string `json:"paymentsd_args,omitempty"`
	Seed          uint64   `json:"seed"`
	LogDir        string   `json:"log_dir,omitempty"`
}

// LoadSummary is what the clients measured.
type LoadSummary struct {
	DurationSeconds float64 `json:"duration_seconds"`
	// Requests counts HTTP attempts; Retries the attempts after the first
	// of a send (the retrying client's) plus the sends after the first of
	// a copy (Resends).
	Requests         int64            `json:"requests"`
	Retries          int64            `json:"retries"`
	TransportRetries int64            `json:"transport_retries"`
	Resends          int64            `json:"resends"`
	Statuses         map[string]int64 `json:"statuses"`
	Conflicts        int64            `json:"conflicts_409"`
	ServerErrors     int64            `json:"server_errors_5xx"`
	// Answers counts the 201s the copies got, Replays those marked
	// Idempotent-Replayed: true.
	Answers int64 `json:"answers_201"`
	Replays int64 `json:"replays"`
	// AttemptErrors counts attempts without an HTTP answer; ClientTimeouts
	// and Cancellations the sends the storm cut short on purpose; GaveUp
	// the sends the retrying client gave up on.
	AttemptErrors  int64   `json:"attempt_errors"`
	ClientTimeouts int64   `json:"client_timeouts"`
	Cancellations  int64   `json:"cancellations"`
	GaveUp         int64   `json:"gave_up"`
	RequestLatency Latency `json:"request_latency"`
	PaymentLatency Latency `json:"payment_latency"`
	// PaymentsPerSecond is logical payments answered per second.
	PaymentsPerSecond float64 `json:"payments_per_second"`
}

// Latency is a distribution's percentiles, in milliseconds.
type Latency struct {
	Count int     `json:"count"`
	P50   float64 `json:"p50_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Verdict is the storm's conclusion.
type Verdict struct {
	OK       bool     `json:"ok"`
	Failures []string `json:"failures,omitempty"`
}

func newReport(o options, runID string) *Report {
	mode := "idem"
	if o.naive {
		mode = "naive"
	}
	r := &Report{RunID: runID, Mode: mode, StartedAt: time.Now().UTC(), Config: ConfigReport{
		Payments: o.payments, Burst: o.burst, Duplicates: o.duplicates, Merchants: o.merchants, Concurrency: o.concurrency,
		PSPURL: o.pspURL, Chaos: o.chaos, TimeoutRate: o.timeoutRate, CancelRate: o.cancelRate,
		ShortTimeout: o.shortTimeout.String(), MaxRetryAfter: o.maxRetryAfter.String(), Deadline: o.deadline.String(),
		PaymentsdArgs: redactArgs(o.paymentsdArgs), DatabaseURL: redactURL(o.databaseURL),
	}}
	if o.chaos {
		r.Config.KillEvery = o.killEvery.String()
	}
	return r
}

// summary turns the counters into the report's load section.
func (r *loadResult) summary(elapsed time.Duration) *LoadSummary {
	s := &LoadSummary{
		DurationSeconds:  round(elapsed.Seconds(), 3),
		Requests:         r.requests.Load(),
		TransportRetries: r.transportRetries.Load(),
		Resends:          r.resends.Load(),
		AttemptErrors:    r.attemptErrors.Load(),
		ClientTimeouts:   r.clientTimeouts.Load(),
		Cancellations:    r.cancellations.Load(),
		GaveUp:           r.gaveUp.Load(),
		Statuses:         map[string]int64{},
	}
	s.Retries = s.TransportRetries + s.Resends
	r.mu.Lock()
	for code, n := range r.statuses {
		s.Statuses[strconv.Itoa(code)] = n
		if code >= 500 {
			s.ServerErrors += n
		}
	}
	s.Conflicts = r.statuses[409]
	s.RequestLatency = percentiles(r.attemptLatencies)
	r.mu.Unlock()
	var paymentLatencies []time.Duration
	answered := 0
	for _, o := range r.outcomes {
		s.Answers += int64(o.Answers)
		s.Replays += int64(o.Replayed)
		if o.Finished {
			answered++
			paymentLatencies = append(paymentLatencies, o.Latency)
		}
	}
	s.PaymentLatency = percentiles(paymentLatencies)
	if elapsed > 0 {
		s.PaymentsPerSecond = round(float64(answered)/elapsed.Seconds(), 1)
	}
	return s
}

// percentiles computes the nearest-rank p50, p99 and the maximum.
func percentiles(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	at := func(p float64) float64 {
		i := int(p/100*float64(len(s))+0.999999) - 1
		return ms(s[min(max(i, 0), len(s)-1)])
	}
	return Latency{Count: len(s), P50: at(50), P99: at(99), Max: ms(s[len(s)-1])}
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 1) }

func round(f float64, digits int) float64 {
	p, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'f', digits, 64), 64)
	return p
}

// finish decides the verdict.
func (r *Report) finish() {
	var f []string
	add := func(n int64, what string) {
		if n > 0 {
			f = append(f, fmt.Sprintf("%d %s", n, what))
		}
	}
	rec := r.Reconciliation
	chaoticBurst := r.Burst != nil && r.Config.Chaos
	if b := r.Burst; b != nil && !chaoticBurst { // under chaos, a killed server's payments get no answer, and no retry
		add(int64(b.Other), "payments neither completed (201) nor refused before their claim (503 overloaded)")
	}
	if rec != nil {
		add(int64(rec.DoublePayments), "double payments in the ledger")
		add(int64(rec.Lost), "lost payments (answered 201, not in the ledger)")
		if r.Burst == nil { // a burst's refused payments are neither answered 201 nor retried
			add(int64(rec.Unfinished), "logical payments never answered 201")
			add(int64(rec.Rejected), "logical payments answered a final error")
		}
		add(int64(rec.DivergentAnswers), "logical payments whose copies got different payments")
		add(int64(rec.UnrecordedAnswers), "payment ids answered but not in the ledger")
		add(int64(rec.Unknown), "payments in the ledger that no logical payment made")
		add(int64(rec.Mismatched), "payments with another amount or currency")
		add(int64(len(rec.LedgerMismatch)), "merchants whose balance disagrees with their payments")
		if p := rec.Provider; p != nil {
			add(p.DoubleCharges, "double charges at the provider")
			add(p.Unbooked, "charges at the provider without a payment in the ledger")
			if r.Burst == nil {
				add(p.MissingCharges, "missing charges at the provider")
			}
			add(int64(len(p.AmountMismatch)), "merchants charged other amounts")
		}
	}
	if rc := r.Records; rc != nil && rc.Skipped == "" {
		switch b := r.Burst; {
		case chaoticBurst:
			// A killed claim ends FAILED by the completer (no charge), or
			// is finished by it; none is left PROCESSING.
			add(int64(rc.ByState["PROCESSING"]), "keys whose idem record is left PROCESSING")
			add(int64(rc.ByState["UNKNOWN"]), "keys whose idem record is UNKNOWN")
		case b != nil:
			// Refused before its claim: no record. Completed: SUCCEEDED.
			add(int64(rc.Checked-rc.ByState["SUCCEEDED"]-rc.ByState["ABSENT"]), "keys whose idem record is neither SUCCEEDED nor absent")
			add(int64(abs(rc.ByState["ABSENT"]-b.Refused)), "keys whose record's absence disagrees with their refusal")
		default:
			add(int64(rc.Checked-rc.ByState["SUCCEEDED"]), "keys whose idem record is not SUCCEEDED")
		}
		add(int64(rc.Stuck), "records stuck in PROCESSING past their lease")
	}
	r.Verdict = Verdict{OK: len(f) == 0 && rec != nil, Failures: f}
}

func abs(n int) int { return max(n, -n) }

// printSummary prints the summary table; it returns the first error
// writing it.
func printSummary(out io.Writer, r *Report) error {
	w := command.NewWriter(out)
	c := r.Config
	servers := fmt.Sprintf("%d server", len(c.Servers))
	if len(c.Servers) != 1 {
		servers += "s"
	}
	if c.Chaos {
		servers += ", chaos (SIGKILL every ~" + c.KillEvery + ")"
	}
	shape := fmt.Sprintf("%d payments x %d duplicates", c.Payments, c.Duplicates)
	if c.Burst {
		shape = fmt.Sprintf("a burst of %d payments, each sent once, all at once", c.Payments)
	}
	w.Printf("\nidemstorm run %s: %s, %s, %d merchants, %s\n", r.RunID, r.Mode, shape, c.Merchants, servers)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows := command.NewWriter(tw)
	row := func(k, v string, args ...any) { rows.Printf("  %s\t"+v+"\n", append([]any{k}, args...)...) }
	l := r.Load
	row("duration", "%.1fs (%.1f payments/s)", l.DurationSeconds, l.PaymentsPerSecond)
	row("requests", "%d", l.Requests)
	row("retries", "%d (client %d, re-sends %d)", l.Retries, l.TransportRetries, l.Resends)
	row("409 in flight", "%d", l.Conflicts)
	row("201 answers / replays", "%d / %d", l.Answers, l.Replays)
	row("5xx", "%d", l.ServerErrors)
	row("no answer", "%d attempts (client timeouts %d, cancellations %d, gave up %d)", l.AttemptErrors, l.ClientTimeouts, l.Cancellations, l.GaveUp)
	row("latency p50 / p99", "request %s / %s, payment %s / %s",
		fmtMS(l.RequestLatency.P50), fmtMS(l.RequestLatency.P99), fmtMS(l.PaymentLatency.P50), fmtMS(l.PaymentLatency.P99))
	if b := r.Burst; b != nil {
		row("burst answers", "%d completed (201), %d refused before their claim (503 overloaded), %d other", b.Created, b.Refused, b.Other)
	}
	if s := r.Servers; s != nil {
		row("kills / crashes / restarts", "%d SIGKILL / %d self-inflicted (%d injected) / %d restarts", s.Kills, s.Crashes, s.InjectedCrashes, s.Restarts)
	}
	if rec := r.Reconciliation; rec != nil {
		exact := ""
		if !rec.Exact {
			exact = " (at least: some merchants have more than 100 payments)"
		}
		row("ledger", "%d payments for %d logical (%d found)", rec.LedgerPayments, rec.Expected, rec.Found)
		row("double payments (ledger)", "%d%s", rec.DoublePayments, exact)
		missing := "missing"
		if r.Burst != nil {
			missing = "not charged" // a refused payment is never charged, and never retried
		}
		if p := rec.Provider; p != nil {
			row("double charges (provider)", "%d (%d charges, %d %s, %d without a booked payment)", p.DoubleCharges, p.Charges, p.MissingCharges, missing, p.Unbooked)
		} else {
			row("double charges (provider)", "not checked: no --psp-url (each paymentsd's in-process fake forgets its charges when it dies)")
		}
		row("divergent answers", "%d", rec.DivergentAnswers)
		row("lost payments", "%d", rec.Lost)
		if b := r.Burst; b != nil {
			row("never answered 201", "%d (%d refused before their claim)", rec.Unfinished, b.Refused)
		} else {
			row("unfinished", "%d", rec.Unfinished)
		}
	}
	if rc := r.Records; rc != nil {
		if rc.Skipped != "" {
			row("idem records", "not checked: %s", rc.Skipped)
		} else {
			row("idem records", "%s", fmtStates(rc.ByState))
			row("stuck (PROCESSING past lease)", "%d", rc.Stuck)
		}
	}
	switch {
	case r.Verdict.OK && r.Burst != nil && c.Chaos:
		row("verdict", "OK: no client retried, and every charge the provider made is booked once (by its request or by paymentsd's completer); none left PROCESSING")
	case r.Verdict.OK && r.Burst != nil:
		row("verdict", "OK: every payment completed once or was refused before its claim; nothing charged without a booked payment")
	case r.Verdict.OK:
		row("verdict", "OK: every logical payment succeeded exactly once")
	default:
		row("verdict", "FAILED: %s", strings.Join(r.Verdict.Failures, "; "))
	}
	if err := errors.Join(rows.Err(), tw.Flush()); err != nil {
		return err
	}
	if rec := r.Reconciliation; rec != nil {
		for _, d := range rec.Doubled[:min(len(rec.Doubled), 5)] {
			w.Printf("  doubled: #%d %s/%s %d times\n", d.Index, d.Merchant, d.Key, d.Count)
		}
	}
	if b := r.Burst; b != nil {
		for _, e := range b.OtherExamples[:min(len(b.OtherExamples), 5)] {
			w.Printf("  other: %s\n", e)
		}
	}
	return w.Err()
}

func fmtMS(v float64) string {
	if v >= 1000 {
		return strconv.FormatFloat(v/1000, 'f', 2, 64) + "s"
	}
	return strconv.FormatFloat(v, 'f', 1, 64) + "ms"
}

func fmtStates(m map[string]int) string {
	var parts []string
	for _, k := range sortedKeys(m) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(parts, ", ")
}

// writeReport writes r as indented JSON to path.
func writeReport(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// progressBar shows the storm's progress.
type progressBar interface {
	Add(n int)
	Finish()
}

type noProgress struct{}

func (noProgress) Add(int) {}
func (noProgress) Finish() {}

// terminalBar is a progress bar on a terminal.
type terminalBar struct{ bar *progressbar.ProgressBar }

func newProgressBar(w io.Writer, n int) progressBar {
	return terminalBar{progressbar.NewOptions(n,
		progressbar.OptionSetWriter(w),
		progressbar.OptionSetDescription("payments"),
		progressbar.OptionShowCount(),
		progressbar.OptionSetPredictTime(true),
		progressbar.OptionThrottle(100*time.Millisecond),
		progressbar.OptionClearOnFinish(),
		progressbar.OptionFullWidth(),
	)}
}

func (t terminalBar) Add(n int) { _ = t.bar.Add(n) }
func (t terminalBar) Finish()   { _ = t.bar.Finish() }
