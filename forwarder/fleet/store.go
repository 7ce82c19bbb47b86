package fleet

import (
	"context"
	"time"

	"github.com/millbox/millbox/sqladapters"
)

// Store is what the fleet runs on its control database: the members, the
// catalog of tenants and who holds each. sqladapters.FleetStore, from
// postgres.NewFleet, mysql.NewFleet or sqlite.NewFleet, is one.
type Store interface {
	Heartbeat(ctx context.Context, e sqladapters.Executor, instance string, ttl time.Duration) (renewed bool, err error)
	LiveMembers(ctx context.Context, e sqladapters.Executor) ([]string, error)
	Leave(ctx context.Context, e sqladapters.Executor, instance string) error
	PutTenants(ctx context.Context, e sqladapters.Executor, tenants []sqladapters.FleetTenant) error
	RemoveTenants(ctx context.Context, e sqladapters.Executor, ids []string) error
	CatalogVersion(ctx context.Context, e sqladapters.Executor) (int64, error)
	Tenants(ctx context.Context, e sqladapters.Executor) ([]sqladapters.FleetTenant, error)
	OwnedTenants(ctx context.Context, e sqladapters.Executor, instance string) ([]sqladapters.FleetTenant, error)
	ClaimTenants(ctx context.Context, db sqladapters.DB, instance string, max int) ([]sqladapters.FleetTenant, error)
	ReleaseTenants(ctx context.Context, e sqladapters.Executor, instance string, ids []string) error
	DeleteRemoved(ctx context.Context, e sqladapters.Executor, instance string, ids []string) (int64, error)
}
