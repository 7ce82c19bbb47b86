package dialecttest

import (
	"time"

	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/ops"
)

// addOpsStatements adds the statements of the operations API when d
// implements it: with no filter, and with every filter set.
func addOpsStatements(qs map[string]sqladapters.Query, d sqladapters.Dialect) {
	od, ok := d.(ops.Dialect)
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
