package dburl

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"testing"

	"github.com/idemgo/idem/internal/dbtest"
)

func TestOpen(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "idem.db")
	if _, err := Open(ctx, SQLite, path, Options{MustExist: true}); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("MustExist on a missing file: %v, want fs.ErrNotExist", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("MustExist created the file: %v", err)
	}
	for _, kind := range []string{SQLite, MySQL} {
		if _, err := Open(ctx, kind, path, Options{Partitioned: true}); err == nil {
			t.Errorf("%s: Partitioned accepted", kind)
		}
	}
	if _, err := Open(ctx, "redis", "x", Options{}); err == nil {
		t.Error("an unknown kind opened")
	}

	s, err := Open(ctx, SQLite, path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.Driver.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if s.Kind != SQLite || s.SQL == nil || s.Pool != nil || s.Partitioned {
		t.Fatalf("SQLite store: %+v", s)
	}
	if err := s.CheckFile(); err != nil {
		t.Fatalf("CheckFile on the open file: %v", err)
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckFile(); !errors.Is(err, ErrFileChanged) {
		t.Fatalf("CheckFile on a deleted file: %v, want ErrFileChanged", err)
	}
	if err := s.Ping(ctx); err != nil {
		t.Fatalf("the deleted inode still answers a ping (why CheckFile exists): %v", err)
	}
}

func TestOpenPostgres(t *testing.T) {
	t.Parallel()
	url, _ := dbtest.PostgresURL(t)
	ctx := context.Background()
	s, err := Open(ctx, Postgres, url, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Kind != Postgres || s.Pool == nil || s.SQL != nil || s.Partitioned {
		t.Fatalf("PostgreSQL store: %+v", s)
	}
	if err := s.Driver.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.CheckFile(); err != nil {
		t.Fatalf("CheckFile on a server: %v", err)
	}
	if _, err := Open(ctx, Postgres, url, Options{Partitioned: true}); err == nil {
		t.Fatal("Partitioned accepted on a plain idem_keys")
	}
}
