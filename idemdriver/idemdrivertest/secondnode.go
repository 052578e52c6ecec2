package idemdrivertest

import (
	"net"
	"net/url"
	"os"
	"strconv"
	"testing"
)

// The second-node option: the cases where two processes meet (two
// maintainers, Harness.SecondDriver, a takeover from another node) run their
// second process through another node of the same database when one of these
// variables names it. Unset, the second process uses the first one's server.
// The topology scripts (scripts/topology) set them: another Galera node, or
// the PostgreSQL server itself beside its pgbouncer.
const (
	// EnvSecondPostgres is a PostgreSQL URL whose host, port, user and
	// password reach the TEST_DATABASE_URL database another way, for
	// example postgres://postgres@127.0.0.1:5432 beside a pgbouncer.
	EnvSecondPostgres = "TEST_DATABASE_URL_2"
	// EnvSecondMySQL is a mysql:// URL whose host, port, user and password
	// reach another node of the TEST_MYSQL_URL cluster, for example
	// mysql://root@127.0.0.1:23307 for a second Galera node.
	EnvSecondMySQL = "TEST_MYSQL_URL_2"
)

// Node is the address and credentials of the second node.
type Node struct {
	Host     string
	Port     uint16
	User     string
	Password string
	HasUser  bool // the URL names a user (else the first node's is kept)
}

// SecondNode returns the node named by the environment variable env
// (EnvSecondPostgres or EnvSecondMySQL), and false when it is unset. A URL
// without a port, or with another one that does not parse, fails t.
func SecondNode(t testing.TB, env string) (Node, bool) {
	t.Helper()
	raw := os.Getenv(env)
	if raw == "" {
		return Node{}, false
	}
	u, err := url.Parse(raw)
	if err != nil || u.Port() == "" {
		t.Fatalf("idemdrivertest: %s=%q: want scheme://[user[:password]@]host:port: %v", env, raw, err)
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	if err != nil {
		t.Fatalf("idemdrivertest: %s: port: %v", env, err)
	}
	n := Node{Host: u.Hostname(), Port: uint16(port)}
	if u.User != nil {
		n.User, n.HasUser = u.User.Username(), true
		n.Password, _ = u.User.Password()
	}
	return n, true
}

// OnSecondNode returns dbURL (a URL of the first node, with the test's
// database or schema in its path and query) with its host, port and, when
// the second node's URL has them, user and password replaced by the node's
// named by env: the same database through the second node. Without the
// variable it returns dbURL unchanged.
func OnSecondNode(t testing.TB, env, dbURL string) string {
	t.Helper()
	n, ok := SecondNode(t, env)
	if !ok {
		return dbURL
	}
	u, err := url.Parse(dbURL)
	if err != nil {
		t.Fatalf("idemdrivertest: OnSecondNode: %v", err)
	}
	u.Host = net.JoinHostPort(n.Host, strconv.Itoa(int(n.Port)))
	if n.HasUser {
		u.User = url.UserPassword(n.User, n.Password)
		if n.Password == "" {
			u.User = url.User(n.User)
		}
	}
	return u.String()
}
