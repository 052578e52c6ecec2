package idemotel_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/fingerprint"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemotel"
	"github.com/idemgo/idem/idemsqlite"
)

// harness is a real idem middleware on SQLite observed by an
// idemotel.Observer on the real SDK (a ManualReader, a SpanRecorder), with
// the events idem sent kept beside it.
type harness struct {
	d      *idemsqlite.Driver
	mux    *http.ServeMux
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider

	mu     sync.Mutex
	events []idem.Event
}

func newHarness(t *testing.T, handler http.HandlerFunc, configure ...func(*idem.Options)) *harness {
	t.Helper()
	d, err := idemsqlite.Open(t.Context(), filepath.Join(t.TempDir(), "idem.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = d.Close() })
	require.NoError(t, d.Migrate(t.Context()))
	h := &harness{d: d, reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	h.tp = sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(h.spans))
	obs, err := idemotel.NewObserver(
		idemotel.WithMeterProvider(sdkmetric.NewMeterProvider(sdkmetric.WithReader(h.reader))),
		idemotel.WithTracerProvider(h.tp))
	require.NoError(t, err)
	cfg := idem.Options{
		Engine: idem.EngineOptions{Logger: slog.New(slog.DiscardHandler), Response: idem.ResponseOptions{Outcome: idem.ReleaseValidationFailures}, Observer: idem.ObserverFunc(func(ctx context.Context, e idem.Event) {
			h.mu.Lock()
			h.events = append(h.events, e)
			h.mu.Unlock()
			obs.Observe(ctx, e)
		})},
		Scope: idem.SingleTenant,
	}
	for _, f := range configure {
		f(&cfg)
	}
	mw, err := idem.NewMiddleware(d, cfg)
	require.NoError(t, err)
	h.mux = http.NewServeMux()
	h.mux.Handle("POST /pay/{id}", mw.Handler(handler))
	return h
}

// send posts body to /pay/1 with key inside a request span of its own, and
// returns the answer and that span's context.
func (h *harness) send(key, body string) (*httptest.ResponseRecorder, trace.SpanContext) {
	ctx, span := h.tp.Tracer("test").Start(context.Background(), "POST /pay/{id}", trace.WithSpanKind(trace.SpanKindServer))
	defer span.End()
	return h.serve(ctx, key, body), span.SpanContext()
}

// serve posts body to /pay/1 with key under ctx and returns the answer.
func (h *harness) serve(ctx context.Context, key, body string) *httptest.ResponseRecorder {
	req := httptest.NewRequestWithContext(ctx, "POST", "/pay/1", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, key)
	rec := httptest.NewRecorder()
	h.mux.ServeHTTP(rec, req)
	return rec
}

func (h *harness) lastEvent(t *testing.T) idem.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	require.NotEmpty(t, h.events)
	return h.events[len(h.events)-1]
}

func (h *harness) collect(t *testing.T) map[string]metricdata.Metrics {
	var rm metricdata.ResourceMetrics
	require.NoError(t, h.reader.Collect(t.Context(), &rm))
	out := map[string]metricdata.Metrics{}
	for _, sm := range rm.ScopeMetrics {
		require.Equal(t, idemotel.ScopeName, sm.Scope.Name)
		for _, m := range sm.Metrics {
			out[m.Name] = m
		}
	}
	return out
}

// decisionCount is idem.decisions' value for the points with decision (0
// before the first decision: no point yet).
func decisionCount(t *testing.T, ms map[string]metricdata.Metrics, decision string) (n int64, pts []metricdata.DataPoint[int64]) {
	m, ok := ms["idem.decisions"]
	if !ok {
		return 0, nil
	}
	require.Equal(t, "{decision}", m.Unit)
	sum, ok := m.Data.(metricdata.Sum[int64])
	require.True(t, ok)
	require.True(t, sum.IsMonotonic)
	for _, p := range sum.DataPoints {
		if v, _ := p.Attributes.Value(idemotel.DecisionKey); v.AsString() == decision {
			n += p.Value
			pts = append(pts, p)
		}
	}
	return n, pts
}

// histogram is the histogram name (no points before its first record).
func histogram(t *testing.T, ms map[string]metricdata.Metrics, name string) metricdata.Histogram[float64] {
	m, ok := ms[name]
	if !ok {
		return metricdata.Histogram[float64]{}
	}
	require.Equal(t, "s", m.Unit)
	hist, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok)
	return hist
}

func attr(set attribute.Set, k attribute.Key) string {
	v, _ := set.Value(k)
	return v.String()
}

// Every decision idem makes, driven through a real middleware on SQLite,
// becomes one idem.decisions point with its attributes, the histograms of
// the phases that ran (their sums the event's durations), and spans for
// those phases, children of the request's span, lasting exactly the
// phase.
func TestObserverEveryDecision(t *testing.T) {
	t.Parallel()
	// claimDead leaves a PROCESSING record of POST /pay/1 {} whose lease
	// ran out an hour ago by the database clock: its worker died.
	claimAt := func(d *idemsqlite.Driver, r *http.Request, clock time.Duration) (idemdriver.ClaimResult, error) {
		return d.Claim(context.Background(), idemdriver.ClaimParams{Scope: idem.SingleTenantScope, Key: "k", Method: "POST", Path: "/pay/1",
			Fingerprint: fingerprint.Request(r, []byte("{}")), LeaseDuration: time.Second, Retention: 24 * time.Hour, ClockOffset: clock})
	}
	fakeReq := func() *http.Request {
		r := httptest.NewRequest("POST", "/pay/1", strings.NewReader("{}"))
		r.Header.Set("Content-Type", "application/json")
		return r
	}
	cases := []struct {
		decision string
		status   int // the answer sent
		outcome  string
		body     string
		// handler, when set, is the protected handler (default: 201).
		handler func(h **harness) http.HandlerFunc
		prepare func(t *testing.T, h *harness)
		phases  []string
		failed  string // the span with an error status
	}{
		{decision: "executed", status: 201, outcome: "succeeded", phases: []string{idemotel.SpanClaim, idemotel.SpanExecute, idemotel.SpanComplete}},
		{decision: "replayed", status: 201, phases: []string{idemotel.SpanClaim},
			prepare: func(t *testing.T, h *harness) { h.send("k", "{}") }},
		{decision: "key_reused", status: 422, body: `{"a":1}`, phases: []string{idemotel.SpanClaim},
			prepare: func(t *testing.T, h *harness) { h.send("k", "{}") }},
		{decision: "released", status: 400, outcome: "released", phases: []string{idemotel.SpanClaim, idemotel.SpanExecute, idemotel.SpanComplete},
			handler: func(**harness) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusBadRequest) }
			}},
		{decision: "taken_over", status: 201, outcome: "succeeded", phases: []string{idemotel.SpanClaim, idemotel.SpanExecute, idemotel.SpanComplete},
			prepare: func(t *testing.T, h *harness) {
				res, err := claimAt(h.d, fakeReq(), -time.Hour)
				require.NoError(t, err)
				require.True(t, res.Claimed)
			}},
		{decision: "lease_lost", status: 409, phases: []string{idemotel.SpanClaim, idemotel.SpanExecute, idemotel.SpanComplete}, failed: idemotel.SpanComplete,
			handler: func(h **harness) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					// Another worker, an hour later by the database clock,
					// takes the key over while this one runs.
					if res, err := claimAt((*h).d, r, time.Hour); err != nil || !res.TookOver {
						panic("the takeover did not happen")
					}
					w.WriteHeader(http.StatusCreated)
				}
			}},
		{decision: "store_unavailable", status: 503, phases: []string{idemotel.SpanClaim}, failed: idemotel.SpanClaim,
			prepare: func(t *testing.T, h *harness) { require.NoError(t, h.d.Close()) }},
		{decision: "completion_failed", status: 503, phases: []string{idemotel.SpanClaim, idemotel.SpanExecute, idemotel.SpanComplete}, failed: idemotel.SpanComplete,
			handler: func(h **harness) http.HandlerFunc {
				return func(w http.ResponseWriter, r *http.Request) {
					_ = (*h).d.Close()
					w.WriteHeader(http.StatusCreated)
				}
			}},
	}
	for _, tc := range cases {
		t.Run(tc.decision, func(t *testing.T) {
			t.Parallel()
			var h *harness
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
			if tc.handler != nil {
				handler = tc.handler(&h)
			}
			h = newHarness(t, handler)
			if tc.prepare != nil {
				tc.prepare(t, h)
			}
			before := h.collect(t)
			beforeN, _ := decisionCount(t, before, tc.decision)
			h.spans.Reset()
			body := tc.body
			if body == "" {
				body = "{}"
			}
			got, parent := h.send("k", body)
			require.Equal(t, tc.status, got.Code, got.Body.String())
			ev := h.lastEvent(t)
			require.Equal(t, tc.decision, ev.Kind.String())

			ms := h.collect(t)
			n, pts := decisionCount(t, ms, tc.decision)
			require.Equal(t, beforeN+1, n, "one idem.decisions point per decision")
			p := pts[len(pts)-1]
			require.Equal(t, "/pay/{id}", attr(p.Attributes, "http.route"))
			require.Equal(t, "POST", attr(p.Attributes, "http.request.method"))
			require.Equal(t, tc.status, int(must(p.Attributes.Value("http.response.status_code")).AsInt64()))
			require.Equal(t, tc.outcome, attr(p.Attributes, idemotel.OutcomeKey))
			_, hasScope := p.Attributes.Value(idemotel.ScopeKey)
			_, hasKey := p.Attributes.Value(idemotel.IdempotencyKeyKey)
			require.False(t, hasScope || hasKey, "no unbounded attribute on a metric")

			// The histograms hold the event's durations, in seconds, for
			// the decision.
			for name, d := range map[string]time.Duration{"idem.claim.duration": ev.Claim, "idem.handler.duration": ev.Handler, "idem.completion.duration": ev.Completion} {
				var count uint64
				var sum float64
				for _, hp := range histogram(t, ms, name).DataPoints {
					if attr(hp.Attributes, idemotel.DecisionKey) == tc.decision {
						count, sum = hp.Count, hp.Sum
						require.Equal(t, idemotel.DurationBuckets(), hp.Bounds)
					}
				}
				if d == 0 {
					require.Zero(t, count, name+": the phase did not run")
					continue
				}
				require.EqualValues(t, 1, count, name)
				require.InDelta(t, d.Seconds(), sum, 1e-9, name)
			}

			takeovers, ok := ms["idem.takeovers"]
			require.True(t, ok, "idem.takeovers is exported before any takeover")
			var total int64
			for _, tp := range takeovers.Data.(metricdata.Sum[int64]).DataPoints {
				total += tp.Value
			}
			if tc.decision == "taken_over" {
				require.EqualValues(t, 1, total)
			} else {
				require.Zero(t, total)
			}

			// The spans: the phases that ran, children of the request's
			// span, each exactly as long as its phase, back to back.
			var names []string
			var last time.Time
			for _, s := range h.spans.Ended() {
				if s.Name() == "POST /pay/{id}" {
					continue
				}
				names = append(names, s.Name())
				require.Equal(t, parent.SpanID(), s.Parent().SpanID(), s.Name())
				require.Equal(t, parent.TraceID(), s.SpanContext().TraceID())
				require.Equal(t, trace.SpanKindInternal, s.SpanKind())
				attrs := attribute.NewSet(s.Attributes()...)
				require.Equal(t, tc.decision, attr(attrs, idemotel.DecisionKey))
				require.Equal(t, "k", attr(attrs, idemotel.IdempotencyKeyKey))
				require.Equal(t, int64(ev.Attempt), must(attrs.Value(idemotel.AttemptKey)).AsInt64())
				want := map[string]time.Duration{idemotel.SpanClaim: ev.Claim, idemotel.SpanExecute: ev.Handler, idemotel.SpanComplete: ev.Completion}[s.Name()]
				require.Equal(t, want, s.EndTime().Sub(s.StartTime()), s.Name()+" lasts its phase")
				if !last.IsZero() {
					require.Equal(t, last, s.StartTime(), s.Name()+" starts as the previous phase ends")
				}
				last = s.EndTime()
				if s.Name() == tc.failed {
					require.Equal(t, codes.Error, s.Status().Code, s.Name())
					require.NotEmpty(t, s.Events(), "the error is recorded")
				} else {
					require.Equal(t, codes.Unset, s.Status().Code, s.Name())
				}
			}
			require.Equal(t, tc.phases, names)
		})
	}
}

// A request that arrives while the same request runs is in_flight; the
// owner's execution is counted when it ends.
func TestObserverInFlight(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		w.WriteHeader(http.StatusCreated)
	})
	done := make(chan struct{})
	go func() { defer close(done); h.send("k", "{}") }()
	<-started
	got, _ := h.send("k", "{}")
	require.Equal(t, http.StatusConflict, got.Code)
	n, pts := decisionCount(t, h.collect(t), "in_flight")
	require.EqualValues(t, 1, n)
	require.Equal(t, "409", attr(pts[0].Attributes, "http.response.status_code"))
	close(release)
	<-done
	n, _ = decisionCount(t, h.collect(t), "executed")
	require.EqualValues(t, 1, n)
}

// Without a span in the request's context, the phases share one trace under
// an idem.request span.
func TestObserverWithoutRequestSpan(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) })
	require.Equal(t, http.StatusCreated, h.serve(context.Background(), "k", "{}").Code)
	spans := h.spans.Ended()
	require.Len(t, spans, 4)
	root := spans[len(spans)-1]
	require.Equal(t, idemotel.SpanRequest, root.Name())
	require.False(t, root.Parent().IsValid())
	for _, s := range spans[:3] {
		require.Equal(t, root.SpanContext().SpanID(), s.Parent().SpanID(), s.Name())
	}
	require.Equal(t, spans[0].StartTime(), root.StartTime())
	require.Equal(t, spans[2].EndTime(), root.EndTime())
}

func must[T any](v T, ok bool) T {
	if !ok {
		panic("missing")
	}
	return v
}

// A replay answered from the replay cache is counted as replayed, with
// idem.cached true: a dashboard can tell the cache's share of the replays.
func TestCachedReplayIsMarked(t *testing.T) {
	t.Parallel()
	h := newHarness(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusCreated) },
		func(c *idem.Options) { c.Replay.Cache.Bytes = 1 << 20 })
	for range 3 { // executed, replayed from the store, replayed from the cache
		require.Equal(t, http.StatusCreated, h.serve(t.Context(), "k", `{}`).Code)
	}
	n, pts := decisionCount(t, h.collect(t), "replayed")
	require.EqualValues(t, 2, n)
	cached := map[string]int64{}
	for _, p := range pts {
		v, _ := p.Attributes.Value(idemotel.CachedKey)
		cached[v.String()] += p.Value
	}
	require.Equal(t, map[string]int64{"": 1, "true": 1}, cached)
}
