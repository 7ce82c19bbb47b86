package dialecttest

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/internal/sqlstore"
	"github.com/millbox/millbox/sqladapters/ops"
)

// opsBuilder has the statements of the operations API that the builders
// of millbox's database packages build besides the store's.
type opsBuilder interface {
	TopicStats() sqladapters.Query
	InboxStats() sqladapters.Query
	PartitionLeases() sqladapters.Query
	SelectDeadLetters(w ops.Where, afterID int64, limit int) sqladapters.Query
	SelectDeadLetterIDs(w ops.Where, afterID int64, limit int) sqladapters.Query
	CountDeadLetters(w ops.Where) sqladapters.Query
	GroupDeadLetters(w ops.Where, limit int) sqladapters.Query
	DeleteDeadLetters(ids []int64) sqladapters.Query
	CountForwardedBefore(t time.Time) sqladapters.Query
	SelectForwardedIDs(t time.Time, afterID int64, limit int) sqladapters.Query
	CountInboxBefore(t time.Time) sqladapters.Query
}

// addOpsStatements adds the statements of the operations API when b
// builds them: with no filter, and with every filter set.
func addOpsStatements(qs map[string]sqladapters.Query, b sqlstore.Builder) {
	od, ok := b.(opsBuilder)
	if !ok {
		return
	}
	now := time.Now()
	all := ops.Where{IDs: []int64{1, 2}, Topic: "t", Key: "k", ErrorContains: "e", DeadBefore: now, DeadAfter: now.Add(-time.Hour)}
	for suffix, w := range map[string]ops.Where{"": {}, "Filtered": all} {
		qs["OpsSelectDeadLetters"+suffix] = od.SelectDeadLetters(w, 0, 10)
		qs["OpsSelectDeadLetterIDs"+suffix] = od.SelectDeadLetterIDs(w, 0, 10)
		qs["OpsCountDeadLetters"+suffix] = od.CountDeadLetters(w)
		qs["OpsGroupDeadLetters"+suffix] = od.GroupDeadLetters(w, 10)
	}
	qs["OpsTopicStats"] = od.TopicStats()
	qs["OpsInboxStats"] = od.InboxStats()
	qs["OpsPartitionLeases"] = od.PartitionLeases()
	qs["OpsDeleteDeadLetters"] = od.DeleteDeadLetters([]int64{1, 2})
	qs["OpsCountForwardedBefore"] = od.CountForwardedBefore(now)
	qs["OpsSelectForwardedIDs"] = od.SelectForwardedIDs(now, 0, 10)
	qs["OpsCountInboxBefore"] = od.CountInboxBefore(now)
}
