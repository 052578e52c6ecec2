package idemotel

import (
	"context"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/idemgo/idem"
)

// Attribute keys of idem's own (the HTTP ones are the semantic conventions'
// http.route, http.request.method and http.response.status_code).
const (
	// DecisionKey is the decision: idem.EventKind's String (executed,
	// replayed, in_flight, key_reused, released, taken_over, lease_lost,
	// store_unavailable, completion_failed, overloaded, outcome_unknown). On
	// every metric and span.
	DecisionKey = attribute.Key("idem.decision")
	// OutcomeKey is how an execution was recorded: succeeded, failed or
	// released (idem.Outcome, lower-cased). Only on executed, taken_over and
	// released decisions.
	OutcomeKey = attribute.Key("idem.outcome")
	// CachedKey is true on a replayed or key_reused decision answered from
	// idem's replay cache (idem.Event.Cached, Options.Replay.Cache.Bytes);
	// absent otherwise. On the idem.decisions metric and on spans.
	CachedKey = attribute.Key("idem.cached")
	// AttemptKey is idem.Event.Attempt (spans only).
	AttemptKey = attribute.Key("idem.attempt")
	// ScopeKey and IdempotencyKeyKey name the record (spans only: unbounded
	// cardinality, never a metric attribute).
	ScopeKey          = attribute.Key("idem.scope")
	IdempotencyKeyKey = attribute.Key("idem.key")
)

// Span names.
const (
	SpanClaim    = "idem.claim"
	SpanExecute  = "idem.execute"
	SpanComplete = "idem.complete"
	// SpanRequest encloses the three when the request's context carries no
	// span, so that they still form one trace.
	SpanRequest = "idem.request"
)

// DurationBuckets returns the explicit bucket boundaries, in seconds, of
// the three duration histograms: from 0.5 ms (a claim on a local database)
// to 30 s (idem's default lease). Each call returns a new slice.
func DurationBuckets() []float64 {
	return []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}
}

// Observer is an idem.Observer that records each idem.Event as
// OpenTelemetry metrics and spans; set it as idem.Options.Engine.Observer. The
// metrics and spans are listed in docs/observability.md. It is safe for
// concurrent use.
type Observer struct {
	tracer     trace.Tracer
	decisions  metric.Int64Counter
	takeovers  metric.Int64Counter
	claim      metric.Float64Histogram
	handler    metric.Float64Histogram
	completion metric.Float64Histogram
}

var _ idem.Observer = (*Observer)(nil)

// NewObserver creates the instruments on the MeterProvider and the tracer on
// the TracerProvider the options name (default: the global providers):
//
//   - idem.decisions, Int64Counter, unit {decision}: one per Event, with
//     idem.decision, http.route, http.request.method,
//     http.response.status_code (when a status was sent) and idem.outcome
//     (when an execution was recorded or released).
//   - idem.takeovers, Int64Counter, unit {execution}: one per taken_over
//     decision, with http.route and http.request.method: re-executions
//     whose side effects may have reached a provider once already. Created
//     with a 0 point (no attributes) so that the series exists, and an
//     alert on it has data, before the first takeover.
//   - idem.claim.duration, idem.handler.duration, idem.completion.duration,
//     Float64Histogram, unit s (DurationBuckets()): Event.Claim, Handler and
//     Completion, each recorded only when the phase ran (non-zero), with
//     idem.decision, http.route and http.request.method.
//
// It returns the meter's error if an instrument cannot be created.
func NewObserver(opts ...Option) (*Observer, error) {
	c := newConfig(opts)
	meter := c.meterProvider.Meter(ScopeName)
	o := &Observer{tracer: c.tracerProvider.Tracer(ScopeName)}
	var err error
	if o.decisions, err = meter.Int64Counter("idem.decisions", metric.WithUnit("{decision}"),
		metric.WithDescription("Decisions idem made for protected requests, by decision (idem.decision).")); err != nil {
		return nil, err
	}
	if o.takeovers, err = meter.Int64Counter("idem.takeovers", metric.WithUnit("{execution}"),
		metric.WithDescription("Executions that took over a PROCESSING record whose lease ran out: re-executions sent to the provider.")); err != nil {
		return nil, err
	}
	hist := func(name, desc string) (metric.Float64Histogram, error) {
		return meter.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(DurationBuckets()...))
	}
	if o.claim, err = hist("idem.claim.duration", "Duration of idem's claim statement."); err != nil {
		return nil, err
	}
	if o.handler, err = hist("idem.handler.duration", "Duration of the protected handler (an execution)."); err != nil {
		return nil, err
	}
	if o.completion, err = hist("idem.completion.duration", "Duration of recording an execution's outcome (completion and COMMIT, FAILED mark or release)."); err != nil {
		return nil, err
	}
	o.takeovers.Add(context.Background(), 0)
	return o, nil
}

// recorded reports whether e's Outcome means anything.
func recorded(k idem.EventKind) bool {
	return k == idem.EventExecuted || k == idem.EventTakenOver || k == idem.EventReleased
}

// Observe records e: the metrics of NewObserver, and the spans idem.claim,
// idem.execute and idem.complete (each only when its phase ran) as children
// of ctx's span. idem calls Observe once the answer is written, so the spans
// are started and ended here with timestamps computed back from now and
// e's durations: each span lasts exactly its phase, the three placed back
// to back ending now (the moments between phases, such as writing the
// answer, are not shown as gaps). Spans the handler itself started are
// children of the request's span, siblings of idem.execute, not its
// children.
func (o *Observer) Observe(ctx context.Context, e idem.Event) {
	end := time.Now()
	decision := DecisionKey.String(e.Kind.String())
	route, method := semconv.HTTPRoute(e.Route), semconv.HTTPRequestMethodKey.String(e.Method)

	common := metric.WithAttributeSet(attribute.NewSet(decision, route, method))
	if e.Claim > 0 {
		o.claim.Record(ctx, e.Claim.Seconds(), common)
	}
	if e.Handler > 0 {
		o.handler.Record(ctx, e.Handler.Seconds(), common)
	}
	if e.Completion > 0 {
		o.completion.Record(ctx, e.Completion.Seconds(), common)
	}
	attrs := []attribute.KeyValue{decision, route, method}
	if e.Status != 0 {
		attrs = append(attrs, semconv.HTTPResponseStatusCode(e.Status))
	}
	if recorded(e.Kind) {
		attrs = append(attrs, OutcomeKey.String(strings.ToLower(e.Outcome.String())))
	}
	if e.Cached {
		attrs = append(attrs, CachedKey.Bool(true))
	}
	o.decisions.Add(ctx, 1, metric.WithAttributes(attrs...))
	if e.Kind == idem.EventTakenOver {
		o.takeovers.Add(ctx, 1, metric.WithAttributes(route, method))
	}
	o.spans(ctx, e, end, append(attrs, AttemptKey.Int(e.Attempt), ScopeKey.String(e.Scope), IdempotencyKeyKey.String(e.Key)))
}

// spans starts and ends the phase spans of e, ending at end.
func (o *Observer) spans(ctx context.Context, e idem.Event, end time.Time, attrs []attribute.KeyValue) {
	completeStart := end.Add(-e.Completion)
	executeStart := completeStart.Add(-e.Handler)
	claimStart := executeStart.Add(-e.Claim)
	if !trace.SpanContextFromContext(ctx).IsValid() {
		var parent trace.Span
		ctx, parent = o.tracer.Start(ctx, SpanRequest, trace.WithTimestamp(claimStart),
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		defer parent.End(trace.WithTimestamp(end))
	}
	phase := func(name string, from, to time.Time, failed bool) {
		_, span := o.tracer.Start(ctx, name, trace.WithTimestamp(from),
			trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
		if failed && e.Err != nil {
			span.RecordError(e.Err, trace.WithTimestamp(to))
			span.SetStatus(codes.Error, e.Err.Error())
		}
		span.End(trace.WithTimestamp(to))
	}
	failed := failedPhase(e)
	if e.Claim > 0 {
		phase(SpanClaim, claimStart, executeStart, failed == SpanClaim)
	}
	if e.Handler > 0 {
		phase(SpanExecute, executeStart, completeStart, failed == SpanExecute)
	}
	if e.Completion > 0 {
		phase(SpanComplete, completeStart, end, failed == SpanComplete)
	}
}

// failedPhase names the span that carries e.Err: the claim for a store
// that did not answer it; the execution for a lease that could not be
// renewed, a lease lost while the handler ran, or a FAILED outcome with a
// cause (a timeout, an aborted transaction, Do's error); the completion
// for a completion that failed or was fenced out.
func failedPhase(e idem.Event) string {
	switch {
	case e.Err == nil:
		return ""
	case e.Kind == idem.EventStoreUnavailable && e.Handler == 0:
		return SpanClaim
	case e.Kind == idem.EventCompletionFailed, e.Kind == idem.EventLeaseLost && e.Completion > 0:
		return SpanComplete
	}
	return SpanExecute
}
