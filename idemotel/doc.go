// Package idemotel records idem's decisions as OpenTelemetry metrics and
// spans: an idem.Observer (idem.Options.Engine.Observer) built on the providers the
// options name, the global ones by default, in the shape of OpenTelemetry
// contrib's instrumentation packages.
//
//	obs, err := idemotel.NewObserver(idemotel.WithMeterProvider(mp), idemotel.WithTracerProvider(tp))
//	if err != nil {
//		log.Fatal(err)
//	}
//	mw, err := idem.NewMiddleware(store, idem.Options{Scope: scope, Engine: idem.EngineOptions{Observer: obs}})
//
// It lives in its own module so that the core module imports no
// OpenTelemetry package. Metric names, units and attributes follow
// OpenTelemetry's semantic conventions (durations in seconds, http.route,
// http.request.method); the dashboard-ready list and the alerts are in
// docs/observability.md.
package idemotel
