package manager

import "testing"

func TestRebind(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`WHERE a = ? AND b = ?`, `WHERE a = $1 AND b = $2`},
		{`WHERE ? = '' OR owner = ?`, `WHERE $1 = '' OR owner = $2`},
		{`SELECT '?', "a?b", ? -- why?` + "\n" + `, ?`, `SELECT '?', "a?b", $1 -- why?` + "\n" + `, $2`},
		{`SELECT 'it''s ?', ?`, `SELECT 'it''s ?', $1`},
		{`SELECT 'open ?`, `SELECT 'open ?`},
		{`SELECT ? -- end ?`, `SELECT $1 -- end ?`},
	} {
		if got := rebind(c.in); got != c.want {
			t.Errorf("rebind(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

func TestPgDDLSpellsEveryMigration(t *testing.T) {
	got := pgDDL(`CREATE TABLE x (n INTEGER NOT NULL, k BLOB, s TEXT, big_integer_col TEXT); ALTER TABLE y ADD COLUMN f INTEGER;`)
	want := `CREATE TABLE x (n BIGINT NOT NULL, k BYTEA, s TEXT, big_integer_col TEXT); ALTER TABLE y ADD COLUMN f BIGINT;`
	if got != want {
		t.Fatalf("pgDDL = %q, want %q", got, want)
	}
}
