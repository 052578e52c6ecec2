package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestKillNineStream sends 100 logical payments (two merchants, eight
// concurrent clients, each payment retried with its key until it succeeds)
// while paymentsd is killed with SIGKILL at random moments and restarted on
// the same address and database, and also kills itself now and then right
// after a charge (--crash-after-charge 0.03). The provider fails some
// charges (--fail-rate) and withholds some answers past paymentsd's timeout
// (--timeout-rate). At the end every logical payment exists exactly once:
// in /v1/payments, in the ledger, and at the provider; none is lost, none
// doubled.
func TestKillNineStream(t *testing.T) {
	t.Parallel()
	forEachTarget(t, func(t *testing.T, tgt target) {
		const (
			payments = 100
			clients  = 8
			maxKills = 8
		)
		merchants := []string{"acme", "globex"}
		w := newWorld(t, tgt, "--latency", "30ms", "--fail-rate", "0.05", "--timeout-rate", "0.03", "--hang", "10m")
		db := tgt.newDB(t)
		ins := inspect(t, db)
		args := w.paymentsdArgs(db, "--lease", "2s", "--psp-timeout", "1s", "--crash-after-charge", "0.03")
		pd := startProc(t, "paymentsd", w.paymentsdBin, args, "PAYMENTSD_RELAY_SECRET="+relaySecret)

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		start := time.Now()

		// chaos restarts paymentsd whenever it dies, and kills it with
		// SIGKILL at random intervals, at most maxKills times. It stops when
		// the clients are done.
		clientsDone := make(chan struct{})
		var kills, restarts int
		var chaosErr error
		chaosDone := make(chan struct{})
		go func() {
			defer close(chaosDone)
			defer func() {
				if chaosErr != nil {
					cancel() // the clients stop; the test fails below
				}
			}()
			for {
				next := time.After(time.Duration(200+rand.IntN(1000)) * time.Millisecond)
				select {
				case <-clientsDone:
					return
				case <-pd.exitedChan():
				case <-next:
					if kills >= maxKills {
						continue
					}
					kills++
					if !pd.kill9() {
						chaosErr = fmt.Errorf("paymentsd did not die of SIGKILL")
						return
					}
				}
				restarts++
				if restarts > 40 {
					args = w.paymentsdArgs(db, "--lease", "2s", "--psp-timeout", "1s") // enough crashing: bound the run
				}
				if chaosErr = pd.tryRestart(args...); chaosErr != nil {
					return
				}
			}
		}()

		type outcome struct {
			merchant, key string
			amount        int64
			attempts      []attempt
			err           error
		}
		outcomes := make([]outcome, payments)
		jobs := make(chan int)
		var wg sync.WaitGroup
		for range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range jobs {
					o := outcome{merchant: merchants[i%len(merchants)], key: fmt.Sprintf("stream-%03d", i), amount: int64(100 + i)}
					o.attempts, o.err = payUntilDone(ctx, pd.url(), o.merchant, o.key, body(o.amount))
					outcomes[i] = o
				}
			}()
		}
		for i := range payments {
			jobs <- i
		}
		close(jobs)
		wg.Wait()
		close(clientsDone)
		<-chaosDone
		elapsed := time.Since(start)
		require.NoError(t, chaosErr)

		var noAnswer, inFlight, failed, total int
		created := map[string]payment{} // payment id -> payment, from the 201s
		for _, o := range outcomes {
			require.NoError(t, o.err)
			total += len(o.attempts)
			for _, a := range o.attempts {
				switch {
				case a.err != nil:
					noAnswer++
				case a.resp.status == http.StatusConflict:
					inFlight++
				case a.resp.status >= 500:
					failed++
				}
			}
			last := o.attempts[len(o.attempts)-1].resp
			var p payment
			require.NoError(t, json.Unmarshal(last.body, &p))
			require.Equal(t, o.amount, p.Amount)
			_, dup := created[p.ID]
			require.False(t, dup, "two logical payments got the same payment %s", p.ID)
			created[p.ID] = p

			// The key's recorded answer is the one its client got.
			again, err := pay(context.Background(), pd.url(), o.merchant, o.key, body(o.amount))
			require.NoError(t, err)
			require.True(t, again.replayed(), "%s", again)
			require.Equal(t, last.body, again.body)
		}
		crashes := pd.logged("fault injected: crashing now (SIGKILL)")
		// Executions that reached the provider after it had charged the key
		// (after a crash, a kill or a timeout in the window between the
		// charge and the commit), answered with the original charge.
		providerReplays := w.psp.logged("request", "method", "POST", "path", "/v1/charges", "replayed", true) // may lag a little; for the record only
		t.Logf("%d payments in %s: %d attempts (%d without an answer, %d 409, %d 5xx); %d SIGKILLs, %d self-crashes after a charge, %d restarts; the provider replayed %d charges",
			payments, elapsed.Round(time.Millisecond), total, noAnswer, inFlight, failed, kills, crashes, restarts, providerReplays)
		require.Positive(t, kills)
		slowest := outcomes[0]
		for _, o := range outcomes {
			if o.attempts[len(o.attempts)-1].at.After(slowest.attempts[len(slowest.attempts)-1].at) {
				slowest = o
			}
		}
		t.Logf("the last payment to succeed, %s/%s, took %d attempts", slowest.merchant, slowest.key, len(slowest.attempts))
		if len(slowest.attempts) > 20 {
			for _, a := range slowest.attempts {
				t.Logf("  %s", a)
			}
		}

		// Every logical payment exists exactly once, everywhere.
		st := stats(t, w.psp)
		require.EqualValues(t, payments, st.Charges, "charges at the provider")
		for _, m := range merchants {
			var l paymentList
			getJSON(t, pd.url(), m, "/v1/payments?limit=100", &l)
			var b balance
			getJSON(t, pd.url(), m, "/v1/balance", &b)
			rows := ins.ledger(t, m)
			var sum int64
			for _, p := range l.Data {
				require.Contains(t, created, p.ID)
				sum += p.Amount
			}
			require.Len(t, l.Data, payments/len(merchants), "%s: payments listed", m)
			require.Len(t, rows, payments/len(merchants), "%s: payments in the database", m)
			require.Equal(t, payments/len(merchants), ins.ledgerEntries(t, m), "%s: ledger entries", m)
			require.EqualValues(t, payments/len(merchants), b.Payments)
			require.Equal(t, map[string]int64{"JPY": sum}, b.Totals)
			require.EqualValues(t, payments/len(merchants), st.Merchants[m].Charges, "%s: charges at the provider", m)
			require.Equal(t, map[string]int64{"JPY": sum}, st.Merchants[m].Amount)
			charges := map[string]bool{}
			for _, r := range rows {
				require.Equal(t, 1, r.entries)
				require.False(t, charges[r.chargeID], "charge %s booked twice", r.chargeID)
				charges[r.chargeID] = true
				var ch struct{ Amount int64 }
				getJSON(t, w.psp.url(), m, "/v1/charges/"+r.chargeID, &ch)
				require.Equal(t, r.amount, ch.Amount)
			}
		}
	})
}
