package dburl

import (
	"fmt"
	"net/url"
	"strings"
)

// The query parameters of a postgres:// URL that idem reads and removes
// before pgx sees the URL (pgx would send an unknown parameter to the server
// as a run-time parameter, which PostgreSQL and pgbouncer refuse).
const (
	// ParamPooler names the connection pooler between idem and PostgreSQL:
	// "transaction" (pgbouncer pool_mode=transaction: idempgx.Options
	// TransactionPooler) or "session" (pool_mode=session, or none: nothing
	// to do). See docs/deployment.md.
	ParamPooler = "idem_pooler"
	// ParamSchema names the schema of idem's tables (idempgx.Options.Schema),
	// named in every statement instead of found through search_path, which
	// pgbouncer refuses or drops as a startup parameter.
	ParamSchema = "idem_schema"
)

// pgParams are the idem_ parameters of a postgres:// URL.
type pgParams struct {
	transactionPooler bool
	schema            string
}

// splitPGParams removes ParamPooler and ParamSchema from the query of the
// postgres:// URL s and returns the URL pgx gets and what they said. The
// rest of the URL is kept byte for byte. With idem_pooler=transaction and
// no default_query_exec_mode in the URL, it adds
// default_query_exec_mode=exec: pgx's default (cache_statement) cannot work
// behind a transaction pooler (idempgx.ErrPoolerExecMode), and an explicit
// mode is left for idempgx.NewWithOptions to accept or refuse.
//
// Errors: a parameter given twice, an empty idem_schema, an idem_pooler
// other than transaction or session, or another idem_ parameter (a typo
// must not pass silently).
func splitPGParams(s string) (string, pgParams, error) {
	var p pgParams
	base, query, ok := strings.Cut(s, "?")
	if !ok {
		return s, p, nil
	}
	fragment := ""
	if i := strings.IndexByte(query, '#'); i >= 0 {
		query, fragment = query[:i], query[i:]
	}
	var kept []string
	seen := map[string]bool{}
	hasExecMode := false
	for _, part := range strings.Split(query, "&") {
		rawName, rawValue, _ := strings.Cut(part, "=")
		name, err := url.QueryUnescape(rawName)
		if err != nil {
			return "", p, fmt.Errorf("postgres URL: query parameter %q: %w", rawName, err)
		}
		if !strings.HasPrefix(name, "idem_") {
			hasExecMode = hasExecMode || name == "default_query_exec_mode"
			kept = append(kept, part)
			continue
		}
		value, err := url.QueryUnescape(rawValue)
		if err != nil {
			return "", p, fmt.Errorf("postgres URL: %s: %w", name, err)
		}
		if seen[name] {
			return "", p, fmt.Errorf("postgres URL: %s is given twice", name)
		}
		seen[name] = true
		switch name {
		case ParamPooler:
			switch value {
			case "transaction":
				p.transactionPooler = true
			case "session":
			default:
				return "", p, fmt.Errorf("postgres URL: %s=%q: want transaction or session (docs/deployment.md)", ParamPooler, value)
			}
		case ParamSchema:
			if value == "" {
				return "", p, fmt.Errorf("postgres URL: %s is empty: name the schema of idem's tables", ParamSchema)
			}
			p.schema = value
		default:
			return "", p, fmt.Errorf("postgres URL: unknown parameter %s: idem reads %s and %s", name, ParamPooler, ParamSchema)
		}
	}
	if p.transactionPooler && !hasExecMode {
		kept = append(kept, "default_query_exec_mode=exec")
	}
	if len(kept) == 0 {
		return base + fragment, p, nil
	}
	return base + "?" + strings.Join(kept, "&") + fragment, p, nil
}

// refuseIdemParams errs when the URL s of a database other than PostgreSQL
// carries an idem_ parameter: they are PostgreSQL's (poolers, a schema).
func refuseIdemParams(kind, s string) error {
	_, query, _ := strings.Cut(s, "?")
	for _, part := range strings.Split(query, "&") {
		if name, _, _ := strings.Cut(part, "="); strings.HasPrefix(name, "idem_") {
			return fmt.Errorf("%s URL: %s is a PostgreSQL parameter (%s, %s)", kind, name, ParamPooler, ParamSchema)
		}
	}
	return nil
}
