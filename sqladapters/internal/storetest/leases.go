package storetest

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Leases: partition rows, members and the claims of forwarder instances.
var leaseCases = []testCase{
	{"Partitions", testPartitions},
	{"Members", testMembers},
	{"Leases", testLeases},
	{"LeasesConcurrent", testLeasesConcurrent},
	{"PartitionLeases", testPartitionLeases},
	{"MemberSettings", testMemberSettings},
	{"MigrateMemberSettings", testMigrateMemberSettings},
}

// testPartitions creates lease rows, idempotently and never fewer.
func testPartitions(e *env) {
	e.migrated()
	if n := e.partitions(); n != 0 {
		e.t.Fatalf("%d partitions before EnsurePartitions", n)
	}
	for _, c := range []struct{ ensure, want int }{{4, 4}, {4, 4}, {2, 4}, {7, 7}, {0, 7}} {
		e.check(e.d.EnsurePartitions(e.ctx, e.db, c.ensure), "EnsurePartitions")
		if n := e.partitions(); n != c.want {
			e.t.Fatalf("EnsurePartitions(%d): %d partitions, want %d", c.ensure, n, c.want)
		}
	}
	e.noneInUse("EnsurePartitions")
}

// testMembers counts live instances: a heartbeat adds or extends one,
// RemoveMember deletes one, and an expired one does not count.
func testMembers(e *env) {
	e.migrated()
	beat := func(instance string, ttl time.Duration) {
		e.t.Helper()
		e.check(e.d.Heartbeat(e.ctx, e.db, instance, ttl), "Heartbeat")
	}
	if n := e.members(); n != 0 {
		e.t.Fatalf("%d members before any heartbeat", n)
	}
	long := strings.Repeat("i", 300)
	beat("a", time.Minute)
	beat("b", time.Minute)
	beat("a", time.Minute)
	beat(long, time.Minute)
	if n := e.members(); n != 3 {
		e.t.Fatalf("%d members, want 3", n)
	}
	beat("expired", -time.Hour)
	if n := e.members(); n != 3 {
		e.t.Fatalf("%d members with one expired, want 3", n)
	}
	beat(long, -time.Hour) // an instance whose heartbeat lapsed
	if n := e.members(); n != 2 {
		e.t.Fatalf("%d members after one lapsed, want 2", n)
	}
	e.check(e.d.RemoveMember(e.ctx, e.db, "b"), "RemoveMember")
	e.check(e.d.RemoveMember(e.ctx, e.db, "unknown"), "RemoveMember")
	if n := e.members(); n != 1 {
		e.t.Fatalf("%d members after removing one, want 1", n)
	}
	e.noneInUse("members")
}

// testLeases claims, renews and releases partitions with two instances:
// their leases never overlap, and an expired lease is free.
func testLeases(e *env) {
	e.migrated()
	e.check(e.d.EnsurePartitions(e.ctx, e.db, 4), "EnsurePartitions")
	claim := func(instance string, ttl time.Duration, max int) {
		e.t.Helper()
		e.check(e.d.ClaimPartitions(e.ctx, e.db, instance, ttl, max), "ClaimPartitions")
	}
	release := func(instance string, ps []int) {
		e.t.Helper()
		e.check(e.d.ReleasePartitions(e.ctx, e.db, instance, ps), "ReleasePartitions")
	}
	long := strings.Repeat("b", 300)
	claim("a", time.Minute, 3)
	a := e.owned("a")
	if len(a) != 3 || !slices.IsSorted(a) {
		e.t.Fatalf("a claimed %v, want 3 partitions in order", a)
	}
	claim(long, time.Minute, 3)
	b := e.owned(long)
	if len(b) != 1 || slices.Contains(a, b[0]) {
		e.t.Fatalf("b claimed %v next to a's %v, want the one left", b, a)
	}
	claim("c", time.Minute, 4)
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("c claimed %v with every partition leased", c)
	}
	e.check(e.d.RenewPartitions(e.ctx, e.db, "a", time.Minute), "RenewPartitions")
	if got := e.owned("a"); !slices.Equal(got, a) {
		e.t.Fatalf("a owns %v after renewing, want %v", got, a)
	}
	release("a", nil)
	release("a", []int{})
	release(long, a) // not b's: nothing changes
	if got := e.owned("a"); !slices.Equal(got, a) {
		e.t.Fatalf("a owns %v after b released a's partitions, want %v", got, a)
	}
	release("a", a[:1])
	if got := e.owned("a"); !slices.Equal(got, a[1:]) {
		e.t.Fatalf("a owns %v after releasing %d, want %v", got, a[0], a[1:])
	}
	// A lease that expired at once is not owned and is free to claim.
	claim("c", -time.Hour, 1)
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("c owns %v through an expired lease", c)
	}
	e.check(e.d.RenewPartitions(e.ctx, e.db, "c", time.Minute), "RenewPartitions")
	if c := e.owned("c"); len(c) != 0 {
		e.t.Fatalf("renewing revived c's expired lease: %v", c)
	}
	claim(long, time.Minute, 1)
	if got, want := e.owned(long), []int{min(a[0], b[0]), max(a[0], b[0])}; !slices.Equal(got, want) {
		e.t.Fatalf("b owns %v after claiming the expired lease, want %v", got, want)
	}
	if got := e.owned("nobody"); len(got) != 0 {
		e.t.Fatalf("an unknown instance owns %v", got)
	}
	e.noneInUse("leases")
}

// testLeasesConcurrent makes lease rows and claims them from several
// instances at once, as forwarders starting together do: no partition is
// owned twice, and none more than its claimer asked for. A claim may fail
// (a deadlock the database resolves); the next one succeeds.
func testLeasesConcurrent(e *env) {
	e.migrated()
	const instances, partitions, each = 4, 8, 3
	errs := make(chan error, instances)
	for range instances {
		go func() { errs <- e.d.EnsurePartitions(e.ctx, e.db, partitions) }()
	}
	e.check(errors.Join(collect(errs)...), "concurrent EnsurePartitions")
	if n := e.partitions(); n != partitions {
		e.t.Fatalf("%d partitions after concurrent EnsurePartitions(%d)", n, partitions)
	}
	for i := range instances {
		go func() { errs <- e.d.ClaimPartitions(e.ctx, e.db, fmt.Sprint("i", i), time.Minute, each) }()
	}
	for _, err := range collect(errs) {
		e.t.Logf("concurrent ClaimPartitions: %v", err)
	}
	owners := func() map[int]string {
		e.t.Helper()
		owner := map[int]string{}
		for i := range instances {
			instance := fmt.Sprint("i", i)
			owned := e.owned(instance)
			if len(owned) > each {
				e.t.Fatalf("%s owns %v, more than the %d it claimed", instance, owned, each)
			}
			for _, p := range owned {
				if other, ok := owner[p]; ok {
					e.t.Fatalf("partition %d is owned by %s and %s", p, other, instance)
				}
				owner[p] = instance
			}
		}
		return owner
	}
	owner := owners()
	// Each instance tops its leases up to what it wants, one after the
	// other: every partition ends up owned.
	for i := range instances {
		instance := fmt.Sprint("i", i)
		if want := each - len(e.owned(instance)); want > 0 {
			e.check(e.d.ClaimPartitions(e.ctx, e.db, instance, time.Minute, want), "ClaimPartitions")
		}
	}
	if after := owners(); len(after) != partitions {
		e.t.Fatalf("%d of %d partitions owned after every instance claimed (%d after the concurrent claims)", len(after), partitions, len(owner))
	}
	e.noneInUse("leases")
}

// testPartitionLeases lists every partition with its live owner and how
// long its lease lasts; a free or expired lease has neither.
func testPartitionLeases(e *env) {
	e.migrated()
	leases := func() []sqladapters.PartitionLease {
		e.t.Helper()
		ls, err := e.d.PartitionLeases(e.ctx, e.db)
		e.check(err, "PartitionLeases")
		return ls
	}
	if ls := leases(); len(ls) != 0 {
		e.t.Fatalf("leases before EnsurePartitions: %+v", ls)
	}
	e.check(e.d.EnsurePartitions(e.ctx, e.db, 4), "EnsurePartitions")
	e.check(e.d.ClaimPartitions(e.ctx, e.db, "a", time.Minute, 2), "ClaimPartitions")
	e.check(e.d.ClaimPartitions(e.ctx, e.db, "b", -time.Hour, 1), "ClaimPartitions")
	ls := leases()
	if len(ls) != 4 {
		e.t.Fatalf("%d leases, want 4: %+v", len(ls), ls)
	}
	a := e.owned("a")
	for i, l := range ls {
		switch {
		case l.Partition != i:
			e.t.Fatalf("lease %d is of partition %d: %+v", i, l.Partition, ls)
		case slices.Contains(a, i) && (l.Owner != "a" || l.ExpiresIn <= 0 || l.ExpiresIn > time.Minute):
			e.t.Fatalf("partition %d, leased to a for a minute: %+v", i, l)
		case !slices.Contains(a, i) && (l.Owner != "" || l.ExpiresIn != 0):
			e.t.Fatalf("partition %d, free or expired: %+v", i, l)
		}
	}
	e.noneInUse("PartitionLeases")
}

// settings are forwarder settings every instance of an outbox must agree
// on, as a forwarder records them.
func settings(holds, exactlyOnce string) []sqladapters.Setting {
	return []sqladapters.Setting{{Name: "DeadLetterHoldsKey", Value: holds}, {Name: "ExactlyOnce", Value: exactlyOnce}}
}

// mismatch checks that err names setting, this instance's and the other
// instance's values, and the other instance.
func (e *env) mismatch(err error, setting, mine, theirs, instance string) {
	e.t.Helper()
	var m *sqladapters.SettingMismatchError
	if !errors.As(err, &m) || !errors.Is(err, sqladapters.ErrInvalidConfig) ||
		*m != (sqladapters.SettingMismatchError{Setting: setting, Mine: mine, Theirs: theirs, Instance: instance}) ||
		!strings.Contains(err.Error(), setting) || !strings.Contains(err.Error(), instance) {
		e.t.Fatalf("HeartbeatSettings: %v; want a *SettingMismatchError naming %s (%q here, %q on %s)", err, setting, mine, theirs, instance)
	}
}

// testMemberSettings records the settings of forwarder instances with
// their heartbeats: instances that agree run side by side; one that
// disagrees is told which setting, which values and which instance, the
// first of its settings in their order, and the instance it disagrees
// with is told at its next heartbeat; instances that left, expired or
// record fewer settings (an earlier version) are not compared.
func testMemberSettings(e *env) {
	e.migrated()
	beat := func(instance string, s []sqladapters.Setting) error {
		return e.d.HeartbeatSettings(e.ctx, e.db, instance, time.Minute, s)
	}
	e.check(beat("a", settings("true", "false")), "first instance")
	e.check(beat("b", settings("true", "false")), "an instance that agrees")
	e.check(beat("a", settings("true", "false")), "a renewal")
	if n := e.members(); n != 2 {
		e.t.Fatalf("%d members, want 2", n)
	}
	e.mismatch(beat("c", settings("false", "true")), "DeadLetterHoldsKey", "false", "true", "a")
	// c recorded its row: a learns of the disagreement too. Refusing to
	// run, c removes itself.
	e.mismatch(beat("a", settings("true", "false")), "DeadLetterHoldsKey", "true", "false", "c")
	e.check(e.d.RemoveMember(e.ctx, e.db, "c"), "RemoveMember")
	e.mismatch(beat("d", settings("true", "true")), "ExactlyOnce", "true", "false", "a")
	e.mismatch(beat("b", settings("true", "false")), "ExactlyOnce", "false", "true", "d")
	// A plain heartbeat keeps what a row recorded.
	e.check(e.d.RemoveMember(e.ctx, e.db, "d"), "RemoveMember")
	e.check(e.d.Heartbeat(e.ctx, e.db, "b", time.Minute), "Heartbeat")
	e.mismatch(beat("e", settings("false", "false")), "DeadLetterHoldsKey", "false", "true", "a")
	e.check(e.d.RemoveMember(e.ctx, e.db, "e"), "RemoveMember")

	// An expired instance is not compared.
	e.mismatch(e.d.HeartbeatSettings(e.ctx, e.db, "gone", -time.Second, settings("false", "true")), "DeadLetterHoldsKey", "false", "true", "a")
	e.check(beat("a", settings("true", "false")), "a renewal next to an expired instance")
	// An instance of an earlier version records no settings, or fewer.
	e.check(e.d.Heartbeat(e.ctx, e.db, "old", time.Minute), "Heartbeat")
	e.check(e.d.HeartbeatSettings(e.ctx, e.db, "older", time.Minute, []sqladapters.Setting{{Name: "ExactlyOnce", Value: "false"}}), "fewer settings")
	e.check(beat("a", append(settings("true", "false"), sqladapters.Setting{Name: "Later", Value: "x"})), "a renewal next to earlier versions")
	e.mismatch(beat("f", settings("true", "true")), "ExactlyOnce", "true", "false", "a")
	if n := e.members(); n != 5 {
		e.t.Fatalf("%d members, want a, b, old, older and f", n)
	}
	for _, bad := range [][]sqladapters.Setting{{{Name: "", Value: "x"}}, {{Name: "x", Value: "1"}, {Name: "x", Value: "2"}}} {
		if err := beat("g", bad); !errors.Is(err, sqladapters.ErrInvalidConfig) {
			e.t.Fatalf("HeartbeatSettings with %+v: %v, want ErrInvalidConfig", bad, err)
		}
	}
	e.noneInUse("HeartbeatSettings")
}

// testMigrateMemberSettings upgrades an installation whose instances are
// running: their member rows stay, their heartbeats (of a version that
// records no settings) work on the new schema, and the version's
// statements run again change nothing where they may run again.
func testMigrateMemberSettings(e *env) {
	d, rest := e.migrateTo(8)
	if len(rest) == 0 || rest[0].Version != 8 {
		e.t.Fatalf("versions after 7: %+v, want 8 first", rest)
	}
	e.check(d.Heartbeat(e.ctx, e.db, "old", time.Minute), "Heartbeat before the migration")
	e.check(sqladapters.Migrate(e.ctx, e.db, d), "migrate to the latest version")
	if d.Name() != "sqlite" { // SQLite cannot add a column only where it is missing
		for _, stmt := range rest[0].Statements {
			_, err := e.db.Exec(e.ctx, stmt)
			e.check(err, "version 8's statement again")
		}
	}
	e.check(d.Heartbeat(e.ctx, e.db, "old", time.Minute), "Heartbeat after the migration")
	e.check(d.HeartbeatSettings(e.ctx, e.db, "new", time.Minute, settings("true", "false")), "HeartbeatSettings")
	if n := e.members(); n != 2 {
		e.t.Fatalf("%d members after the migration, want the old and the new instance", n)
	}
	e.noneInUse("Migrate")
}
