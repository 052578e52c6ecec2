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
// (none when fenced out), so the statement count is unchanged.
const notifyReturning = ` RETURNING pg_notify('` + NotifyChannel + `', @notify)`

var (
	completeNotifySQL        = bind(slices.Concat(completeParams, []string{"notify"}), completeUpdate+notifyReturning)
	completeOrRaiseNotifySQL = bind(slices.Concat(completeParams, []string{"notify"}), completeOrRaise(notifyReturning))
	failNotifySQL            = bind(slices.Concat(fenceParams, []string{"offset", "notify"}), failUpdate+notifyReturning)
	releaseNotifySQL         = bind(slices.Concat(fenceParams, []string{"notify"}), releaseDelete+notifyReturning)
)

// notifying returns plain, or notify with p.Notify added to args, when the
// write must notify.
func notifying(p idemdriver.FenceParams, plain, notify string, args []any) (string, []any) {
	if p.Notify == "" {
		return plain, args
	}
	return notify, append(args, p.Notify)
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
