// Package idemgrpc protects grpc-go unary RPCs with idem: a retried call
// with the same idempotency key runs its handler at most once to a recorded
// outcome, and every retry gets that outcome back (CONTRACT sections 3 to 6),
// through a unary server interceptor on idem's Engine.Do.
//
//	ic, err := idemgrpc.NewInterceptor(store, idem.EngineOptions{}, merchantFromAuth,
//		idemgrpc.ForMethods("/payments.v1.Payments/Charge"))
//	if err != nil {
//		log.Fatal(err)
//	}
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(auth, ic.UnaryServerInterceptor()))
//
// # The call
//
// The key is the metadata idempotency-key (one value: an RFC 8941 sf-string
// or bare, 1 to 255 visible ASCII characters, as idem.ParseKey reads the
// HTTP header), or, with WithKeyField, a string field of the request message
// (AIP-155's request_id; cleared before the fingerprint, so the record
// holds no client key under KeyHashSecret). The scope, the key's owner, is the ScopeFunc given
// to NewInterceptor, a required argument: an error or "" answers Unauthenticated, and
// keys of different scopes never meet. The record's method is "GRPC" and its
// path the call's full method (/package.Service/Method): a key first used for
// another method answers FailedPrecondition.
//
// # The fingerprint
//
// A retry must carry the same request; what is compared is a fingerprint that
// survives a deploy. Proto's binary encoding does not: its deterministic mode
// is stable only within one binary, and two encoders may order fields
// differently. The default fingerprint (Fingerprint) hashes a canonical form
// instead: the request message as protojson writes it with the schema's field
// names (UseProtoNames) and enum numbers (UseEnumNumbers), fields at their
// default value left out, then canonicalized per RFC 8785 and hashed with the
// full method by idem's fingerprint package (fingerprint.Request, as for a
// JSON body over HTTP: key order, whitespace and protojson's randomized spaces
// do not count, and numbers keep their exact value). So a retry that reaches
// a server whose request message gained a field (the client did not set it)
// has the same fingerprint as before the deploy. What changes it: renaming a
// field, changing a field's number or type, removing a field the request
// sets, and a field the client sets before the server's schema knows it
// (fields unknown to this binary are not hashed: the server ignores them, so
// two requests that differ only there are one request to it). WithFingerprint
// replaces the form with your own function.
//
// # The outcome and its replay
//
// The handler runs inside Engine.Do, on a context detached from the client's
// (no deadline, no cancellation; bounded by the lease and
// EngineOptions.Lease.MaxExecution instead), which carries idem.ExecutionFromContext,
// idem.Tx and idem.RelayKey as over HTTP. What it returns is decided by the
// outcome policy (WithOutcome; DefaultOutcome): a response, or an error
// whose code is an outcome (InvalidArgument, NotFound, FailedPrecondition,
// ...), is recorded SUCCEEDED and replayed; Unavailable, Aborted,
// DeadlineExceeded, ResourceExhausted, Internal, Unknown, Canceled, DataLoss
// and Unimplemented are recorded FAILED, and the retry runs again. The first
// caller gets the handler's own answer.
//
// The record keeps the response message's bytes as the Codec writes them
// (ProtoCodec: proto.Marshal) with its full type name, or the error's
// google.rpc.Status (code, message and details), and the header and trailer
// metadata the handler set whose names are on the allow-list (WithMetadata;
// never grpc-*; binary -bin values base64-encoded). A replay decodes the
// message into its type (resolved by name in protoregistry.GlobalTypes) and
// returns it, or returns the error, with the same metadata, and the header
// idempotent-replayed: true. grpc-go's codec then encodes the message again:
// the bytes the client receives are those of the first call for every
// message without map fields (Go's protobuf writes fields in number order and
// unknown fields as read); a map's entries come in the order grpc-go's codec
// picks, on the first call as on a replay, since it does not sort them. The
// record's HTTP status is 200, as gRPC's is: EngineOptions.Response.Outcome sees 200,
// and the policy that matters is WithOutcome's.
//
// # idem's own answers
//
// In flight, reused key, store down, response missing, seal broken: each
// idem answer has one gRPC code, listed in one table (codes.go, documented in
// docs/adapters.md), the same as adapters/idemconnect's where the two
// overlap. The answers a retry helps (in flight, store unavailable, lease
// lost, transaction aborted, ...) carry a google.rpc.RetryInfo detail and the
// trailer grpc-retry-pushback-ms, which grpc-go's retry policy honours
// (gRFC A6) while it ignores RetryInfo; they are trailers-only responses (no
// header metadata), the only ones grpc-go's retry policy retries (so a
// handler's own Unavailable is retried only if the handler set no header
// metadata). The in-flight pushback is EngineOptions.RetryAfter.InFlight (1 s
// by default), not the lease left: grpc-go's 5 attempts may give up before a
// crashed owner's lease ends (docs/adapters.md). Every one
// carries a google.rpc.ErrorInfo detail (domain "idem", reason the problem's
// name in upper snake case) and the trailer idem-problem-type with idem's
// problem type URI (docs/problems.md), as idemconnect's Idem-Problem-Type.
//
// grpc-go's retry policy stops after 5 attempts and ignores RetryInfo, so a
// duplicate that finds its key in flight waits for the owner's outcome by
// default (idem's wait mode, DoParams.Wait): up to WithWait (default 30 s)
// and at most 90% of the time left before the call's deadline, then it gets
// the replay, or Unavailable with the pushback if the owner still runs. NewInterceptor
// sets EngineOptions.Waiting.Max to that wait when the options set neither
// Waiting.Wait nor Waiting.Max (on PostgreSQL an engine with Waiting.Max set
// sends NOTIFY on its
// completions: docs/contract.md "Waiting for the owner"); WithWait(0) turns
// waiting off.
//
// # Panics, streams and the handler's stream
//
// A panic in the handler is recorded FAILED (the retry runs again) and raised
// again, for your recovery interceptor or grpc-go (which ends the process),
// as without idem. Streaming RPCs are out of scope: the whole response must
// be known before it is recorded, so idemgrpc has no stream interceptor, and
// a unary interceptor never sees a stream: streams are not protected. The
// handler's context carries a stream of idemgrpc's that holds the metadata
// it sets (grpc.SetHeader, SendHeader and SetTrailer) until the outcome is
// decided; grpc.SetSendCompressor and grpc.ClientSupportedCompressors need
// grpc-go's own stream and answer an error inside a protected handler: set
// compression outside it.
package idemgrpc

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/idemgo/idem"
)

// MetadataKey is the metadata that carries the idempotency key.
const MetadataKey = "idempotency-key"

// MetadataReplayed is set to "true" in the header metadata of every replay.
const MetadataReplayed = "idempotent-replayed"

// RecordMethod is the method of the records idemgrpc writes; their path is
// the call's full method.
const RecordMethod = "GRPC"

// DefaultWait is how long a duplicate waits for the execution in flight by
// default (WithWait): the default lease.
const DefaultWait = idem.DefaultLeaseDuration

// ScopeFunc names who owns a call's key (a tenant, an account), from its
// context (the authenticated peer, a token's claims): valid UTF-8 of at most
// idem.MaxScopeLength bytes, no NUL, never a value the client chooses
// unchecked. An error or "" answers Unauthenticated.
type ScopeFunc func(ctx context.Context) (string, error)

// FingerprintFunc returns the canonical form of a call's request, which
// idem's fingerprint package hashes (SHA-256, with the full method; JSON is
// canonicalized per RFC 8785 first, other bytes hashed as they are); it must
// be deterministic and stable across deploys. The form is what
// EngineOptions.Sealing.KeepRequestBytes keeps. With WithKeyField, req is a clone
// without the key field. An error answers Internal (the
// handler does not run).
type FingerprintFunc func(fullMethod string, req any) ([]byte, error)

// Interceptor protects unary RPCs; NewInterceptor makes one.
type Interceptor struct {
	engine      *idem.Engine
	scope       ScopeFunc
	logger      *slog.Logger
	opts        options
	replayNames map[string]bool
}

type options struct {
	match       func(ctx context.Context, fullMethod string) bool
	keyField    protoreflect.Name
	keyOptional bool
	fingerprint FingerprintFunc
	outcome     func(codes.Code) idem.Outcome
	codec       Codec
	metadata    []string
	wait        time.Duration
}

// Option configures NewInterceptor.
type Option func(*options)

// WithMatcher selects the calls idem protects: match reports whether a call
// of fullMethod (/package.Service/Method) is protected; the others pass
// through untouched. Default: every unary call, so that health checks
// (grpc.health.v1.Health/Check) and reads, which carry no key, answer
// InvalidArgument: select the methods with side effects (ForMethods).
func WithMatcher(match func(ctx context.Context, fullMethod string) bool) Option {
	return func(o *options) { o.match = match }
}

// ForMethods protects the calls of these full methods
// (/package.Service/Method) only; the others pass through untouched.
func ForMethods(fullMethods ...string) Option {
	set := make(map[string]bool, len(fullMethods))
	for _, m := range fullMethods {
		set[m] = true
	}
	return WithMatcher(func(_ context.Context, fullMethod string) bool { return set[fullMethod] })
}

// WithKeyField reads the key from the request message's string field name
// (AIP-155: request_id), when the message has that field and it is set; the
// metadata idempotency-key otherwise. A call that carries both, different,
// answers InvalidArgument. The field is cleared, on a clone of the message,
// before the fingerprint (FingerprintFunc gets the clone) and so before the
// request is kept: a retry that moves the key between the field and the
// metadata is the same request, and with EngineOptions.Sealing.KeyHashSecret the
// record holds no client key. Default: the metadata only.
func WithKeyField(name protoreflect.Name) Option {
	return func(o *options) { o.keyField = name }
}

// WithKeyOptional lets a call without a key pass through unprotected
// (AIP-155 makes request_id optional). Default: InvalidArgument.
func WithKeyOptional() Option {
	return func(o *options) { o.keyOptional = true }
}

// WithFingerprint replaces the canonical form of the request (Fingerprint).
func WithFingerprint(f FingerprintFunc) Option {
	return func(o *options) { o.fingerprint = f }
}

// WithOutcome sets the outcome policy: how a handler's answer, by its code
// (codes.OK for a response), is recorded: idem.Succeeded (replayed),
// idem.Failed (the retry runs again) or idem.Released (nothing recorded; use
// it only for answers given before any side effect). Default: DefaultOutcome.
func WithOutcome(policy func(codes.Code) idem.Outcome) Option {
	return func(o *options) { o.outcome = policy }
}

// WithCodec sets how a response message is stored and read back for a
// replay. Default: ProtoCodec{}.
func WithCodec(c Codec) Option {
	return func(o *options) { o.codec = c }
}

// WithMetadata lists the header and trailer metadata names a replay carries,
// any case (metadata names are lower-case); the others are not recorded.
// grpc-* names, idempotency-key and idempotent-replayed are refused by NewInterceptor.
// Default: none.
func WithMetadata(names ...string) Option {
	return func(o *options) { o.metadata = append(o.metadata, names...) }
}

// WithWait sets how long a duplicate that finds its key in flight waits for
// the owner's outcome before Unavailable (with pushback): at most d, at most
// 90% of the time left before the call's deadline, at most
// EngineOptions.Waiting.Max. 0 turns waiting off: Unavailable at once. Default:
// DefaultWait.
func WithWait(d time.Duration) Option {
	return func(o *options) { o.wait = d }
}

// New returns the interceptor on an Engine made of cfg (its Store
// included), as NewInterceptor does.
//
// Deprecated: use NewInterceptor, which takes the store and
// idem.EngineOptions (idem.EngineConfig is deprecated).
func New(cfg idem.EngineConfig, scope ScopeFunc, opts ...Option) (*Interceptor, error) {
	store, o := cfg.Options()
	return NewInterceptor(store, o, scope, opts...)
}

// NewInterceptor returns the interceptor on an Engine of store made of cfg
// (idem.NewEngineWith). When cfg sets neither Waiting.Wait nor Waiting.Max
// and waiting is on (WithWait), it sets cfg.Waiting.Max to the wait. scope
// is required.
//
// Errors: a nil scope, a nil argument of an option, a negative wait, a
// metadata name it refuses (WithMetadata), or idem.NewEngineWith's (which
// names the EngineOptions fields by path).
func NewInterceptor(store idem.Store, cfg idem.EngineOptions, scope ScopeFunc, opts ...Option) (*Interceptor, error) {
	o := options{outcome: DefaultOutcome, codec: ProtoCodec{}, wait: DefaultWait, fingerprint: Fingerprint}
	for _, opt := range opts {
		opt(&o)
	}
	var errs []error
	if scope == nil {
		errs = append(errs, errors.New("idemgrpc: the scope function is required"))
	}
	if o.outcome == nil || o.codec == nil || o.fingerprint == nil {
		errs = append(errs, errors.New("idemgrpc: WithOutcome, WithCodec and WithFingerprint take a non-nil argument"))
	}
	if o.wait < 0 {
		errs = append(errs, fmt.Errorf("idemgrpc: WithWait(%s): a wait cannot be negative", o.wait))
	}
	names := map[string]bool{}
	for _, n := range o.metadata {
		n = strings.ToLower(n)
		switch {
		case strings.HasPrefix(n, "grpc-"), n == MetadataKey, n == MetadataReplayed, n == problemTrailer:
			errs = append(errs, fmt.Errorf("idemgrpc: WithMetadata(%q): grpc-* and idem's own metadata are never replayed", n))
		case n == "" || strings.ContainsFunc(n, func(r rune) bool { return !validMetadataRune(r) }):
			errs = append(errs, fmt.Errorf("idemgrpc: WithMetadata(%q): not a metadata name (0-9 a-z - _ .)", n))
		}
		names[n] = true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	if o.wait > 0 && cfg.Waiting.Wait == 0 && cfg.Waiting.Max == 0 {
		cfg.Waiting.Max = o.wait
	}
	engine, err := idem.NewEngineWith(store, cfg)
	if err != nil {
		return nil, err
	}
	return &Interceptor{engine: engine, scope: scope, logger: cmp.Or(cfg.Logger, slog.Default()), opts: o, replayNames: names}, nil
}

func validMetadataRune(r rune) bool {
	return r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r == '-' || r == '_' || r == '.'
}

// Engine returns the engine behind the interceptor (Engine.Close ends its
// listener on PostgreSQL; Engine.StoredKey names a record).
func (i *Interceptor) Engine() *idem.Engine { return i.engine }

// UnaryServerInterceptor returns the interceptor for grpc.NewServer
// (grpc.UnaryInterceptor or grpc.ChainUnaryInterceptor). Put it after the
// interceptors that authenticate the call (the scope comes from their
// context) and before those that should run once per execution; an
// interceptor before it that sets header metadata makes its retryable
// answers non-retryable for grpc-go (which retries trailers-only responses
// only).
func (i *Interceptor) UnaryServerInterceptor() grpc.UnaryServerInterceptor {
	return i.intercept
}

func (i *Interceptor) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if i.opts.match != nil && !i.opts.match(ctx, info.FullMethod) {
		return handler(ctx, req)
	}
	key, err := i.key(ctx, req)
	switch {
	case errors.Is(err, idem.ErrMissingKey) && i.opts.keyOptional:
		return handler(ctx, req)
	case err != nil:
		return nil, answer(ctx, err)
	}
	scope, err := i.scope(ctx)
	if err != nil || scope == "" {
		return nil, answer(ctx, idem.ErrMissingScope)
	}
	// The fingerprint and the kept request never hold the key: with
	// KeyHashSecret, the record shows no client key (docs/sealing.md).
	form, err := i.opts.fingerprint(info.FullMethod, i.withoutKeyField(req))
	if err != nil {
		i.logger.ErrorContext(ctx, "idemgrpc: the request's fingerprint failed; the call is refused", "method", info.FullMethod, "err", err)
		return nil, status.Error(codes.Internal, "idemgrpc: the server could not fingerprint this request")
	}
	run := &execution{i: i, handler: handler, req: req}
	res, err := i.engine.Do(ctx, idem.DoParams{
		Scope: scope, Key: key, Method: RecordMethod, Route: info.FullMethod,
		Fingerprint: hashForm(info.FullMethod, form), Payload: form, Wait: i.waitFor(ctx),
	}, run.do(ctx))
	switch {
	case errors.Is(err, idem.ErrOutcomeUnknown):
		// The record is UNKNOWN: its handler's answer, whatever it was, is
		// not this call's (docs/contract.md section 11.3).
	case run.ran && (err == nil || errors.Is(err, errRunAgain) || errors.Is(err, idem.ErrReleased) || errors.Is(err, idem.ErrOutcomeFailed)):
		// This call ran the handler: its own answer, recorded (or not,
		// as the policy said).
		return run.answer(ctx, err)
	case err == nil:
		return i.replay(ctx, info.FullMethod, res)
	}
	if _, known := kindOf(err); !known {
		i.logger.ErrorContext(ctx, "idemgrpc: an error of no idem kind; answering Internal", "method", info.FullMethod, "err", err)
	}
	return nil, answer(ctx, err)
}

// waitFor is DoParams.Wait for a call under ctx: negative for none.
func (i *Interceptor) waitFor(ctx context.Context) time.Duration {
	w := i.opts.wait
	if dl, ok := ctx.Deadline(); ok && w > 0 {
		left := time.Until(dl)
		w = min(w, left-left/10)
	}
	if w <= 0 {
		return -1
	}
	return w
}

// keyField returns req's key field (WithKeyField): a singular string field
// of that name, nil when none is configured or the message has none.
func (i *Interceptor) keyField(req any) (protoreflect.Message, protoreflect.FieldDescriptor) {
	m, ok := req.(proto.Message)
	if i.opts.keyField == "" || !ok {
		return nil, nil
	}
	r := m.ProtoReflect()
	fd := r.Descriptor().Fields().ByName(i.opts.keyField)
	if fd == nil || fd.Kind() != protoreflect.StringKind || fd.Cardinality() == protoreflect.Repeated {
		return nil, nil
	}
	return r, fd
}

// withoutKeyField returns req without its key field: a clone with the
// field cleared when it is set, req itself otherwise.
func (i *Interceptor) withoutKeyField(req any) any {
	r, fd := i.keyField(req)
	if fd == nil || !r.Has(fd) {
		return req
	}
	c := proto.Clone(r.Interface())
	c.ProtoReflect().Clear(fd)
	return c
}

// key returns the call's key: the request's key field, else the metadata.
// Errors: idem.ErrMissingKey, idem.ErrInvalidKey.
func (i *Interceptor) key(ctx context.Context, req any) (string, error) {
	md, _ := metadata.FromIncomingContext(ctx)
	values := md.Get(MetadataKey)
	field := ""
	if r, fd := i.keyField(req); fd != nil {
		field = r.Get(fd).String()
	}
	if field == "" {
		key, err := idem.ParseKey(values)
		if errors.Is(err, idem.ErrMissingKey) && i.opts.keyField != "" {
			return "", &refusal{err, fmt.Sprintf("an idempotency key is required for this method (the %s metadata, or the request's %s field)",
				MetadataKey, i.opts.keyField)}
		}
		return key, err
	}
	key, err := idem.ParseKey([]string{field})
	if err != nil {
		return "", &refusal{err, fmt.Sprintf("invalid idempotency key in the request's %s: one value of 1 to 255 visible ASCII characters", i.opts.keyField)}
	}
	if len(values) > 0 {
		mk, err := idem.ParseKey(values)
		if err != nil {
			return "", keysSent{err} // a field and metadata: two keys sent
		}
		if mk != key {
			return "", keysSent{&refusal{idem.ErrInvalidKey, fmt.Sprintf("the request's %s and the %s metadata name different keys; send one key, or the same in both",
				i.opts.keyField, MetadataKey)}}
		}
	}
	return key, nil
}
