package sqlstore

import (
	"fmt"
	"strings"

	"github.com/millbox/millbox/sqladapters"
)

// Object is one name an installation's migrations give a table, an index
// or a sequence, unqualified, in the namespace where such names clash (a
// schema on PostgreSQL, a database's tables on MySQL, a file on SQLite).
// Every Builder lists its own (Builder.Objects): the tables its methods
// name, the indexes and sequences the migrations create, those a later
// migration drops too, and the names the database gives implicitly (a
// primary key's index). The store suite checks the list against the
// database's catalog after migrating, so a migration that creates a name
// the list lacks fails it.
type Object struct {
	// Name is the object's name, or the start of the names of the
	// objects maintenance creates while the installation lives (see
	// Prefix).
	Name string
	// Table tells a table, which the dialect's Tables lists, from an
	// index, a sequence or a partition.
	Table bool
	// Prefix makes Name the start of the names of the partitions of a
	// partitioned outbox and of their indexes: Name followed by a digit.
	Prefix bool
}

// Matches tells whether name is the object's name, or one of its names
// when it is a Prefix; fold compares them case-insensitively.
func (o Object) Matches(name string, fold bool) bool {
	if fold {
		name, o.Name = strings.ToLower(name), strings.ToLower(o.Name)
	}
	if !o.Prefix {
		return name == o.Name
	}
	rest, ok := strings.CutPrefix(name, o.Name)
	return ok && rest != "" && rest[0] >= '0' && rest[0] <= '9'
}

// TableNames returns the names of the tables among objs, in their order.
func TableNames(objs []Object) []string {
	var out []string
	for _, o := range objs {
		if o.Table && !o.Prefix {
			out = append(out, o.Name)
		}
	}
	return out
}

// CheckNames refuses table names that lead two objects of one
// installation to one name: the tables and indexes named after the outbox
// and those named after the inbox share a namespace, and a migration
// that finds a name taken skips its CREATE ... IF NOT EXISTS, leaving the
// table missing. fold compares names case-insensitively, as the database
// does. opts names the options in the error ("postgres.Options").
func CheckNames(opts, outbox, inbox string, objs []Object, fold bool) error {
	for i, a := range objs {
		for _, b := range objs[i+1:] {
			var name string
			switch {
			case !a.Prefix && b.Matches(a.Name, fold):
				name = a.Name
			case !b.Prefix && a.Matches(b.Name, fold):
				name = b.Name
			default:
				continue
			}
			return fmt.Errorf("%w: %s.OutboxTable %q and InboxTable %q both lead to a table or index named %q",
				sqladapters.ErrInvalidName, opts, outbox, inbox, name)
		}
	}
	return nil
}
