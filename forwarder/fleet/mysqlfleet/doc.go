// Package mysqlfleet is the MySQL and MariaDB driver of the fleet
// (package forwarder/fleet), on database/sql and go-sql-driver/mysql: a
// Server opens a small pool per server whose every connection is
// dialled through the fleet's budget and closed once idle, gives each
// tenant (a database of the server) the mysql dialect with its tables
// qualified by that database, so that one pool serves every tenant of
// the server, and tells the fleet which tenants got rows.
//
//	srv, err := mysqlfleet.NewServer(mysqlfleet.ServerConfig{
//		DSN: "app:secret@tcp(db1:3306)/app?parseTime=true&interpolateParams=true",
//	})
//
// # Doorbell
//
// A fleet keeps no connection to an idle tenant, so it must learn from
// elsewhere that one wrote. AutoIncrementDoorbell (the default) reads
// the AUTO_INCREMENT of every tenant's outbox and scheduled table in one
// query of information_schema.TABLES, on one connection per server,
// every 250 ms while a tenant of the server rang within the last minute
// and every second otherwise, and rings the tenants whose counters
// moved: about 15 µs of server CPU per tenant and look. The counter
// moves at the insert, before the commit, so the fleet may look before
// the rows are visible, and looks again shortly after. Size the server's
// table_definition_cache above the tenants' tables (9 per tenant), or
// every look reopens their definitions. A binlog stream would ring at
// the commit; it is not offered.
//
// # Connections
//
// A handle (Server.Open) is a *sql.DB with at most ServerConfig.MaxConns
// connections, none at first, each closed once idle for the idle time
// the fleet gives (database/sql checks every idle time, at least every
// second). Count the fleet's connections in
// information_schema.PROCESSLIST by the DSN's user: give the fleet a user
// of its own.
package mysqlfleet
