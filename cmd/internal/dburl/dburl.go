// Package dburl reads the --database-url of idem's commands (paymentsd,
// fakepsp, idem, idemstorm) and opens idem's store on it: one set of rules
// (Parse) and one opener (Open), so the same URL names the same database,
// opened the same way, in each of them.
package dburl

import (
	"errors"
	"fmt"
	"strings"
)

// Kinds of database.
const (
	Postgres = "postgres"
	MySQL    = "mysql"
	SQLite   = "sqlite"
)

// Parse tells which database s names, and returns the URL or file to open:
//   - postgres://... or postgresql://...: PostgreSQL, the URL as given
//     (pgxpool syntax: search_path=... and other run-time parameters; Open
//     reads and removes idem's own, ParamPooler and ParamSchema);
//   - mysql://... or mariadb://...: MySQL or MariaDB, the URL as given
//     (idemmysql.ParseURL's form: mysql://user:password@host:port/dbname?params);
//   - sqlite:PATH, sqlite://PATH, file:PATH, file://PATH or a plain PATH:
//     SQLite, the file at PATH. SQLite takes no query parameters (idem sets
//     its own), and '?', '#' and '%' in a path are refused as ambiguous.
//
// An empty s, another scheme, or an SQLite URL without a path is an error.
func Parse(s string) (kind, target string, err error) {
	switch {
	case s == "":
		return "", "", errors.New("no database URL")
	case strings.HasPrefix(s, "postgres://"), strings.HasPrefix(s, "postgresql://"):
		return Postgres, s, nil
	case strings.HasPrefix(s, "mysql://"), strings.HasPrefix(s, "mariadb://"):
		return MySQL, s, nil
	}
	path := s
	for _, prefix := range []string{"sqlite:", "file:"} {
		if rest, ok := strings.CutPrefix(s, prefix); ok {
			path = strings.TrimPrefix(rest, "//")
			break
		}
	}
	if i := strings.Index(s, "://"); i > 0 && path == s {
		return "", "", fmt.Errorf("unsupported database URL scheme %q: use postgres://, postgresql://, mysql://, mariadb://, sqlite:, file: or a file path", s[:i])
	}
	if strings.ContainsAny(path, "?#%") {
		return "", "", fmt.Errorf("SQLite database %q: query parameters, and '?', '#' or '%%' in the path, are not supported", s)
	}
	if path == "" {
		return "", "", fmt.Errorf("SQLite database URL %q names no file", s)
	}
	return SQLite, path, nil
}
