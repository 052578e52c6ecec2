package dburl

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string][2]string{
		"postgres://u@h/db?search_path=s": {Postgres, "postgres://u@h/db?search_path=s"},
		"postgresql://u@h/db":             {Postgres, "postgresql://u@h/db"},
		"mysql://root@h:3306/db":          {MySQL, "mysql://root@h:3306/db"},
		"mariadb://root@h/db":             {MySQL, "mariadb://root@h/db"},
		"x.db":                            {SQLite, "x.db"},
		"sqlite:x.db":                     {SQLite, "x.db"},
		"sqlite:///tmp/x.db":              {SQLite, "/tmp/x.db"},
		"file://x.db":                     {SQLite, "x.db"},
	} {
		kind, target, err := Parse(in)
		if err != nil || kind != want[0] || target != want[1] {
			t.Errorf("Parse(%q) = %q, %q, %v; want %q, %q", in, kind, target, err, want[0], want[1])
		}
	}
	for _, bad := range []string{"", "sqlserver://h/db", "sqlite:", "file:x.db?mode=ro", "x.db#y", "x%41.db"} {
		if _, _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q): no error", bad)
		}
	}
}
