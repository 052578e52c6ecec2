package main

import (
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/idemgo/idem/cmd/internal/command"
	"github.com/idemgo/idem/idemdriver"
	"github.com/idemgo/idem/seal"
)

// bodyPreview is how many leading bytes of a stored response body inspect shows.
const bodyPreview = 64

func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// sheet is a table being written: aligned columns separated by tabs in
// what is printed, every write's error kept (command.Writer) until flush.
type sheet struct {
	*command.Writer
	tw *tabwriter.Writer
}

func table(out io.Writer) sheet {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	return sheet{command.NewWriter(tw), tw}
}

// flush writes the aligned table out, and returns the first error of its
// writes or of the flush.
func (s sheet) flush() error {
	if err := s.Err(); err != nil {
		return err
	}
	return s.tw.Flush()
}

// printRows prints a table: header, then one line per item (row gives its
// cells, tab-separated); when there is no item, the line empty instead ("":
// the header alone).
func printRows[T any](out io.Writer, empty, header string, items []T, row func(T) string) error {
	if len(items) == 0 && empty != "" {
		_, err := fmt.Fprintln(out, empty)
		return err
	}
	w := table(out)
	w.Println(header)
	for _, it := range items {
		w.Println(row(it))
	}
	return w.flush()
}

func printLine(out io.Writer, asJSON bool, line string, v any) error {
	if asJSON {
		return writeJSON(out, v)
	}
	_, err := fmt.Fprintln(out, line)
	return err
}

// ts formats a database time for tables: UTC, microseconds (what the
// drivers store, and what idem.DeriveKey reads of created_at).
func ts(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000000Z") }

func tsPtr(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return ts(*t)
}

// dur formats a duration for tables, cut to what an operator reads (whole
// seconds past a minute: "expires in 23h59m59s" never shows as 24h).
func dur(d time.Duration) string {
	switch a := d.Abs(); {
	case a >= time.Minute:
		return d.Truncate(time.Second).String()
	case a >= time.Second:
		return d.Round(10 * time.Millisecond).String()
	default:
		return d.Round(time.Millisecond).String()
	}
}

func printMigrations(out io.Writer, asJSON bool, s *store, list []idemdriver.Migration) error {
	if asJSON {
		type migration struct {
			Version   int64      `json:"version"`
			Name      string     `json:"name"`
			Applied   bool       `json:"applied"`
			AppliedAt *time.Time `json:"applied_at"`
			Missing   []string   `json:"missing_tables,omitempty"`
		}
		ms := []migration{}
		for _, m := range list {
			ms = append(ms, migration{m.Version, m.Name, m.Applied, m.AppliedAt, m.Missing})
		}
		return writeJSON(out, map[string]any{"database": s.Kind, "partitioned": s.Partitioned, "migrations": ms})
	}
	return printRows(out, "", "VERSION\tNAME\tSTATE\tAPPLIED AT", list, func(m idemdriver.Migration) string {
		state := "pending"
		if m.Applied {
			state = "applied"
		}
		if len(m.Missing) > 0 { // the version table says applied; the database lacks its tables
			state = "applied, but missing table " + strings.Join(m.Missing, ", ")
		}
		return fmt.Sprintf("%d\t%s\t%s\t%s", m.Version, m.Name, state, tsPtr(m.AppliedAt))
	})
}

type purgeResult struct {
	DryRun    bool
	OlderThan time.Duration
	Batch     int
	Batches   int
	Purged    int64
	Duration  time.Duration
	// Stopped says why a purge ended with expired records possibly left:
	// stopTimeout, stopInterrupted or stopMaxBatches; empty when a short
	// batch found no more.
	Stopped string
	Timeout time.Duration // --timeout, for stopTimeout
}

func printPurge(out io.Writer, asJSON bool, r purgeResult) error {
	if asJSON {
		v := map[string]any{"dry_run": r.DryRun, "older_than": r.OlderThan.String(),
			"older_than_seconds": r.OlderThan.Seconds(), "batch": r.Batch}
		if r.DryRun {
			v["would_purge"] = r.Purged
		} else {
			v["purged"], v["batches"], v["duration_seconds"] = r.Purged, r.Batches, r.Duration.Seconds()
			v["complete"], v["stopped"] = r.Stopped == "", nil
			if r.Stopped != "" {
				v["stopped"] = r.Stopped
			}
		}
		return writeJSON(out, v)
	}
	what := "every expired record"
	if r.OlderThan > 0 {
		what = "records expired more than " + r.OlderThan.String() + " ago"
	}
	if r.DryRun {
		_, err := fmt.Fprintf(out, "would purge %d records (%s)\n", r.Purged, what)
		return err
	}
	stopped := ""
	switch r.Stopped {
	case stopTimeout:
		stopped = fmt.Sprintf("; stopped: --timeout %s reached, expired records may remain", r.Timeout)
	case stopInterrupted:
		stopped = "; stopped: interrupted, expired records may remain"
	case stopMaxBatches:
		stopped = "; stopped: --max-batches reached, expired records may remain"
	}
	_, err := fmt.Fprintf(out, "purged %d records in %d batches of at most %d (%s) in %s%s\n",
		r.Purged, r.Batches, r.Batch, what, dur(r.Duration), stopped)
	return err
}

func printPartitions(out io.Writer, asJSON bool, verb string, parts []idemdriver.Partition) error {
	if asJSON {
		type partition struct {
			Name string    `json:"name"`
			From time.Time `json:"from"`
			To   time.Time `json:"to"`
			Rows int64     `json:"rows_estimate"`
		}
		ps := []partition{}
		for _, p := range parts {
			ps = append(ps, partition{p.Name, p.From, p.To, p.Rows})
		}
		key := "partitions"
		if verb != "" {
			key = strings.ReplaceAll(verb, " ", "_")
		}
		return writeJSON(out, map[string]any{key: ps})
	}
	if verb != "" {
		if _, err := fmt.Fprintf(out, "%s %d partitions\n", verb, len(parts)); err != nil || len(parts) == 0 {
			return err
		}
	}
	return printRows(out, "", "PARTITION\tEXPIRES FROM\tEXPIRES BEFORE\tROWS (ESTIMATE)", parts, func(p idemdriver.Partition) string {
		rows := strconv.FormatInt(p.Rows, 10)
		if p.Rows < 0 {
			rows = "-"
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s", p.Name, p.From.Format(time.DateOnly), p.To.Format(time.DateOnly), rows)
	})
}

// nextRequest says what a request with the record's key gets now, per
// CONTRACT section 3 (assuming the same method, path and body: a different
// one gets 422 in every state but expiry), from a server with the seal keys
// given, whose attempt to open the record's seal is n (the zero sealNote
// when none was made). A SUCCEEDED record whose seal did not open is
// answered 500 (docs/problems.md), never run again.
func nextRequest(rec idemdriver.Record, now time.Time, n sealNote) string {
	status := 0
	if rec.Response != nil {
		status = rec.Response.Status
	}
	switch {
	case rec.Damaged():
		return "500 record-damaged: the record is PROCESSING without a lease bound (locked_until NULL), so no request " +
			"takes it over; release it once you know what its execution did"
	case rec.State == idemdriver.StateUnknown:
		return "409 outcome-unknown: an at-most-once step started without a result, or the completer could not finish it (its step's reason says which); it is never run again " +
			"nor purged: find out from the callee what happened, then `idem resolve`"
	case !rec.ExpiresAt.After(now):
		return "runs as a new request: the record expired " + dur(now.Sub(rec.ExpiresAt)) + " ago"
	case rec.State == idemdriver.StateSucceeded && n.plainRefused:
		return fmt.Sprintf("500 seal-broken from a server with these seal keys, which takes sealed records only: the %d response is stored plain "+
			"(a server that replays plain records, ReplayPlain or --seal-replay-plain, replays it)", status)
	case rec.State == idemdriver.StateSucceeded && n.err != nil && errors.Is(n.err, seal.ErrKeyMissing):
		return fmt.Sprintf("replay of the stored %d response from a server holding seal key %s (Idempotent-Replayed: true); "+
			"500 seal-key-missing from one without it", status, n.key)
	case rec.State == idemdriver.StateSucceeded && n.err != nil:
		return fmt.Sprintf("500 seal-broken from a server with these seal keys: the stored %d response does not authenticate under seal key %s", status, n.key)
	case rec.State == idemdriver.StateSucceeded && rec.Response != nil && !rec.Response.BodyStored:
		return "410 response-not-stored: it succeeded, but its response was too large to keep"
	case rec.State == idemdriver.StateSucceeded:
		return fmt.Sprintf("replay of the stored %d response (Idempotent-Replayed: true)", status)
	case rec.State == idemdriver.StateFailed:
		return "runs again: the last attempt ended with a retryable outcome"
	case rec.LeaseLeft > 0:
		// The server's Retry-After is its Options.Engine.RetryAfter.InFlight capped
		// by the lease left (CONTRACT section 3); this command cannot know
		// the server's setting, so it gives the lease left.
		return fmt.Sprintf("409 request-in-flight (lease %s left; Retry-After is the server's in-flight delay, "+
			"1 s by default, at most the lease left)", dur(rec.LeaseLeft))
	default:
		overdue := "-"
		if rec.LockedUntil != nil {
			overdue = dur(now.Sub(*rec.LockedUntil))
		}
		return "takes over with the next fencing token: the owner's lease ran out " + overdue + " ago"
	}
}

// recordView is what inspect prints of a record beyond its table: the
// whole body, the kept request, how its seal was opened, and its steps.
type recordView struct {
	body, request bool
	seal          sealNote
	steps         []stepView
}

// sealNote says how a record's seal was opened: key is the id that sealed
// it ("" for a plain record), err why it could not be opened; plainRefused
// that the record is plain although --seal-key was given (a sealed server
// refuses it).
type sealNote struct {
	key          string
	err          error
	plainRefused bool
}

func (n sealNote) String() string {
	switch { // what the server answers is the next request's line (nextRequest)
	case n.plainRefused:
		return "no (stored in plain, where these seal keys expect a sealed record)"
	case n.key == "":
		return "no (stored in plain)"
	case n.err == nil:
		return fmt.Sprintf("yes, key %s (opened)", n.key)
	case errors.Is(n.err, seal.ErrKeyMissing):
		return fmt.Sprintf("yes, key %s: not opened, give --seal-key %s:... to show the response and request", n.key, n.key)
	default:
		return fmt.Sprintf("yes, key %s: NOT AUTHENTIC (%v)", n.key, n.err)
	}
}

// openRecord opens rec's sealed response and request in place with kr, and
// says how.
func openRecord(rec *idemdriver.Record, kr *seal.Keyring) sealNote {
	if rec.Response == nil {
		return sealNote{}
	}
	if rec.Response.SealKey == "" {
		return sealNote{plainRefused: kr != nil && rec.State == idemdriver.StateSucceeded}
	}
	note := sealNote{key: rec.Response.SealKey}
	opened, err := kr.OpenResponse(seal.LifeOf(*rec), *rec.Response)
	if err != nil {
		note.err = err
		return note
	}
	rec.Response = &opened
	return note
}

// printRecord prints one record; view.body adds the whole stored response
// body, view.request the kept request.
func printRecord(out io.Writer, asJSON bool, rec idemdriver.Record, now time.Time, view recordView) error {
	withBody, sealed := view.body, view.seal.key != "" && view.seal.err != nil
	if asJSON {
		v := map[string]any{
			"scope": rec.Scope, "key": rec.Key, "state": rec.State, "owner": rec.Owner, "method": rec.Method, "path": rec.Path,
			"fingerprint": hex.EncodeToString(rec.Fingerprint), "fencing_token": rec.FencingToken,
			"attempts": rec.Attempts, "lease_left_seconds": rec.LeaseLeft.Seconds(), "locked_until": rec.LockedUntil,
			"created_at": rec.CreatedAt, "updated_at": rec.UpdatedAt, "completed_at": rec.CompletedAt,
			"expires_at": rec.ExpiresAt, "expires_in_seconds": rec.ExpiresAt.Sub(now).Seconds(),
			"now": now, "next_request": nextRequest(rec, now, view.seal), "response": nil,
		}
		if r := rec.Response; r != nil {
			head := r.Body[:min(len(r.Body), bodyPreview)]
			resp := map[string]any{"status": r.Status, "headers": r.Header, "body_size": r.BodySize,
				"body_stored": r.BodyStored, "body_head": string(head), "body_head_hex": hex.EncodeToString(head),
				"seal_key": view.seal.key, "sealed": view.seal.String()}
			if sealed {
				delete(resp, "body_head")
				delete(resp, "body_head_hex")
				delete(resp, "headers")
			}
			if withBody && r.BodyStored && !sealed {
				resp["body_base64"] = base64.StdEncoding.EncodeToString(r.Body)
				if utf8.Valid(r.Body) {
					resp["body"] = string(r.Body)
				}
			}
			v["response"] = resp
		}
		if view.request {
			v["request"] = requestJSON(rec.Response, sealed)
		}
		if view.steps != nil {
			steps := []map[string]any{}
			for _, st := range view.steps {
				steps = append(steps, st.json())
			}
			v["steps"] = steps
		}
		return writeJSON(out, v)
	}
	w := table(out)
	row := func(k, v string) { w.Printf("%s\t%s\n", k, v) }
	row("scope", rec.Scope)
	row("key", rec.Key)
	row("state", string(rec.State))
	row("owner", orDash(rec.Owner))
	row("next request", nextRequest(rec, now, view.seal))
	row("method", rec.Method)
	row("path", rec.Path)
	row("fingerprint", hex.EncodeToString(rec.Fingerprint))
	row("fencing token", strconv.FormatInt(rec.FencingToken, 10))
	row("attempts", strconv.Itoa(rec.Attempts))
	lease := "-"
	if rec.State == idemdriver.StateProcessing && rec.LockedUntil != nil {
		if left := rec.LockedUntil.Sub(now); left > 0 {
			lease = dur(left) + " left"
		} else {
			lease = "expired " + dur(-left) + " ago"
		}
	}
	row("lease", lease)
	row("locked until", tsPtr(rec.LockedUntil))
	row("created at", ts(rec.CreatedAt)+" ("+dur(now.Sub(rec.CreatedAt))+" ago)")
	row("updated at", ts(rec.UpdatedAt))
	row("completed at", tsPtr(rec.CompletedAt))
	expires := "expires in " + dur(rec.ExpiresAt.Sub(now))
	switch {
	case rec.State == idemdriver.StateUnknown:
		expires = "never: UNKNOWN until resolved"
	case !rec.ExpiresAt.After(now):
		expires = "expired " + dur(now.Sub(rec.ExpiresAt)) + " ago"
	}
	row("expires at", ts(rec.ExpiresAt)+" ("+expires+")")
	if r := rec.Response; r != nil {
		stored := "stored"
		if !r.BodyStored {
			stored = "not stored: larger than MaxResponseBytes"
		}
		row("response", fmt.Sprintf("%d, body %d bytes (%s)", r.Status, r.BodySize, stored))
		row("  sealed", view.seal.String())
		names := make([]string, 0, len(r.Header))
		for k := range r.Header {
			names = append(names, k)
		}
		sort.Strings(names)
		for _, k := range names {
			for _, v := range r.Header[k] {
				row("  header", k+": "+v)
			}
		}
		if r.BodyStored && sealed {
			row("  body", "(sealed)")
		} else if r.BodyStored {
			head := r.Body[:min(len(r.Body), bodyPreview)]
			more := ""
			if len(r.Body) > len(head) {
				more = fmt.Sprintf(" ... (%d more bytes)", len(r.Body)-len(head))
			}
			row("  body", strconv.Quote(string(head))+more)
		}
	} else {
		row("response", "-")
	}
	row("now (database)", ts(now))
	if err := w.flush(); err != nil {
		return err
	}
	if len(view.steps) > 0 {
		if _, err := fmt.Fprintln(out, "steps:"); err != nil {
			return err
		}
		sw := table(out)
		for _, st := range view.steps {
			sw.Printf("  %s\t%s\n", st.Name, st.describe())
		}
		if err := sw.flush(); err != nil {
			return err
		}
	}
	if withBody && sealed {
		if _, err := fmt.Fprintln(out, "\nthe body is sealed: give --seal-key to show it"); err != nil {
			return err
		}
	} else if withBody {
		if err := printBody(out, rec.Response); err != nil {
			return err
		}
	}
	if view.request {
		return printRequest(out, rec.Response, sealed)
	}
	return nil
}

// keptRequest decodes the request kept in r (opened), or says why there is
// none to show.
func keptRequest(r *idemdriver.Response, sealed bool) (seal.Request, string, error) {
	switch {
	case r == nil || r.Request == nil:
		return seal.Request{}, "no request kept (KeepRequestBytes was off, or the record is not SUCCEEDED)", nil
	case sealed:
		return seal.Request{}, "the kept request is sealed: give --seal-key to show it", nil
	}
	req, err := seal.DecodeRequest(r.Request)
	return req, "", err
}

// printRequest prints the request kept in r after a blank line.
func printRequest(out io.Writer, r *idemdriver.Response, sealed bool) error {
	req, why, err := keptRequest(r, sealed)
	if err != nil {
		return err
	}
	if why != "" {
		_, err = fmt.Fprintf(out, "\n%s\n", why)
		return err
	}
	kept := fmt.Sprintf("%d bytes", req.Size)
	if req.Truncated {
		kept = fmt.Sprintf("%d bytes, its first %d kept", req.Size, len(req.Body))
	}
	w := command.NewWriter(out)
	w.Printf("\nrequest (%s):\n", kept)
	w.Printf("  content-type: %s\n", orDash(req.ContentType))
	w.Printf("  query: %s\n", orDash(req.Query))
	if utf8.Valid(req.Body) {
		w.Printf("  body: %s\n", req.Body)
	} else {
		w.Printf("  body (not UTF-8 text):\n%s", hex.Dump(req.Body))
	}
	return w.Err()
}

// requestJSON is the request kept in r as inspect --json shows it, or a
// string saying why there is none to show.
func requestJSON(r *idemdriver.Response, sealed bool) any {
	req, why, err := keptRequest(r, sealed)
	switch {
	case err != nil:
		return err.Error()
	case why != "":
		return why
	}
	v := map[string]any{"content_type": req.ContentType, "query": req.Query, "size": req.Size,
		"truncated": req.Truncated, "body_base64": base64.StdEncoding.EncodeToString(req.Body)}
	if utf8.Valid(req.Body) {
		v["body"] = string(req.Body)
	}
	return v
}

// printBody prints a stored response body whole, after a blank line: as is
// when it is UTF-8 text, else as a hex dump.
func printBody(out io.Writer, r *idemdriver.Response) error {
	var err error
	switch {
	case r == nil:
		_, err = fmt.Fprintln(out, "\nno stored response")
	case !r.BodyStored:
		_, err = fmt.Fprintf(out, "\nthe body (%d bytes) was not stored: larger than MaxResponseBytes\n", r.BodySize)
	case utf8.Valid(r.Body):
		_, err = fmt.Fprintf(out, "\nbody (%d bytes):\n%s\n", len(r.Body), r.Body)
	default:
		_, err = fmt.Fprintf(out, "\nbody (%d bytes, not UTF-8 text):\n%s", len(r.Body), hex.Dump(r.Body))
	}
	return err
}

// printRecords prints records as a table (one line each), or JSON with
// next, the page's last record when another page follows (nil: none).
func printRecords(out io.Writer, asJSON bool, recs []idemdriver.Record, now time.Time, next *idemdriver.Record) error {
	if asJSON {
		type record struct {
			Scope         string           `json:"scope"`
			Key           string           `json:"key"`
			State         idemdriver.State `json:"state"`
			Owner         string           `json:"owner"`
			Attempts      int              `json:"attempts"`
			FencingToken  int64            `json:"fencing_token"`
			Method        string           `json:"method"`
			Path          string           `json:"path"`
			Status        *int             `json:"response_status"`
			LeaseLeftSecs float64          `json:"lease_left_seconds"`
			CreatedAt     time.Time        `json:"created_at"`
			UpdatedAt     time.Time        `json:"updated_at"`
			ExpiresAt     time.Time        `json:"expires_at"`
			NextRequest   string           `json:"next_request"`
		}
		list := []record{}
		for _, r := range recs {
			var status *int
			if r.Response != nil {
				status = &r.Response.Status
			}
			list = append(list, record{r.Scope, r.Key, r.State, r.Owner, r.Attempts, r.FencingToken, r.Method, r.Path, status,
				r.LeaseLeft.Seconds(), r.CreatedAt, r.UpdatedAt, r.ExpiresAt, nextRequest(r, now, sealNote{})})
		}
		var nextPage any
		if next != nil {
			nextPage = map[string]string{"after_scope": next.Scope, "after_key": next.Key}
		}
		return writeJSON(out, map[string]any{"records": list, "next": nextPage, "now": now})
	}
	return printRows(out, "no record", "SCOPE\tKEY\tSTATE\tATTEMPTS\tFENCING TOKEN\tREQUEST\tUPDATED AT\tOWNER\tNEXT REQUEST",
		recs, func(r idemdriver.Record) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%s %s\t%s\t%s\t%s", r.Scope, r.Key, r.State, r.Attempts, r.FencingToken,
				r.Method, r.Path, ts(r.UpdatedAt), orDash(r.Owner), nextRequest(r, now, sealNote{}))
		})
}

func printStuck(out io.Writer, asJSON bool, v stuckView) error {
	recs := v.stuck
	if asJSON {
		type stuck struct {
			Scope          string     `json:"scope"`
			Key            string     `json:"key"`
			Owner          string     `json:"owner"`
			OverdueSeconds float64    `json:"overdue_seconds"`
			Attempts       int        `json:"attempts"`
			FencingToken   int64      `json:"fencing_token"`
			Method         string     `json:"method"`
			Path           string     `json:"path"`
			LockedUntil    *time.Time `json:"locked_until"`
			CreatedAt      time.Time  `json:"created_at"`
			Damaged        bool       `json:"damaged"`
		}
		list := []stuck{}
		for _, r := range recs {
			list = append(list, stuck{r.Scope, r.Key, r.Owner, r.Overdue.Seconds(), r.Attempts, r.FencingToken,
				r.Method, r.Path, r.LockedUntil, r.CreatedAt, r.Damaged()})
		}
		unknown := []map[string]any{}
		for _, u := range v.unknown {
			unknown = append(unknown, map[string]any{"scope": u.Scope, "key": u.Key, "step": u.step.Name, "reason": u.step.Reason,
				"fencing_token": u.FencingToken, "method": u.Method, "path": u.Path, "created_at": u.CreatedAt, "since": u.UpdatedAt})
		}
		return writeJSON(out, map[string]any{"stuck": list, "unknown": unknown})
	}
	err := printRows(out, "no PROCESSING record is past its lease or damaged", "SCOPE\tKEY\tLEASE RAN OUT\tATTEMPTS\tFENCING TOKEN\tREQUEST\tCREATED AT\tOWNER",
		recs, func(r idemdriver.StuckRecord) string {
			ranOut := dur(r.Overdue) + " ago"
			if r.Damaged() {
				ranOut = "DAMAGED: no lease"
			}
			return fmt.Sprintf("%s\t%s\t%s\t%d\t%d\t%s %s\t%s\t%s", r.Scope, r.Key, ranOut, r.Attempts,
				r.FencingToken, r.Method, r.Path, ts(r.CreatedAt), orDash(r.Owner))
		})
	if err != nil || len(v.unknown) == 0 {
		return err
	}
	if _, err := fmt.Fprintln(out, "\nUNKNOWN: the outcome cannot be known; nothing runs them again (find out from the callee, then idem resolve)"); err != nil {
		return err
	}
	return printRows(out, "", "SCOPE\tKEY\tSTEP\tREASON\tSINCE\tFENCING TOKEN\tREQUEST\tCREATED AT",
		v.unknown, func(u unknownRecord) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%s %s\t%s", u.Scope, u.Key, orDash(u.step.Name), orDash(u.step.Reason),
				ts(u.UpdatedAt), u.FencingToken, u.Method, u.Path, ts(u.CreatedAt))
		})
}

func printStats(out io.Writer, asJSON bool, st idemdriver.Stats) error {
	if asJSON {
		scopes := []map[string]any{}
		for _, sc := range st.TopScopes {
			scopes = append(scopes, map[string]any{"scope": sc.Scope, "records": sc.Count})
		}
		v := map[string]any{"now": st.Now, "total": st.Total, "by_state": st.ByState, "top_scopes": scopes,
			"oldest_created_at": st.Oldest, "expired_not_purged": st.Expired, "stuck": st.Stuck, "damaged": st.Damaged}
		return writeJSON(out, v)
	}
	w := table(out)
	w.Printf("records\t%d\n", st.Total)
	for _, s := range []idemdriver.State{idemdriver.StateProcessing, idemdriver.StateSucceeded, idemdriver.StateFailed, idemdriver.StateUnknown} {
		w.Printf("  %s\t%d\n", s, st.ByState[s])
	}
	w.Printf("expired, not purged\t%d\n", st.Expired)
	w.Printf("stuck (PROCESSING past lease)\t%d\n", st.Stuck)
	w.Printf("damaged (PROCESSING, no lease)\t%d\n", st.Damaged)
	oldest := "-"
	if st.Oldest != nil {
		oldest = ts(*st.Oldest) + " (" + dur(st.Now.Sub(*st.Oldest)) + " ago)"
	}
	w.Printf("oldest record\t%s\n", oldest)
	w.Printf("now (database)\t%s\n", ts(st.Now))
	if err := w.flush(); err != nil || len(st.TopScopes) == 0 {
		return err
	}
	if _, err := fmt.Fprintln(out); err != nil {
		return err
	}
	return printRows(out, "", "SCOPE\tRECORDS", st.TopScopes, func(sc idemdriver.ScopeCount) string {
		return fmt.Sprintf("%s\t%d", sc.Scope, sc.Count)
	})
}

// orDash is s, or "-" when empty (an owner not recorded: a claim made
// before owners were, or by a process that names none).
func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// stepView is a step of the record's life as inspect shows it: the step,
// and its relayed key and recorded result (the envelope Step records, JSON)
// when they open (sealed, without the key: none).
type stepView struct {
	idemdriver.Step
	relay, result string
}

// state is started, done or cleared (a resolution's not applied).
func (s stepView) state() string {
	switch {
	case s.Done:
		return "done"
	case s.StartedToken == 0:
		return "cleared"
	}
	return "started"
}

// describe is s in one line of inspect's table.
func (s stepView) describe() string {
	parts := []string{s.state() + " (fencing token " + strconv.FormatInt(s.StartedToken, 10) + ", " + ts(s.StartedAt) + ")"}
	if s.AtMostOnce {
		parts = append(parts, "at-most-once")
	}
	if s.Reason != "" {
		parts = append(parts, "UNKNOWN: "+s.Reason)
	}
	if !s.ResolvedAt.IsZero() {
		parts = append(parts, fmt.Sprintf("resolved by %s at %s: %s", s.ResolvedBy, ts(s.ResolvedAt), s.ResolvedWhy))
	}
	if s.relay != "" && !strings.HasPrefix(s.Name, idemdriver.InternalStepPrefix) {
		parts = append(parts, "relayed key "+s.relay)
	}
	if s.result != "" {
		parts = append(parts, "result "+s.result)
	}
	return strings.Join(parts, "; ")
}

func (s stepView) json() map[string]any {
	v := map[string]any{"name": s.Name, "state": s.state(), "started_token": s.StartedToken, "started_at": s.StartedAt,
		"at_most_once": s.AtMostOnce, "reason": s.Reason, "sealed": s.SealKey != ""}
	if s.Done {
		v["finished_at"] = s.FinishedAt
	}
	if !s.ResolvedAt.IsZero() {
		v["resolved_by"], v["resolved_why"], v["resolved_at"] = s.ResolvedBy, s.ResolvedWhy, s.ResolvedAt
	}
	if s.relay != "" && !strings.HasPrefix(s.Name, idemdriver.InternalStepPrefix) {
		v["relayed_key"] = s.relay
	}
	if s.result != "" {
		v["result"] = json.RawMessage(s.result)
	}
	return v
}
