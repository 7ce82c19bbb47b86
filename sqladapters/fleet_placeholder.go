package sqladapters

// FleetTenant is a tenant of a fleet's catalog (placeholder until the
// fleet store lands).
type FleetTenant struct {
	ID, Server, Database, Schema string
	Removed                      bool
	Owner                        string
}
