package idemgrpc

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/idemgo/idem"
)

// Codec stores a response message for replay and reads it back.
type Codec interface {
	// Marshal returns msg's type name and its bytes.
	Marshal(msg any) (typeName string, b []byte, err error)
	// Unmarshal returns a message of the type typeName decoded from b.
	Unmarshal(typeName string, b []byte) (any, error)
}

// ProtoCodec stores protobuf messages: proto.Marshal's bytes (what grpc-go's
// default codec sends) and the message's full name, resolved on replay in
// Resolver (default: protoregistry.GlobalTypes, where generated code and
// the well-known types register theirs).
type ProtoCodec struct {
	Resolver protoregistry.MessageTypeResolver
}

// Marshal returns the full name and proto.Marshal of msg, a proto.Message.
func (c ProtoCodec) Marshal(msg any) (string, []byte, error) {
	m, ok := msg.(proto.Message)
	if !ok {
		return "", nil, fmt.Errorf("idemgrpc: the response is a %T, not a proto.Message (set WithCodec)", msg)
	}
	b, err := proto.Marshal(m)
	return string(m.ProtoReflect().Descriptor().FullName()), b, err
}

// Unmarshal decodes b into a new message of the type typeName.
func (c ProtoCodec) Unmarshal(typeName string, b []byte) (any, error) {
	r := c.Resolver
	if r == nil {
		r = protoregistry.GlobalTypes
	}
	mt, err := r.FindMessageByName(protoreflect.FullName(typeName))
	if err != nil {
		return nil, fmt.Errorf("idemgrpc: the stored response's type %q: %w", typeName, err)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("idemgrpc: the stored %s: %w", typeName, err)
	}
	return m, nil
}

// The record's header map (idem.Result.Header) holds the call's code, the
// response's type and the allow-listed metadata. Names with a colon are
// idemgrpc's own: no metadata name has one.
const (
	fieldCode      = ":code"       // the gRPC code, decimal
	fieldType      = ":type"       // the response message's type name (code OK)
	fieldNotStored = ":not-stored" // why the answer could not be stored
	headerPrefix   = "header:"     // a header metadata name
	trailerPrefix  = "trailer:"    // a trailer metadata name
)

// errRunAgain is fn's error for an answer the policy records FAILED.
var errRunAgain = errors.New("idemgrpc: the handler's answer is recorded FAILED; a retry runs it again")

// execution runs the handler inside Engine.Do and keeps its answer.
type execution struct {
	i       *Interceptor
	handler grpc.UnaryHandler
	req     any

	ran    bool
	resp   any
	err    error
	stream *heldStream
}

// do returns Do's fn for a call under ctx.
func (e *execution) do(ctx context.Context) func(context.Context) (idem.Result, error) {
	return func(hctx context.Context) (idem.Result, error) {
		e.ran = true
		e.stream = &heldStream{ServerTransportStream: grpc.ServerTransportStreamFromContext(ctx)}
		e.resp, e.err = e.handler(grpc.NewContextWithServerTransportStream(hctx, e.stream), e.req)
		st := status.Convert(e.err)
		switch e.i.opts.outcome(st.Code()) {
		case idem.Failed:
			return idem.Result{}, errRunAgain
		case idem.Released:
			if err := idem.ReleaseKey(hctx); err != nil {
				return idem.Result{}, err
			}
		}
		return e.record(st), nil
	}
}

// record is the Result that keeps the handler's answer.
func (e *execution) record(st *status.Status) idem.Result {
	res := idem.Result{Status: http.StatusOK, Header: map[string][]string{fieldCode: {strconv.Itoa(int(st.Code()))}}}
	var err error
	if st.Code() == codes.OK {
		var typeName string
		typeName, res.Body, err = e.i.opts.codec.Marshal(e.resp)
		res.Header[fieldType] = []string{typeName}
	} else {
		res.Body, err = proto.Marshal(st.Proto())
	}
	if err != nil {
		// The handler ran: the retry must not run it again. It gets
		// AlreadyExists, as for a response too large to store.
		e.i.logger.Error("idemgrpc: the handler's answer cannot be stored; a retry gets AlreadyExists (response-not-stored)", "err", err)
		return idem.Result{Status: http.StatusOK, Header: map[string][]string{fieldCode: res.Header[fieldCode], fieldNotStored: {err.Error()}}}
	}
	header, trailer := e.stream.held()
	e.i.keep(res.Header, headerPrefix, header)
	e.i.keep(res.Header, trailerPrefix, trailer)
	return res
}

// answer is the handler's own answer, with the metadata it set; doErr is
// Do's error.
func (e *execution) answer(ctx context.Context, doErr error) (any, error) {
	header, trailer := e.stream.held()
	e.i.setMetadata(ctx, "the handler's", header, trailer)
	if errors.Is(e.err, idem.ErrStepUnreconciled) || errors.Is(doErr, idem.ErrStepUnreconciled) {
		// An at-most-once step's earlier start is not reconciled yet: the
		// record is FAILED whatever the handler said (its success too), and
		// a retry later asks again, so the client hears Unavailable with
		// the pushback.
		return nil, unreconciled(ctx)
	}
	return e.resp, e.err
}

// setMetadata sets the header and trailer metadata of the answer to a call
// under ctx; what names whose (for the log). A client that went away
// (ctx done: its deadline passed, it cancelled) cannot get them, and
// grpc-go refuses them: no fault, logged at DEBUG; any other refusal at
// WARN.
func (i *Interceptor) setMetadata(ctx context.Context, what string, header, trailer metadata.MD) {
	err := errors.Join(grpc.SetHeader(ctx, header), grpc.SetTrailer(ctx, trailer))
	switch {
	case err == nil:
	case ctx.Err() != nil:
		i.logger.DebugContext(ctx, "idemgrpc: "+what+" metadata not set: the client went away", "err", err, "cause", context.Cause(ctx))
	default:
		i.logger.WarnContext(ctx, "idemgrpc: "+what+" metadata could not be set", "err", err)
	}
}

// keep adds md's allow-listed names to h under prefix; -bin values are
// base64 (the store keeps text).
func (i *Interceptor) keep(h map[string][]string, prefix string, md metadata.MD) {
	for name, values := range md {
		if !i.replayNames[name] {
			continue
		}
		if strings.HasSuffix(name, "-bin") {
			enc := make([]string, len(values))
			for j, v := range values {
				enc[j] = base64.StdEncoding.EncodeToString([]byte(v))
			}
			values = enc
		}
		h[prefix+name] = append([]string(nil), values...)
	}
}

// replay answers a call from its record.
func (i *Interceptor) replay(ctx context.Context, fullMethod string, res idem.Result) (any, error) {
	if _, ok := res.Header[fieldNotStored]; ok {
		return nil, answer(ctx, idem.ErrResponseNotStored)
	}
	code, err := strconv.Atoi(first(res.Header[fieldCode]))
	var msg any
	var st *status.Status
	switch {
	case err != nil:
		err = fmt.Errorf("idemgrpc: the record holds no gRPC code (%q): is it another adapter's?", first(res.Header[fieldCode]))
	case codes.Code(code) == codes.OK:
		msg, err = i.opts.codec.Unmarshal(first(res.Header[fieldType]), res.Body)
	default:
		var p spb.Status
		if err = proto.Unmarshal(res.Body, &p); err == nil {
			st = status.FromProto(&p)
		}
	}
	if err != nil {
		i.logger.ErrorContext(ctx, "idemgrpc: a SUCCEEDED record cannot be replayed; answering Internal, it is not run again",
			"method", fullMethod, "err", err)
		return nil, answer(ctx, idem.ErrResponseMissing)
	}
	header, trailer := metadata.MD{}, metadata.MD{}
	for name, values := range res.Header {
		md, n := header, strings.TrimPrefix(name, headerPrefix)
		if n == name {
			md, n = trailer, strings.TrimPrefix(name, trailerPrefix)
		}
		if n == name {
			continue // idemgrpc's own fields
		}
		if strings.HasSuffix(n, "-bin") {
			for _, v := range values {
				b, err := base64.StdEncoding.DecodeString(v)
				if err == nil {
					md.Append(n, string(b))
				}
			}
			continue
		}
		md.Append(n, values...)
	}
	header.Set(MetadataReplayed, "true")
	i.setMetadata(ctx, "the replay's", header, trailer)
	if st != nil {
		return nil, st.Err()
	}
	return msg, nil
}

func first(values []string) string {
	if len(values) == 0 {
		return ""
	}
	return values[0]
}

// heldStream holds the metadata the handler sets until the outcome is
// decided: recorded (the allow-listed names) and sent with the handler's
// answer, or dropped when idem answers instead.
type heldStream struct {
	grpc.ServerTransportStream // the call's, for Method
	mu                         sync.Mutex
	header, trailer            metadata.MD
}

// SetHeader holds md for the header.
func (s *heldStream) SetHeader(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.header = metadata.Join(s.header, md)
	return nil
}

// SendHeader holds md for the header, sent with the answer: nothing reaches
// the client before the outcome is decided.
func (s *heldStream) SendHeader(md metadata.MD) error { return s.SetHeader(md) }

// SetTrailer holds md for the trailer.
func (s *heldStream) SetTrailer(md metadata.MD) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trailer = metadata.Join(s.trailer, md)
	return nil
}

// held returns copies of the header and trailer held.
func (s *heldStream) held() (header, trailer metadata.MD) {
	if s == nil {
		return nil, nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.header.Copy(), s.trailer.Copy()
}
