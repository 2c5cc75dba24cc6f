package sqlfilter_test

import (
	"database/sql"
	"errors"
	"strings"
	"testing"

	"github.com/warden-go/warden"
	"github.com/warden-go/warden/internal/sqlfilter"
	"github.com/warden-go/warden/recordlock"
)

// count is a store's reading that counts every ? and refuses a fragment
// holding "!" or, unless lineComment, ending in a -- comment.
func count(s string, lineComment bool) (int, error) {
	if strings.Contains(s, "!") {
		return 0, errors.New("refused")
	}
	if !lineComment && strings.Contains(s, "--") {
		return 0, errors.New("ends in a comment")
	}
	return strings.Count(s, "?"), nil
}

func TestCheck(t *testing.T) {
	st := sqlfilter.Store{Name: "teststore", Count: count, OrderByWhy: "o", NamedWhy: "n", CountWhy: "c"}
	for _, f := range []recordlock.SQL{
		{},
		{Where: "a = ? AND b = ?", Args: []any{1, "x"}, OrderBy: "a DESC, id"},
		{Where: "a = 1 -- note"},
	} {
		if err := st.Check(f); err != nil {
			t.Errorf("Check(%+v): %v", f, err)
		}
	}
	for _, c := range []struct {
		f    recordlock.SQL
		want string
	}{
		{recordlock.SQL{Where: "a = ?"}, "Where has 1 ? placeholders and there are 0 Args"},
		{recordlock.SQL{Where: "a = 1", Args: []any{1}}, "Where has 0 ? placeholders and there are 1 Args"},
		{recordlock.SQL{OrderBy: "?"}, "OrderBy has 1 ? placeholders"},
		{recordlock.SQL{OrderBy: "id -- x"}, "OrderBy: ends in a comment"},
		{recordlock.SQL{Where: "a = !"}, "Where: refused"},
		{recordlock.SQL{Where: "a = ?", Args: []any{sql.Named("owner", 1)}}, "Args[0] is a sql.NamedArg"},
		{recordlock.SQL{Where: "a = ?", Args: []any{&sql.NamedArg{Name: "now"}}}, "Args[0] is a sql.NamedArg"},
	} {
		err := st.Check(c.f)
		if !errors.Is(err, warden.ErrInvalidArgument) || !strings.HasPrefix(err.Error(), "teststore: ") || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Check(%+v) = %v, want ErrInvalidArgument saying %q", c.f, err, c.want)
		}
	}
}
