package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/idemgo/idem/cmd/internal/supervise"
	"github.com/idemgo/idem/internal/dbtest"
)

// The paymentsd binary under test, built once per test binary, as
// idemstorm builds it: with its fault injection (-tags idemfaults), without
// -race (see paymentsdBin).
var binaries = supervise.Binaries{Names: []string{"paymentsd", "fakepsp"}}

func TestMain(m *testing.M) {
	code := m.Run()
	if err := binaries.Remove(); err != nil {
		fmt.Fprintln(os.Stderr, "removing the test binaries:", err)
	}
	os.Exit(code)
}

// paymentsdBin builds cmd/paymentsd on first use. It is built without
// -race, whatever this test binary: the storm tests measure paymentsd's
// exactly-once behaviour under load and SIGKILL, and a race-instrumented
// server is several times slower, which on CI's two cores would stretch the
// short storms past their budget (cmd/e2e/ runs paymentsd with -race, on fewer
// requests, and fails on any race it reports). idemstorm itself (the
// client, the chaos and the reconciliation) runs in this test binary, with
// -race under scripts/test.
func paymentsdBin(t *testing.T) string {
	t.Helper()
	paths, err := binaries.Paths()
	if err != nil {
		t.Fatal(err)
	}
	return paths[0]
}

// runStorm runs idemstorm in-process with flags (and paymentsd's flags
// after --), and returns its exit status, its JSON report and its output.
func runStorm(t *testing.T, flags []string, paymentsdFlags ...string) (int, *Report, string) {
	t.Helper()
	reportPath := filepath.Join(t.TempDir(), "report.json")
	args := append([]string{"--report", reportPath, "--progress=false", "--log-dir", t.TempDir()}, flags...)
	if len(paymentsdFlags) > 0 {
		args = append(append(args, "--"), paymentsdFlags...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var stdout, stderr supervise.Buffer
	code := run(ctx, args, &stdout, &stderr)
	out := stdout.String() + stderr.String()
	t.Logf("idemstorm %s\n%s", strings.Join(args, " "), out)
	var rep *Report
	if b, err := os.ReadFile(reportPath); err == nil {
		rep = &Report{}
		require.NoError(t, json.Unmarshal(b, rep))
	}
	return code, rep, out
}

// requireExactlyOnce checks a report that says every logical payment
// succeeded exactly once.
func requireExactlyOnce(t *testing.T, code int, rep *Report, payments int) {
	t.Helper()
	require.NotNil(t, rep, "no report")
	require.Equal(t, exitOK, code, "%v", rep.Verdict.Failures)
	require.True(t, rep.Verdict.OK)
	rec := rep.Reconciliation
	require.True(t, rec.Exact)
	require.Equal(t, payments, rec.Found)
	require.EqualValues(t, payments, rec.LedgerPayments)
	require.Zero(t, rec.DoublePayments)
	require.Zero(t, rec.Lost)
	require.Zero(t, rec.Unfinished)
	require.Zero(t, rec.DivergentAnswers)
	require.NotNil(t, rep.Records)
	require.Equal(t, payments, rep.Records.ByState["SUCCEEDED"])
	require.Zero(t, rep.Records.Stuck)
	require.Positive(t, rep.Load.Replays, "duplicates were answered with replays")
}

// shortStorm is the CI storm: 200 logical payments, 4 copies each, over two
// servers on one database, with random client timeouts and cancellations,
// a SIGKILL about every 700 ms, and paymentsd killing itself after 2% of
// its charges.
func shortStorm(t *testing.T, databaseURL string) {
	const payments = 200
	code, rep, _ := runStorm(t, []string{
		"--paymentsd-bin", paymentsdBin(t), "--database-url", databaseURL,
		"--payments", fmt.Sprint(payments), "--duplicates", "4", "--servers", "2",
		"--chaos", "--kill-every", "700ms", "--lease", "2s", "--deadline", "100s",
	}, "--psp-latency", "20ms", "--crash-after-charge", "0.02")
	requireExactlyOnce(t, code, rep, payments)
	require.Positive(t, rep.Servers.Kills, "chaos killed servers")
	require.Equal(t, rep.Servers.Kills+rep.Servers.Crashes, rep.Servers.Restarts, "every death was restarted")
	require.Positive(t, rep.Load.ClientTimeouts+rep.Load.Cancellations, "some sends were cut short")
}

func TestStormSQLiteChaos(t *testing.T) {
	t.Parallel()
	shortStorm(t, "sqlite:"+filepath.Join(t.TempDir(), "storm.db"))
}

func TestStormPostgresChaos(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	shortStorm(t, url)
}

// TestStormAgainstRunningServer storms a paymentsd started outside
// idemstorm (--url), and checks idem's records through --database-url.
func TestStormAgainstRunningServer(t *testing.T) {
	t.Parallel()
	db := "sqlite:" + filepath.Join(t.TempDir(), "p.db")
	addr, err := supervise.FreeAddr()
	require.NoError(t, err)
	var logs supervise.Buffer
	pd := &supervise.Process{Name: "paymentsd", Bin: paymentsdBin(t), Addr: addr,
		Args:   []string{"--database-url", db, "--psp-latency", "10ms", "--lease", "2s"},
		Output: logs.Output}
	t.Cleanup(func() { pd.Kill(time.Minute) })
	require.NoError(t, pd.Start(), "%s", logs.String())

	code, rep, out := runStorm(t, []string{"--url", "http://" + addr, "--database-url", db,
		"--payments", "30", "--merchants", "5", "--duplicates", "3"})
	requireExactlyOnce(t, code, rep, 30)
	require.Nil(t, rep.Servers)
	require.Len(t, rep.Reconciliation.Merchants, 5)
	require.Contains(t, out, "verdict")
	require.Contains(t, out, "OK: every logical payment succeeded exactly once")
}

// TestStormReportsFailedStart: a paymentsd that cannot start is an error
// (exit 2), not a verdict.
func TestStormReportsFailedStart(t *testing.T) {
	t.Parallel()
	code, rep, out := runStorm(t, []string{"--paymentsd-bin", paymentsdBin(t), "--payments", "1"}, "--no-such-flag")
	require.Equal(t, exitError, code)
	require.Nil(t, rep)
	require.Contains(t, out, "did not start")
}

// TestBurst sends a burst (--burst: each payment once, all at once) at a
// paymentsd bounded to 5 payments in flight whose provider takes 2 s: each
// payment either completes or is refused before its claim (503
// overloaded), and a refused one leaves no idem record.
func TestBurst(t *testing.T) {
	t.Parallel()
	const payments = 40
	code, rep, out := runStorm(t, []string{
		"--paymentsd-bin", paymentsdBin(t), "--database-url", "sqlite:" + filepath.Join(t.TempDir(), "burst.db"),
		"--burst", "--payments", fmt.Sprint(payments), "--deadline", "100s",
	}, "--psp-latency", "2s", "--max-in-flight", "5")
	require.NotNil(t, rep, "no report")
	require.Equal(t, exitOK, code, "%v", rep.Verdict.Failures)
	require.True(t, rep.Config.Burst)
	b := rep.Burst
	require.NotNil(t, b)
	require.Equal(t, payments, b.Created+b.Refused)
	require.Zero(t, b.Other)
	require.Positive(t, b.Refused, "the bound refused some")
	require.Positive(t, b.Created)
	require.EqualValues(t, b.Created, rep.Reconciliation.LedgerPayments)
	require.Equal(t, b.Refused, rep.Records.ByState["ABSENT"], "nothing claimed for a refused payment")
	require.Equal(t, b.Created, rep.Records.ByState["SUCCEEDED"])
	require.Contains(t, out, "refused before their claim")
	// A refusal is counted as one, not as unfinished work or a missing charge.
	require.Regexp(t, fmt.Sprintf(`never answered 201\s+%d \(%d refused before their claim\)`, b.Refused, b.Refused), out)
	require.NotContains(t, out, "unfinished")
	require.NotContains(t, out, " missing,")
}

// TestBurstChaosCompleter: a burst whose clients never retry, while chaos
// kills paymentsd (SIGKILL about every 300 ms) during the provider's 400 ms
// charges: the payments whose server died get no answer and no retry, and
// paymentsd's completer books every charge the provider made. Ledger =
// provider charges, no double charge, no double payment, no record left
// PROCESSING.
func TestBurstChaosCompleter(t *testing.T) {
	t.Parallel()
	paths, err := binaries.Paths()
	require.NoError(t, err)
	addr, err := supervise.FreeAddr()
	require.NoError(t, err)
	var logs supervise.Buffer
	psp := &supervise.Process{Name: "fakepsp", Bin: paths[1], Addr: addr, Output: logs.Output,
		Args: []string{"--database-url", "sqlite:" + filepath.Join(t.TempDir(), "psp.db"), "--latency", "400ms"}}
	t.Cleanup(func() { psp.Kill(time.Minute) })
	require.NoError(t, psp.Start(), "%s", logs.String())

	const payments = 60
	code, rep, out := runStorm(t, []string{
		"--paymentsd-bin", paymentsdBin(t), "--database-url", "sqlite:" + filepath.Join(t.TempDir(), "storm.db"),
		"--burst", "--chaos", "--kill-every", "300ms", "--lease", "2s", "--psp-url", "http://" + addr,
		"--payments", fmt.Sprint(payments), "--deadline", "100s",
	})
	require.NotNil(t, rep, "no report")
	require.Equal(t, exitOK, code, "%v", rep.Verdict.Failures)
	require.Positive(t, rep.Servers.Kills, "chaos killed servers")
	p := rep.Reconciliation.Provider
	require.NotNil(t, p)
	require.Positive(t, p.Charges)
	require.EqualValues(t, p.Charges, rep.Reconciliation.LedgerPayments, "ledger = provider charges")
	require.Zero(t, p.DoubleCharges)
	require.Zero(t, p.Unbooked)
	require.Zero(t, rep.Reconciliation.DoublePayments)
	require.Zero(t, rep.Records.ByState["PROCESSING"])
	require.Contains(t, out, "no client retried, and every charge the provider made is booked once")
	t.Logf("%d of %d answered 201, %d without an answer; %d charged and booked; %d kills",
		rep.Burst.Created, payments, rep.Burst.Other, p.Charges, rep.Servers.Kills)
}
