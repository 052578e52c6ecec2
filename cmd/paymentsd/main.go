package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/idemgo/idem/cmd/internal/naivecache"
	"github.com/idemgo/idem/cmd/internal/service"
	"github.com/idemgo/idem/completer"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/idemotel"
	"github.com/idemgo/idem/seal"
)

// EnvRelaySecret names the environment variable read for the relay secret
// when --relay-secret is not given (prefer it: a flag shows in ps).
const EnvRelaySecret = "PAYMENTSD_RELAY_SECRET"

// EnvSealKeys and EnvKeyHashSecret name the environment variables read for
// the sealing keys and the key-hash secret when their flags are absent.
const (
	EnvSealKeys      = "PAYMENTSD_SEAL_KEYS"
	EnvKeyHashSecret = "PAYMENTSD_KEY_HASH_SECRET"
)

func main() { service.Main("paymentsd", run) }

// options are the command-line flags: the shared ones (service.Flags) and
// the demo's own.
type options struct {
	service.Flags
	pspURL      string
	pspLatency  time.Duration
	pspTimeout  time.Duration
	relaySecret string
	writeMode   WriteMode
	// wait and maxWait are idem's EngineOptions.Waiting.Wait and MaxWait.
	wait, maxWait time.Duration
	// maxInFlight is idem's EngineOptions.Admission.MaxInFlight, per protected route.
	maxInFlight int
	// sealKeys, replayPlain, keyHashSecret and keepRequest are idem's
	// SealKeys, ReplayPlain, KeyHashSecret and KeepRequestBytes
	// (docs/sealing.md).
	sealKeys      []seal.Key
	replayPlain   bool
	keyHashSecret []byte
	keepRequest   int64
	// atMostOnce declares the charge at-most-once (handlerConfig.AtMostOnceCharge).
	atMostOnce bool
	// completer runs idem's completer (handlerConfig.Completer), its
	// re-drives completerGrace after a payment was last touched.
	completer      bool
	completerGrace time.Duration

	// faults are the fault-injection flags (-tags idemfaults only).
	faults faultOptions

	// naive replaces idem with the naive Redis cache, for comparison
	// (naive.go).
	naive naiveOptions
}

// parseFlags reads the command line; getenv supplies EnvRelaySecret when
// --relay-secret is absent.
func parseFlags(args []string, output io.Writer, getenv func(string) string) (options, error) {
	var o options
	fs := o.FlagSet(output, schema, "127.0.0.1:8080",
		"idem lease: how long a request owns its Idempotency-Key before another may take it over (at least 1s)")
	fs.StringVar(&o.pspURL, "psp-url", "", "payment provider's base URL, e.g. http://127.0.0.1:8090 (cmd/fakepsp); default: an in-process fake provider")
	fs.DurationVar(&o.pspLatency, "psp-latency", 300*time.Millisecond, "how long the in-process fake provider takes per charge (without --psp-url)")
	fs.DurationVar(&o.pspTimeout, "psp-timeout", 5*time.Second, "how long to wait for the provider's answer to a charge (with --psp-url); then 504, and a retry asks again with the same relayed key")
	fs.StringVar(&o.relaySecret, "relay-secret", "", "secret keying the Idempotency-Key relayed to the provider (idem Options.Engine.RelaySecret); default $"+EnvRelaySecret+", else none (plain SHA-256 derivation)")
	fs.DurationVar(&o.wait, "wait", 0, "how long a duplicate of a payment in flight waits for its outcome, holding no connection, to get its replay instead of 409 (idem EngineOptions.Waiting.Wait); 0: 409 at once")
	fs.DurationVar(&o.maxWait, "max-wait", 10*time.Second, "the longest wait a request may ask for with Prefer: wait=N (N seconds; RFC 7240) (idem EngineOptions.Waiting.Max); at least --wait")
	fs.IntVar(&o.maxInFlight, "max-in-flight", 0, "the most payments each protected route runs at once (idem EngineOptions.Admission.MaxInFlight): "+
		"one more is refused before its claim, 503 overloaded with Retry-After, nothing charged; 0: no bound (docs/deployment.md, \"Leases under load\")")
	fs.Func("seal-key", "seal stored responses and requests (AES-GCM) with this key, id:base64secret (16, 24 or 32 bytes); "+
		"repeat it or separate keys with commas to rotate: the first seals, every one opens; default $"+EnvSealKeys+", else none",
		func(s string) error {
			if strings.TrimSpace(s) == "" { // an unset variable expanded to nothing: never "no sealing"
				return errors.New("empty: give id:base64secret, or leave the flag out")
			}
			keys, err := seal.ParseKeys(s)
			o.sealKeys = append(o.sealKeys, keys...)
			return err
		})
	fs.BoolVar(&o.replayPlain, "seal-replay-plain", false, "with --seal-key, also replay records stored plain (idem EngineOptions.Sealing.ReplayPlain), "+
		"written before sealing was turned on; only while such records live: anyone who can write the table could plant one. "+
		"Without it a plain record answers 500 seal-broken")
	hashSecret := fs.String("key-hash-secret", "", "store each Idempotency-Key as an HMAC-SHA256 under this base64 secret (at least 16 bytes), "+
		"so the table shows no client key; set it only on a new table; default $"+EnvKeyHashSecret+", else none")
	fs.Int64Var(&o.keepRequest, "keep-request-bytes", 0, "keep each recorded request's first `N` body bytes, query and Content-Type beside its record for an audit "+
		"(sealed with --seal-key; shown by idem inspect --request); 0: keep none")
	fs.BoolVar(&o.atMostOnce, "at-most-once-charge", false, "declare the provider charge an at-most-once step (idem.AtMostOnce), for a provider "+
		"without idempotency keys: never sent twice; a charge whose outcome is unknown (a crash or a timeout during the call) holds the payment "+
		"UNKNOWN, answered 409 outcome-unknown, until an operator runs idem resolve")
	fs.BoolVar(&o.completer, "completer", true, "run idem's completer: a payment whose client went away after its charge started "+
		"(a crash, a provider timeout) is finished without it, from its request kept at the charge (sealed with --seal-key); "+
		"with --key-hash-secret it needs --seal-key, and is off without one")
	fs.DurationVar(&o.completerGrace, "completer-grace", 10*time.Second, "how long the completer leaves an abandoned payment to its client "+
		"before finishing it (doubling with each further attempt)")
	mode := fs.String("write-mode", string(WriteInClaim), "where a payment's rows are written: claim (in the claim's transaction, committed with idem's record) or separate (committed on their own first; for comparison)")
	o.faults.register(fs)
	registerNaiveFlags(fs, &o.naive)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if err := o.faults.validate(); err != nil {
		return o, err
	}
	o.writeMode = WriteMode(*mode)
	if o.relaySecret == "" && getenv != nil {
		o.relaySecret = getenv(EnvRelaySecret)
	}
	if *hashSecret == "" && flagSet(fs, "key-hash-secret") {
		// Hashing off would make every hashed record unfindable: their retries run again.
		return o, errors.New("--key-hash-secret is empty: give the base64 secret, or leave the flag out")
	}
	if err := o.sealingFromEnv(*hashSecret, getenv); err != nil {
		return o, err
	}
	if o.replayPlain && len(o.sealKeys) == 0 {
		return o, errors.New("--seal-replay-plain needs --seal-key (or $" + EnvSealKeys + ")")
	}
	if err := o.Check(fs); err != nil {
		return o, err
	}
	switch {
	case o.pspLatency < 0:
		return o, errors.New("--psp-latency must not be negative")
	case o.pspTimeout <= 0:
		return o, errors.New("--psp-timeout must be positive")
	case o.writeMode != WriteInClaim && o.writeMode != WriteSeparate:
		return o, fmt.Errorf("--write-mode must be claim or separate, not %q", o.writeMode)
	case o.wait < 0 || o.maxWait < 0:
		return o, errors.New("--wait and --max-wait must not be negative")
	case o.maxInFlight < 0:
		return o, errors.New("--max-in-flight must not be negative")
	}
	if o.wait > o.maxWait {
		if flagSet(fs, "max-wait") {
			return o, fmt.Errorf("--wait %s exceeds --max-wait %s", o.wait, o.maxWait)
		}
		o.maxWait = o.wait // the default bound gives way to a longer server wait
	}
	if err := o.naive.validate(); err != nil {
		return o, err
	}
	if o.pspURL != "" {
		u, err := url.Parse(o.pspURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
			return o, fmt.Errorf("--psp-url must be an http:// or https:// base URL, not %q", o.pspURL)
		}
	}
	return o, nil
}

// sealingFromEnv reads the sealing keys and the key-hash secret from the
// environment when their flags are absent, and decodes the secret.
func (o *options) sealingFromEnv(hashSecret string, getenv func(string) string) error {
	if getenv != nil && o.sealKeys == nil {
		keys, err := seal.ParseKeys(getenv(EnvSealKeys))
		if err != nil {
			return fmt.Errorf("$%s: %w", EnvSealKeys, err)
		}
		o.sealKeys = keys
	}
	if hashSecret == "" && getenv != nil {
		hashSecret = getenv(EnvKeyHashSecret)
	}
	if hashSecret != "" {
		b, err := seal.ParseHashSecret(hashSecret) // at least the minimum idem.New takes
		if err != nil {
			return fmt.Errorf("--key-hash-secret: %w", err)
		}
		o.keyHashSecret = b
	}
	if o.keepRequest < 0 {
		return errors.New("--keep-request-bytes must not be negative")
	}
	if o.completerGrace < 0 {
		return errors.New("--completer-grace must not be negative")
	}
	return nil
}

// run starts the service and blocks until ctx is done or SIGINT/SIGTERM
// arrives, then shuts down cleanly: stop accepting, wait for in-flight
// requests (at most --shutdown-timeout), close the database. It returns
// flag.ErrHelp after printing the usage for -h.
func run(ctx context.Context, args []string, stderr io.Writer) error {
	o, err := parseFlags(args, stderr, os.Getenv)
	if err != nil {
		return err
	}
	return service.Run(ctx, stderr, service.Process[Store]{
		Flags: o.Flags, Name: "paymentsd",
		Open:  func(ctx context.Context) (Store, error) { return openStore(ctx, o.DatabaseURL) },
		Serve: o.serve,
	})
}

// serve builds the handler of o on store: idem's, or the naive cache's
// with --naive (its Redis client closed by Served.Close), observed by tel.
func (o options) serve(ctx context.Context, log *slog.Logger, store Store, tel *service.Telemetry) (service.Served, error) {
	var provider Provider = NewFakeProvider(o.pspLatency)
	psp := "in-process fake, latency " + o.pspLatency.String()
	if o.pspURL != "" {
		provider = NewHTTPProvider(o.pspURL, o.pspTimeout)
		psp = o.pspURL + ", timeout " + o.pspTimeout.String()
	}
	flt := o.faults.build(log)
	hcfg := handlerConfig{
		Store: store, Provider: provider, Logger: log, Lease: o.Lease,
		RelaySecret: []byte(o.relaySecret), WriteMode: o.writeMode, Faults: flt, Wait: o.wait, MaxWait: o.maxWait, MaxInFlight: o.maxInFlight,
		SealKeys: o.sealKeys, ReplayPlain: o.replayPlain, KeyHashSecret: o.keyHashSecret, KeepRequestBytes: o.keepRequest,
		AtMostOnceCharge: o.atMostOnce, Observer: tel.Observer, Metrics: tel.Metrics, MeterProvider: tel.MeterProvider(),
	}
	completerOn := o.completer && !o.naive.enabled
	if completerOn && len(o.keyHashSecret) > 0 && len(o.sealKeys) == 0 {
		log.Warn("the completer is off: with --key-hash-secret it needs --seal-key (the request it keeps holds the client's key)")
		completerOn = false
	}
	if completerOn {
		hcfg.Completer = &completer.Config{Grace: o.completerGrace}
	}
	var served service.Served
	var err error
	if o.naive.enabled {
		cache, err := naivecache.OpenRedis(ctx, o.naive.url())
		if err != nil {
			return served, err
		}
		served.Close = cache.Close
		if served.Handler, err = newNaiveHandler(hcfg, cache, o.naive.cacheTTL()); err != nil {
			return service.Served{}, errors.Join(err, cache.Close())
		}
	} else {
		var c *completer.Completer
		if served.Handler, c, err = newService(hcfg); err != nil {
			return served, err
		}
		// The UNKNOWN records' gauges, read at each scrape of /metrics.
		unregister := func() error { return nil }
		if uc, ok := store.Idem().(idemdriver.UnknownCounter); ok {
			reg, err := idemotel.NewUnknownGauges(uc, idemotel.WithMeterProvider(tel.MeterProvider()))
			if err != nil {
				return served, err
			}
			unregister = reg.Unregister
		}
		served.Close = unregister
		if c != nil {
			if err := c.Start(ctx); err != nil {
				return served, errors.Join(err, unregister())
			}
			served.Close = func() error { c.Stop(); return unregister() }
		}
	}
	served.Attrs = []any{"psp", psp, "lease", o.Lease.String(), "write_mode", string(o.writeMode),
		"wait", o.wait.String(), "max_wait", o.maxWait.String(), "max_in_flight", o.maxInFlight, "relay_secret", o.relaySecret != ""}
	if len(o.sealKeys) > 0 {
		served.Attrs = append(served.Attrs, "seal_key", o.sealKeys[0].ID)
	}
	if o.replayPlain {
		served.Attrs = append(served.Attrs, "seal_replay_plain", true)
	}
	if len(o.keyHashSecret) > 0 {
		served.Attrs = append(served.Attrs, "key_hash", true)
	}
	if o.keepRequest > 0 {
		served.Attrs = append(served.Attrs, "keep_request_bytes", o.keepRequest)
	}
	if o.atMostOnce {
		served.Attrs = append(served.Attrs, "at_most_once_charge", true)
	}
	if completerOn {
		served.Attrs = append(served.Attrs, "completer_grace", o.completerGrace.String())
	}
	if d := o.faults.describe(); d != "" {
		served.Attrs = append(served.Attrs, "faults", d)
	}
	if o.naive.enabled {
		served.Attrs = append(served.Attrs, "mode", o.naive.describe())
	}
	return served, nil
}

// flagSet reports whether the command line set the flag name.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}
