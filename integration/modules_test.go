package integration_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/mod/modfile"
)

// rootModule is the module path of the library.
const rootModule = "github.com/millbox/millbox"

// develVersion is a version no proxy has: the user modules these tests
// write require the repository's modules at it, and replace directives
// provide the code. The repository's modules require each other at it
// until the first release, then at the last release (.ci/release sets
// it); go.work provides their code.
const develVersion = "v0.0.0-00010101000000-000000000000"

// forbiddenModules are the modules a user of the PostgreSQL outbox must
// not get in the module graph: Kafka, AMQP, NATS and Redis clients and
// SQLite drivers, which live in the submodules that need them.
var forbiddenModules = []string{
	"github.com/IBM/sarama",
	"github.com/Shopify/sarama",
	"github.com/twmb/franz-go", // also kfake, kmsg, kadm
	"github.com/ThreeDotsLabs/watermill-kafka",
	"github.com/ThreeDotsLabs/watermill-amqp",
	"github.com/rabbitmq/amqp091-go",
	"github.com/streadway/amqp",
	"github.com/nats-io/",
	"github.com/ThreeDotsLabs/watermill-nats",
	"github.com/redis/go-redis",
	"github.com/ThreeDotsLabs/watermill-redisstream",
	"modernc.org/",
	"github.com/mattn/go-sqlite3",
	rootModule + "/forwarder/kafkabatch",
	rootModule + "/forwarder/amqpbatch",
	rootModule + "/forwarder/redisbatch",
	rootModule + "/middleware/kafkaid",
	rootModule + "/sqladapters/sqlite/modernc",
}

// userMain is the program of a service with a PostgreSQL outbox: it
// imports forwarder, sqladapters/postgres and sqladapters/pgxv5.
const userMain = `package main

import (
	"context"
	"log"
	"os"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/ThreeDotsLabs/watermill/pubsub/gochannel"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/sqladapters"
	"github.com/millbox/millbox/sqladapters/pgxv5"
	"github.com/millbox/millbox/sqladapters/postgres"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	db, dialect := pgxv5.WrapPool(pool), postgres.MustNew(postgres.Options{Notify: true})
	if err := sqladapters.Migrate(ctx, db, dialect); err != nil {
		log.Fatal(err)
	}
	destination := gochannel.NewGoChannel(gochannel.Config{}, watermill.NopLogger{})
	fwd, err := forwarder.New(forwarder.Config{DB: db, Dialect: dialect, Destination: destination})
	if err != nil {
		log.Fatal(err)
	}
	defer fwd.Close()
	if err := fwd.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
`

// checkout returns the root of the repository: the parent of this
// module's directory, holding the root module's go.mod.
func checkout(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	if f := parseModFile(t, filepath.Join(root, "go.mod")); f.Module.Mod.Path != rootModule {
		t.Fatalf("%s is module %s, want %s", root, f.Module.Mod.Path, rootModule)
	}
	return root
}

func parseModFile(t *testing.T, path string) *modfile.File {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := modfile.Parse(path, data, nil)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// goCommand runs the go command in dir as a user outside this repository
// would: no workspace, the module cache of this machine, the proxy the
// environment names. It returns the standard output.
func goCommand(t *testing.T, dir string, args ...string) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed: %v", err)
	}
	proxy, err := exec.Command(goBin, "env", "GOPROXY").Output()
	if err != nil {
		t.Fatalf("go env GOPROXY: %v", err)
	}
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool {
		return strings.HasPrefix(kv, "GOWORK=") || strings.HasPrefix(kv, "GOFLAGS=") || strings.HasPrefix(kv, "GOPROXY=")
	})
	env = append(env, "GOWORK=off", "GOFLAGS=-mod=mod", "GOPROXY="+strings.TrimSpace(string(proxy)))
	cmd := exec.Command(goBin, args...)
	cmd.Dir, cmd.Env = dir, env
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go %s in %s: %v\n%s%s", strings.Join(args, " "), dir, err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// writeUserModule writes a module of go.mod, go.sum and files into a new
// directory. go.sum starts with the checksums of the given go.sum files,
// so that the go command needs no checksum database for modules the
// repository already uses.
func writeUserModule(t *testing.T, goMod string, sums []string, files map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	var sum []byte
	for _, s := range sums {
		data, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		sum = append(sum, data...)
	}
	files["go.mod"], files["go.sum"] = goMod, string(sum)
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestUserModuleGraph writes the module of a service that uses the
// PostgreSQL outbox (forwarder, sqladapters/postgres, sqladapters/pgxv5)
// and checks that go list -m all, after go mod tidy, has no Kafka, AMQP or
// SQLite module in it: those come only with the submodules that need them.
func TestUserModuleGraph(t *testing.T) {
	root := checkout(t)
	goMod := "module example.com/orders\n\ngo 1.26.0\n\n" +
		"require " + rootModule + " " + develVersion + "\n\n" +
		"replace " + rootModule + " => " + root + "\n"
	dir := writeUserModule(t, goMod, []string{filepath.Join(root, "go.sum")}, map[string]string{"main.go": userMain})
	goCommand(t, dir, "mod", "tidy")
	goCommand(t, dir, "build", "-o", os.DevNull, ".")
	graph := strings.Fields(goCommand(t, dir, "list", "-m", "-f", "{{.Path}}", "all"))
	if !slices.Contains(graph, "github.com/jackc/pgx/v5") || !slices.Contains(graph, rootModule) {
		t.Fatalf("go list -m all lacks pgx or millbox, so the check below checks nothing:\n%s", strings.Join(graph, "\n"))
	}
	t.Logf("go list -m all: %d modules\n%s", len(graph), strings.Join(graph, "\n"))
	for _, m := range graph {
		if forbidden(m) {
			t.Errorf("module %s is in the graph of a user of forwarder, sqladapters/postgres and sqladapters/pgxv5", m)
		}
	}
}

// forbidden reports whether module path m is, or is under, one of
// forbiddenModules; an entry ending in a slash is a prefix.
func forbidden(m string) bool {
	for _, f := range forbiddenModules {
		if strings.HasSuffix(f, "/") && strings.HasPrefix(m, f) || m == f || strings.HasPrefix(m, f+"/") {
			return true
		}
	}
	return false
}

// publishedModules are the modules of this repository users require or
// run with go run ...@version: a replace directive in them would make
// go run refuse the module, and is ignored in a dependency anyway.
var publishedModules = []string{
	".",
	"forwarder/kafkabatch",
	"forwarder/amqpbatch",
	"middleware/kafkaid",
	"sqladapters/sqlite/modernc",
	"sqladapters/cmd/millbox",
}

func TestPublishedModulesHaveNoReplace(t *testing.T) {
	root := checkout(t)
	for _, dir := range publishedModules {
		f := parseModFile(t, filepath.Join(root, dir, "go.mod"))
		want := rootModule
		if dir != "." {
			want += "/" + dir
		}
		if f.Module.Mod.Path != want {
			t.Errorf("%s/go.mod: module %s, want %s", dir, f.Module.Mod.Path, want)
		}
		for _, r := range f.Replace {
			t.Errorf("%s/go.mod replaces %s with %s; go run %s@version would refuse the module", dir, r.Old.Path, r.New.Path, want)
		}
	}
}

// TestWorkspaceListsEveryModule checks that go.work uses every module of
// the repository, so that the commands run from the root build and test
// all of them.
func TestWorkspaceListsEveryModule(t *testing.T) {
	root := checkout(t)
	data, err := os.ReadFile(filepath.Join(root, "go.work"))
	if err != nil {
		t.Fatal(err)
	}
	work, err := modfile.ParseWork("go.work", data, nil)
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	for _, u := range work.Use {
		used[filepath.Clean(u.Path)] = true
	}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.Name() != "go.mod" {
			return nil
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		if !used[rel] {
			t.Errorf("go.work does not use the module in %s", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}

// TestRunCommandFromUserModule runs the millbox command the way a user
// module does, go run with the command's module in its graph and no
// workspace: the command's go.mod must be complete on its own. migrate
// sql prints the schema of a Postgres installation in a schema of its own.
func TestRunCommandFromUserModule(t *testing.T) {
	root := checkout(t)
	cmdModule := rootModule + "/sqladapters/cmd/millbox"
	goMod := "module example.com/ops\n\ngo 1.26.0\n\n" +
		"tool " + cmdModule + "\n\n" +
		"require " + cmdModule + " " + develVersion + "\n\n"
	for _, dir := range []string{".", "sqladapters/sqlite/modernc", "sqladapters/cmd/millbox"} {
		path := rootModule
		if dir != "." {
			path += "/" + dir
		}
		goMod += "replace " + path + " => " + filepath.Join(root, dir) + "\n"
	}
	dir := writeUserModule(t, goMod, []string{
		filepath.Join(root, "go.sum"),
		filepath.Join(root, "sqladapters/sqlite/modernc/go.sum"),
		filepath.Join(root, "sqladapters/cmd/millbox/go.sum"),
	}, map[string]string{})
	goCommand(t, dir, "mod", "tidy")
	out := goCommand(t, dir, "run", cmdModule, "migrate", "sql", "--db", "postgres", "--schema", "app")
	for _, want := range []string{`CREATE SCHEMA IF NOT EXISTS "app";`, `CREATE TABLE IF NOT EXISTS "app"."millbox_outbox"`} {
		if !strings.Contains(out, want) {
			t.Errorf("millbox migrate sql --db postgres --schema app: no %q in\n%s", want, out)
		}
	}
}
