package main

import (
	"context"
	"database/sql"
	"log"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/idemsqlite"
)

// The README's Engine.Do: one JetStream message processed under idem's
// claim, its effect written in the claim's transaction. handle (main.go)
// is the same with the acks and the answer to each error. (Compiled, not
// run: it needs a message.)
func Example_engineDo() {
	ctx := context.Background()
	store, err := idemsqlite.Open(ctx, "consumer.db")
	if err != nil {
		log.Fatal(err)
	}
	var msg jetstream.Msg // one message of jetstream.Consumer.Consume
	msgID := key(msg)

	engine, _ := idem.NewEngineWith(store, idem.EngineOptions{})
	res, err := engine.Do(ctx, idem.DoParams{Scope: "orders", Key: msgID, Payload: msg.Data()},
		func(ctx context.Context) (idem.Result, error) {
			tx, _ := idem.Tx[*sql.Tx](ctx) // the claim's transaction, as in the middleware
			_, err := tx.ExecContext(ctx, "INSERT INTO effects ...")
			return idem.Result{Body: []byte("ok")}, err // an error: recorded FAILED, runs again
		})
	// errors.Is(err, idem.ErrInFlight): another worker runs it; a replay returns the first res

	log.Println(string(res.Body), err)
}
