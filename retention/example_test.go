package retention_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/idemgo/idem"
	"github.com/idemgo/idem/internal/dbtest"
	"github.com/idemgo/idem/retention"
)

// A Maintainer purges expired records in the background, in batches, in the
// one process of many that holds the store's maintenance lock. Here the
// maintainer looks at the store a day later (ClockOffset, a test knob), when
// the first request's key has expired.
func ExampleMaintainer() {
	store, done := dbtest.ExampleStore() // SQLite in a temporary directory; see idemsqlite.ExampleOpen
	defer done()
	mw, _ := idem.NewMiddleware(store, idem.Options{Scope: idem.SingleTenant}) // Retention: 24 h
	srv := httptest.NewServer(mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	})))
	defer srv.Close()
	req, _ := http.NewRequest(http.MethodPost, srv.URL, strings.NewReader(`{}`))
	req.Header.Set("Idempotency-Key", "order-1001")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		log.Fatal(err)
	}
	if err := resp.Body.Close(); err != nil {
		log.Fatal(err)
	}

	cycles := make(chan retention.Cycle, 1)
	m, err := retention.NewMaintainer(store, retention.Config{
		Interval:    time.Minute,
		ClockOffset: 25 * time.Hour, // a day later
		OnCycle: func(c retention.Cycle) {
			select {
			case cycles <- c:
			default:
			}
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(context.Background()); err != nil {
		log.Fatal(err)
	}
	c := <-cycles // the first cycle starts at once
	m.Stop()
	fmt.Printf("leader=%v purged=%d batches=%d err=%v\n", c.Leader, c.Purged, c.Batches, c.Err)
	// Output: leader=true purged=1 batches=1 err=<nil>
}

// docs/retention.md's maintainer, its cycles counted in a metric. (Compiled,
// not run: ExampleMaintainer runs one.)
func ExampleNewMaintainer() {
	store, done := dbtest.ExampleStore()
	defer done()
	ctx := context.Background()
	var purged interface{ Add(float64) } // a prometheus.Counter

	m, err := retention.NewMaintainer(store, retention.Config{
		Interval: time.Minute, // default
		Batch:    1000,        // default: rows per DELETE
		OnCycle:  func(c retention.Cycle) { purged.Add(float64(c.Purged)) },
	})
	if err != nil {
		log.Fatal(err)
	}
	if err := m.Start(ctx); err != nil {
		log.Fatal(err)
	}
	defer m.Stop()
}
