package ferry_test

import (
	"context"
	"strings"
	"testing"

	"github.com/ferryhq/ferry"
)

// TestDatabaseErrorsKeepThePasswordOut: a database setting that cannot be
// used is refused with an error that names what is wrong without the
// password in it (the CLI prints the error; a supervisor logs it). A
// postgres:// URL that does not parse (a password whose % or @ is not
// percent-encoded, a port that is not a number) was quoted whole, and a
// connection string of another form was too. (Found by an audit.)
func TestDatabaseErrorsKeepThePasswordOut(t *testing.T) {
	for _, db := range []string{
		"postgres://ferry:hunter2%zz@127.0.0.1:5432/ferry",
		"postgres://ferry:hun%ter2@127.0.0.1:5432/ferry",
		"postgres://ferry:hunter2@127.0.0.1:54x32/ferry",
		"postgresql://ferry:hunter2@127.0.0.1:5432/ferry?ferry_max_conns=2&x=%zz",
		"host=127.0.0.1 user=ferry password=hunter2 dbname=ferry",
		"host=127.0.0.1 port=5432 password=hunter2:x",
		"mysql://ferry:hunter2@127.0.0.1/ferry",
	} {
		for name, open := range map[string]func() error{
			"OpenStore": func() error {
				st, err := ferry.OpenStore(context.Background(), db)
				if err == nil {
					st.Close()
				}
				return err
			},
			"Open": func() error {
				e, err := ferry.Open(context.Background(), ferry.Config{Database: db})
				if err == nil {
					e.Close()
				}
				return err
			},
			"Migrate": func() error { return ferry.Migrate(context.Background(), db) },
		} {
			err := open()
			if err == nil {
				t.Errorf("%s(%q) worked", name, db)
				continue
			}
			if msg := err.Error(); strings.Contains(msg, "hunter2") || strings.Contains(msg, "hun%ter") || strings.Contains(msg, "%te") {
				t.Errorf("%s(%q): error %q shows the password", name, db, msg)
			}
		}
	}
}
