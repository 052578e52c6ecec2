package idempgx

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgxlisten"

	"github.com/idemgo/idem/idemdriver"
)

var _ idemdriver.Notifier = (*Driver)(nil)

// NotifyChannel is the channel of the notifications the fenced writes send
// when idemdriver.FenceParams.Notify is set (idem.EngineOptions.Waiting.Wait): NOTIFY
// in the writing transaction, delivered to every LISTEN at its commit.
const NotifyChannel = "idem_keys"

// notifyReturning makes a fenced write notify once per row it writes
// (none when fenced out), so the statement count is unchanged;
// notifyMarkedReturning only when the row it writes is marked waited
// (MarkWaited). A transaction that queued no notification commits without
// the lock that serialises the commits of those that did. The channel is a
// parameter, not a literal: Options.Schema qualifies every idem_keys in a
// statement's text (Driver.q), which made a literal channel
// 'schema.idem_keys', where nobody listens.
const (
	notifyExpr            = `pg_notify(@channel, @notify)`
	notifyMarkedExpr      = `CASE WHEN waited THEN pg_notify(@channel, @notify)::text END`
	notifyReturning       = ` RETURNING ` + notifyExpr
	notifyMarkedReturning = ` RETURNING ` + notifyMarkedExpr
)

// notifyStatements are a fenced write's statements: plain, notifying, and
// notifying when marked.
type notifyStatements struct{ plain, notify, marked string }

// withNotify binds a fenced write whose params are params, "channel" and
// "notify".
func withNotify(params []string, query string) string {
	return bind(slices.Concat(params, []string{"channel", "notify"}), query)
}

var failParams = slices.Concat(fenceParams, []string{"offset"})

var (
	completeStatements = notifyStatements{completeSQL,
		withNotify(completeParams, completeUpdate+notifyReturning), withNotify(completeParams, completeUpdate+notifyMarkedReturning)}
	completeOrRaiseStatements = notifyStatements{completeOrRaiseSQL,
		withNotify(completeParams, completeOrRaise(notifyReturning)), withNotify(completeParams, completeOrRaise(notifyMarkedReturning))}
	failStatements = notifyStatements{failSQL,
		withNotify(failParams, failUpdate+notifyReturning), withNotify(failParams, failUpdate+notifyMarkedReturning)}
	releaseStatements = notifyStatements{releaseSQL,
		withNotify(fenceParams, releaseDelete+notifyReturning), withNotify(fenceParams, releaseDelete+notifyMarkedReturning)}
	// releasePartStatements are releaseStatements on the partitioned table,
	// which delete the life's steps too (withStepsGone).
	releasePartStatements = notifyStatements{bind(fenceParams, withStepsGone(releaseDelete, "")),
		withNotify(fenceParams, withStepsGone(releaseDelete, ", "+notifyExpr)),
		withNotify(fenceParams, withStepsGone(releaseDelete, ", "+notifyMarkedExpr))}
)

// notifying returns the statement of s that p asks for (none, every time,
// or when marked), with the channel and p.Notify added to args when it
// notifies.
func notifying(p idemdriver.FenceParams, s notifyStatements, args []any) (string, []any) {
	switch {
	case p.Notify == "":
		return s.plain, args
	case p.NotifyMarked:
		return s.marked, append(args, NotifyChannel, p.Notify)
	}
	return s.notify, append(args, NotifyChannel, p.Notify)
}

var _ idemdriver.WaitMarker = (*Driver)(nil)

// markWaitedSQL marks the record waited when it is still the execution
// named, PROCESSING, and its row is not locked (SKIP LOCKED: a waiter never
// waits for the owner's write); it counts the rows found, marked now or
// before.
var markWaitedSQL = bind(fenceParams, `WITH target AS (
	SELECT scope, key, waited FROM idem_keys`+fenced+`
	FOR NO KEY UPDATE SKIP LOCKED),
marked AS (
	UPDATE idem_keys k SET waited = true FROM target t
	WHERE k.scope = t.scope AND k.key = t.key AND NOT t.waited)
SELECT count(*) FROM target`)

// MarkWaited implements idemdriver.WaitMarker: one statement, which skips a
// row locked by a write in progress rather than wait for it.
func (d *Driver) MarkWaited(ctx context.Context, p idemdriver.FenceParams) (bool, error) {
	if err := fenceTextable(p); err != nil {
		return false, err
	}
	var n int
	if err := d.pool.QueryRow(ctx, d.q(markWaitedSQL), fenceArgs(p)...).Scan(&n); err != nil {
		return false, unstorable(err)
	}
	return n == 1, nil
}

// Notifies implements idemdriver.Notifier: true unless the driver was made
// with Options.TransactionPooler and no Options.ListenConfig (LISTEN needs
// a server connection of its own; a transaction pooler lends one per
// transaction).
func (d *Driver) Notifies() bool { return d.listenConfig() != nil }

func (d *Driver) listenConfig() *pgx.ConnConfig {
	switch {
	case d.listen != nil:
		return d.listen
	case d.pooled:
		return nil
	}
	return d.pool.Config().ConnConfig
}

// listenRetry is how long Listen waits before it reconnects.
const listenRetry = time.Second

// Listen implements idemdriver.Notifier with pgxlisten: LISTEN idem_keys on
// a connection of its own (Options.ListenConfig, else the pool's
// configuration), outside the pool, reconnecting a second after it is lost.
func (d *Driver) Listen(ctx context.Context, listening func(bool), deliver func(payload string)) error {
	cfg := d.listenConfig()
	if cfg == nil {
		return errNoListen
	}
	l := &pgxlisten.Listener{
		Connect: func(ctx context.Context) (*pgx.Conn, error) {
			return pgx.ConnectConfig(ctx, cfg.Copy())
		},
		LogError:       func(context.Context, error) { listening(false) },
		ReconnectDelay: listenRetry,
	}
	l.Handle(NotifyChannel, listenHandler{listening: listening, deliver: deliver})
	err := l.Listen(ctx)
	listening(false)
	return err
}

type listenHandler struct {
	listening func(bool)
	deliver   func(string)
}

func (h listenHandler) HandleNotification(_ context.Context, n *pgconn.Notification, _ *pgx.Conn) error {
	h.deliver(n.Payload)
	return nil
}

// HandleBacklog is called once LISTEN holds, after each (re)connection.
func (h listenHandler) HandleBacklog(context.Context, string, *pgx.Conn) error {
	h.listening(true)
	return nil
}

var errNoListen = errors.New("idempgx: no connection to LISTEN on: behind a transaction pooler, set Options.ListenConfig")
