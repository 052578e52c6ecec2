// Command natsconsumer is an example consumer of NATS JetStream that
// processes each message exactly once with idem's engine (idem.Engine.Do):
// the scope is the stream and subject, the key made from the message's
// Nats-Msg-Id header (or the "id" member of its JSON payload; see key), the
// route (Event.Route,
// a metric attribute) the consumer's subject filter, one value whatever the
// subjects, and the side effect (a
// row in the effects table) is written in the claim's transaction, so it
// commits with the recorded outcome or not at all. A message is acked only
// after its outcome is recorded; a redelivery (AckWait ran out, the process
// was killed, a duplicate publish) replays the recorded outcome and is
// acked without running again. A message whose key another execution holds
// is nacked with the in-flight delay; one whose owner died is taken over
// once its lease runs out.
//
// Configuration, by environment: NATS_URL (default nats://127.0.0.1:4222),
// STREAM, SUBJECT (the stream's subject, default "<STREAM>.>"), DURABLE
// (default "natsconsumer"), DB (the SQLite file of idem and the effects),
// ACK_WAIT (default 2s), WORK (how long each message's work takes, default
// 0: to widen the window a SIGKILL can hit).
package main

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "natsconsumer:", err)
		os.Exit(1)
	}
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func duration(name, def string) (time.Duration, error) {
	d, err := time.ParseDuration(env(name, def))
	if err != nil {
		return 0, fmt.Errorf("%s: %w", name, err)
	}
	return d, nil
}

// schema is the example's business table: one row per side effect.
const schema = `CREATE TABLE IF NOT EXISTS effects (
	msg_id TEXT NOT NULL, subject TEXT NOT NULL, payload BLOB, pid INTEGER NOT NULL)`

// run consumes until SIGINT or SIGTERM; an error closing the database is
// joined to what it returns.
func run() (err error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	stream := env("STREAM", "")
	dbPath := env("DB", "")
	if stream == "" || dbPath == "" {
		return errors.New("STREAM and DB are required")
	}
	ackWait, err := duration("ACK_WAIT", "2s")
	if err != nil {
		return err
	}
	work, err := duration("WORK", "0s")
	if err != nil {
		return err
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))

	store, err := idemsqlite.Open(ctx, dbPath)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, store.Close()) }()
	if err := store.Migrate(ctx); err != nil {
		return err
	}
	if _, err := store.DB().ExecContext(ctx, schema); err != nil {
		return err
	}
	cc, err := start(ctx, consumerConfig{
		natsURL: env("NATS_URL", nats.DefaultURL), stream: stream, subject: env("SUBJECT", stream+".>"),
		durable: env("DURABLE", "natsconsumer"), ackWait: ackWait, work: work,
	}, store, nil, log)
	if err != nil {
		return err
	}
	defer cc.stop()
	log.Info("consuming", "stream", stream, "pid", os.Getpid())
	<-ctx.Done()
	return nil
}

// consumerConfig is what start needs, read from the environment by run.
type consumerConfig struct {
	natsURL, stream, subject, durable string
	ackWait, work                     time.Duration
}

// consuming is a running consumer; stop ends it.
type consuming struct {
	nc *nats.Conn
	cc jetstream.ConsumeContext
}

func (c *consuming) stop() {
	c.cc.Stop()
	c.nc.Close()
}

// start connects to NATS, creates (or updates) the stream on c.subject and
// the durable consumer, and consumes with idem's engine on store; observer,
// when not nil, is the engine's Observer.
func start(ctx context.Context, c consumerConfig, store *idemsqlite.Driver, observer idem.Observer, log *slog.Logger) (*consuming, error) {
	engine, err := idem.NewEngineWith(store, idem.EngineOptions{Lease: idem.LeaseOptions{Duration: time.Second}, Logger: log, Observer: observer})
	if err != nil {
		return nil, err
	}
	nc, err := nats.Connect(c.natsURL)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (*consuming, error) { nc.Close(); return nil, err }
	js, err := jetstream.New(nc)
	if err != nil {
		return fail(err)
	}
	s, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: c.stream, Subjects: []string{c.subject}})
	if err != nil {
		return fail(err)
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: c.durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: c.ackWait,
	})
	if err != nil {
		return fail(err)
	}
	h := &handler{engine: engine, stream: c.stream, route: c.subject, work: c.work, log: log}
	cc, err := cons.Consume(func(msg jetstream.Msg) { h.handle(ctx, msg) })
	if err != nil {
		return fail(err)
	}
	return &consuming{nc: nc, cc: cc}, nil
}

type handler struct {
	engine *idem.Engine
	stream string
	// route is DoParams.Route for every message: the subject filter the
	// consumer was configured with ("ORDERS.>"), a bounded set of values,
	// never the message's subject ("ORDERS.cust-1", one series per
	// customer in every metric labelled by route). The subject stays in the
	// scope, which is not a metric attribute.
	route string
	work  time.Duration
	log   *slog.Logger
}

// key is the message's idempotency key, from its id: its Nats-Msg-Id
// header, else the "id" member of its JSON payload (the two name one
// message: a producer sets either). An id is kept readable, "id:<id>",
// when it can be, and hashed, "id#<hex SHA-256>", when it cannot (longer
// than idem.MaxKeyLength less its prefix, or with a space, a comma, a
// leading quote or a byte outside visible ASCII): JetStream takes any id,
// and such a message must not be lost for its id's shape. A message with
// no id is its own: "seq:<stream sequence>:<publish time>", stable across
// redeliveries and unique across a stream deleted and made again. The
// prefixes keep the three kinds apart: no id can be taken for another's
// key.
func key(msg jetstream.Msg) string {
	id := msg.Headers().Get(jetstream.MsgIDHeader)
	if id == "" {
		var body struct {
			ID json.RawMessage `json:"id"`
		}
		_ = json.Unmarshal(msg.Data(), &body)
		if err := json.Unmarshal(body.ID, &id); err != nil && len(body.ID) > 0 && string(body.ID) != "null" {
			id = string(body.ID) // a number, as written: {"id":42} is "42"
		}
	}
	switch {
	case id == "":
		if meta, err := msg.Metadata(); err == nil {
			return fmt.Sprintf("seq:%d:%d", meta.Sequence.Stream, meta.Timestamp.UnixNano())
		}
		return "" // not a JetStream message: Do refuses it (ErrInvalidKey)
	case len(id) <= idem.MaxKeyLength-len("id:") && visibleASCII(id):
		return "id:" + id
	}
	sum := sha256.Sum256([]byte(id))
	return "id#" + hex.EncodeToString(sum[:])
}

// visibleASCII reports whether s is visible ASCII without a ',': what an
// Idempotency-Key holds after its prefix.
func visibleASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < 0x21 || s[i] > 0x7e || s[i] == ',' {
			return false
		}
	}
	return true
}

func (h *handler) handle(ctx context.Context, msg jetstream.Msg) {
	k := key(msg)
	p := idem.DoParams{Scope: h.stream + "/" + msg.Subject(), Key: k, Route: h.route, Payload: msg.Data()}
	_, err := h.engine.Do(ctx, p, func(ctx context.Context) (idem.Result, error) {
		tx, err := idem.Tx[*sql.Tx](ctx)
		if err != nil {
			return idem.Result{}, err
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO effects (msg_id, subject, payload, pid) VALUES (?, ?, ?, ?)`,
			k, msg.Subject(), msg.Data(), os.Getpid()); err != nil {
			return idem.Result{}, err
		}
		if h.work > 0 {
			select { // the work: a SIGKILL here leaves the claim PROCESSING
			case <-time.After(h.work):
			case <-ctx.Done():
				return idem.Result{}, context.Cause(ctx)
			}
		}
		return idem.Result{Body: []byte("processed")}, nil
	})
	var inFlight *idem.InFlightError
	switch {
	case err == nil:
		// Recorded (or replayed): ack only now.
		if err := msg.DoubleAck(ctx); err != nil {
			h.log.Warn("ack", "key", k, "err", err)
		}
	case errors.As(err, &inFlight):
		_ = msg.NakWithDelay(inFlight.RetryAfter)
	case errors.Is(err, idem.ErrResponseNotStored):
		// Done: its outcome was recorded, too large to keep.
		if err := msg.DoubleAck(ctx); err != nil {
			h.log.Warn("ack", "key", k, "err", err)
		}
	case errors.Is(err, idem.ErrKeyReused):
		// Another payload under this id: a producer's bug no retry cures.
		h.log.Error("refusing message", "key", k, "err", err)
		_ = msg.Term()
	case errors.Is(err, idem.ErrOutcomeUnknown), errors.Is(err, idem.ErrRecordDamaged),
		errors.Is(err, idem.ErrSealKeyMissing), errors.Is(err, idem.ErrSealBroken):
		// Held for an operator (idem resolve, a sealing key): kept, and
		// redelivered slowly, so that it runs once resolved.
		h.log.Error("held for an operator; redelivering slowly", "key", k, "err", err)
		_ = msg.NakWithDelay(time.Minute)
	default:
		h.log.Warn("not processed; redelivering", "key", k, "err", err)
		_ = msg.Nak()
	}
}
