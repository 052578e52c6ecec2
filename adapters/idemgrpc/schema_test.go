package idemgrpc_test

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/descriptorpb"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/emptypb"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/adapters/idemgrpc"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/internal/adaptertest"
	"github.com/idemgo/idem/seal"
)

// chargeRequest is payments.v1.ChargeRequest as one release of the schema
// declares it: request_id = 1 (AIP-155), amount = 2, currency = 3, and,
// from release 2 on, memo = 4. No protoc: the descriptor is built here.
func chargeRequest(t *testing.T, release int) protoreflect.MessageDescriptor {
	t.Helper()
	field := func(name string, n int32, typ descriptorpb.FieldDescriptorProto_Type) *descriptorpb.FieldDescriptorProto {
		return &descriptorpb.FieldDescriptorProto{Name: proto.String(name), Number: proto.Int32(n), Type: typ.Enum(),
			Label: descriptorpb.FieldDescriptorProto_LABEL_OPTIONAL.Enum()}
	}
	fields := []*descriptorpb.FieldDescriptorProto{
		field("request_id", 1, descriptorpb.FieldDescriptorProto_TYPE_STRING),
		field("amount", 2, descriptorpb.FieldDescriptorProto_TYPE_INT64),
		field("currency", 3, descriptorpb.FieldDescriptorProto_TYPE_STRING),
	}
	if release >= 2 {
		fields = append(fields, field("memo", 4, descriptorpb.FieldDescriptorProto_TYPE_STRING))
	}
	fd, err := protodesc.NewFile(&descriptorpb.FileDescriptorProto{
		Name: proto.String("payments/v1/charge.proto"), Package: proto.String("payments.v1"), Syntax: proto.String("proto3"),
		MessageType: []*descriptorpb.DescriptorProto{{Name: proto.String("ChargeRequest"), Field: fields}},
	}, nil)
	require.NoError(t, err)
	return fd.Messages().ByName("ChargeRequest")
}

// newCharge returns a ChargeRequest of md with the fields set.
func newCharge(md protoreflect.MessageDescriptor, fields map[protoreflect.Name]any) *dynamicpb.Message {
	m := dynamicpb.NewMessage(md)
	for name, v := range fields {
		m.Set(md.Fields().ByName(name), protoreflect.ValueOf(v))
	}
	return m
}

// servedRelease serves the service with release's ChargeRequest on store.
func servedRelease(t *testing.T, store idem.Store, release int, opts ...idemgrpc.Option) *service {
	t.Helper()
	md := chargeRequest(t, release)
	s := &service{newRequest: func() proto.Message { return dynamicpb.NewMessage(md) }}
	return s.serve(t, store, idem.EngineOptions{}, opts...)
}

func TestSchemaChange(t *testing.T) {
	onStores(t, func(t *testing.T, newStore func(*testing.T) idem.Store) {
		store := newStore(t)
		// Release 1 is serving; release 2, whose ChargeRequest has a
		// field more (memo), is deployed beside it on the same store:
		// a retry may reach either.
		v1, v2 := servedRelease(t, store, 1), servedRelease(t, store, 2)
		ctx := context.Background()
		old := chargeRequest(t, 1) // a client that was not rebuilt
		req := newCharge(old, map[protoreflect.Name]any{"amount": int64(1000), "currency": "EUR"})

		first := v1.call(ctx, charge, "deploy", 0, req)
		require.NoError(t, first.err)
		retry := v2.call(ctx, charge, "deploy", 0, req)
		require.NoError(t, retry.err, "the retry on the new release is the same request")
		require.True(t, retry.replayed)
		require.Equal(t, first.raw, retry.raw)
		require.EqualValues(t, 1, v1.runs.Load())
		require.Zero(t, v2.runs.Load())

		// The same fields in another order on the wire: the same
		// request (the canonical form, not the bytes, is hashed).
		reordered := &emptypb.Empty{}
		var b []byte
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendString(b, "EUR")
		b = protowire.AppendTag(b, 2, protowire.VarintType)
		b = protowire.AppendVarint(b, 1000)
		reordered.ProtoReflect().SetUnknown(b)
		again := v2.call(ctx, charge, "deploy", 0, reordered)
		require.NoError(t, again.err)
		require.True(t, again.replayed)

		// Another amount under the key, on either release: key reused.
		other := newCharge(old, map[protoreflect.Name]any{"amount": int64(999), "currency": "EUR"})
		requireCode(t, v2.call(ctx, charge, "deploy", 0, other), codes.FailedPrecondition)
		requireCode(t, v1.call(ctx, charge, "deploy", 0, other), codes.FailedPrecondition)

		// What the documentation says changes the fingerprint: a field
		// the client sets before the server's schema knows it (release
		// 1 ignores memo, release 2 hashes it).
		memo := newCharge(chargeRequest(t, 2), map[protoreflect.Name]any{"amount": int64(1000), "currency": "EUR", "memo": "rent"})
		require.NoError(t, v1.call(ctx, charge, "memo", 0, memo).err)
		requireCode(t, v2.call(ctx, charge, "memo", 0, memo), codes.FailedPrecondition)
		require.EqualValues(t, 2, v1.runs.Load())
		require.Zero(t, v2.runs.Load())
	})
}

func TestKeyField(t *testing.T) {
	t.Parallel()
	// AIP-155: the key is the request's request_id; without it, the
	// metadata's; both, different: InvalidArgument.
	s := servedRelease(t, adaptertest.SQLite(t), 1, idemgrpc.WithKeyField("request_id"))
	md := chargeRequest(t, 1)
	ctx := context.Background()
	req := newCharge(md, map[protoreflect.Name]any{"request_id": "7f8d1c52-5d0b-4a8e-9d7e-0d6f0c1b2a3c", "amount": int64(1000)})
	first := s.call(ctx, charge, "", 0, req)
	require.NoError(t, first.err)
	replay := s.call(ctx, charge, "", 0, req)
	require.NoError(t, replay.err)
	require.True(t, replay.replayed)
	// The same key in the metadata too: the same call.
	require.True(t, s.call(ctx, charge, "7f8d1c52-5d0b-4a8e-9d7e-0d6f0c1b2a3c", 0, req).replayed)
	r := s.call(ctx, charge, "another-key", 0, req)
	st := requireCode(t, r, codes.InvalidArgument)
	require.Equal(t, "INVALID_KEY", r.reason)
	require.Contains(t, st.Message(), "request_id and the idempotency-key metadata name different keys", "the real reason")
	// No request_id: the metadata's key.
	plain := newCharge(md, map[protoreflect.Name]any{"amount": int64(1000)})
	require.NoError(t, s.call(ctx, charge, "meta-key", 0, plain).err)
	require.True(t, s.call(metadata.NewOutgoingContext(ctx, nil), charge, "meta-key", 0, plain).replayed)
	st = requireCode(t, s.call(ctx, charge, "", 0, plain), codes.InvalidArgument)
	require.Contains(t, st.Message(), "the request's request_id field", "the configured key field named")
	require.EqualValues(t, 2, s.runs.Load())
}

// keyedRecords returns the records of store by the key as stored.
func keyedRecords(t *testing.T, store idem.Store) map[string]idemdriver.Record {
	t.Helper()
	recs, err := store.(idemdriver.Lister).List(context.Background(), idemdriver.ListParams{Limit: 100})
	require.NoError(t, err)
	byKey := map[string]idemdriver.Record{}
	for _, r := range recs {
		byKey[r.Key] = r
	}
	return byKey
}

// With WithKeyField and KeyHashSecret, the stored record shows no client
// key: the key field is cleared before the fingerprint and the kept request
// (docs/sealing.md: idem_keys shows no client key).
func TestKeyFieldNotStored(t *testing.T) {
	onStores(t, func(t *testing.T, newStore func(*testing.T) idem.Store) {
		store := newStore(t)
		md := chargeRequest(t, 1)
		s := &service{newRequest: func() proto.Message { return dynamicpb.NewMessage(md) }}
		secret := bytes.Repeat([]byte{9}, 32)
		s.serve(t, store, idem.EngineOptions{Sealing: idem.SealingOptions{KeyHashSecret: secret, KeepRequestBytes: 4096}}, idemgrpc.WithKeyField("request_id"))
		ctx := context.Background()
		keys := []string{"secret-order-42", "secret-order-43"}
		for _, k := range keys {
			req := newCharge(md, map[protoreflect.Name]any{"request_id": k, "amount": int64(1000), "currency": "EUR"})
			require.NoError(t, s.call(ctx, charge, "", 0, req).err)
		}
		recs := keyedRecords(t, store)
		require.Len(t, recs, 2)
		var prints [][]byte
		for _, k := range keys {
			rec, ok := recs[seal.HashKey(secret, k)]
			require.True(t, ok, "the record of %s under its hashed key", k)
			require.NotNil(t, rec.Response)
			require.NotEmpty(t, rec.Response.Request, "the request is kept")
			for _, stored := range []string{rec.Key, string(rec.Response.Request), string(rec.Fingerprint)} {
				require.NotContains(t, stored, "secret-order")
			}
			kept, err := seal.DecodeRequest(rec.Response.Request)
			require.NoError(t, err)
			require.JSONEq(t, `{"amount":"1000","currency":"EUR"}`, string(kept.Body))
			prints = append(prints, rec.Fingerprint)
		}
		require.Equal(t, prints[0], prints[1], "the fingerprint does not depend on the key")
		require.EqualValues(t, 2, s.runs.Load())
	})
}

// With WithKeyField, a retry that moves the key between request_id and the
// metadata, either way, is the same call: the replay, one run.
func TestKeyFieldMovesToMetadata(t *testing.T) {
	onStores(t, func(t *testing.T, newStore func(*testing.T) idem.Store) {
		s := servedRelease(t, newStore(t), 1, idemgrpc.WithKeyField("request_id"))
		md := chargeRequest(t, 1)
		ctx := context.Background()
		inField := func(key string) proto.Message {
			return newCharge(md, map[protoreflect.Name]any{"request_id": key, "amount": int64(1000)})
		}
		plain := newCharge(md, map[protoreflect.Name]any{"amount": int64(1000)})

		// request_id first, then the metadata.
		first := s.call(ctx, charge, "", 0, inField("field-first"))
		require.NoError(t, first.err)
		retry := s.call(ctx, charge, "field-first", 0, plain)
		require.NoError(t, retry.err)
		require.True(t, retry.replayed)
		require.Equal(t, first.raw, retry.raw)

		// The metadata first, then request_id.
		first = s.call(ctx, charge, "meta-first", 0, plain)
		require.NoError(t, first.err)
		retry = s.call(ctx, charge, "", 0, inField("meta-first"))
		require.NoError(t, retry.err)
		require.True(t, retry.replayed)
		require.Equal(t, first.raw, retry.raw)

		require.EqualValues(t, 2, s.runs.Load())
	})
}
