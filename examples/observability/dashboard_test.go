package main

import (
	"context"
	"encoding/json"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"go.opentelemetry.io/otel/attribute"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.yaml.in/yaml/v3"

	"github.com/millbox/millbox/forwarder"
	"github.com/millbox/millbox/middleware"
)

// instrument is one metric millbox emits, as its code declares it.
type instrument struct {
	name, unit string
	kind       string // counter, histogram, gauge
}

// emitted lists every metric of the forwarder package and the inbox
// middleware, with the kind and unit their code gives them.
var emitted = []instrument{
	{forwarder.MetricSentMessages, "{message}", "counter"},
	{forwarder.MetricOperationDuration, "s", "histogram"},
	{forwarder.MetricCommitToAck, "s", "histogram"},
	{forwarder.MetricBatchSize, "{message}", "histogram"},
	{forwarder.MetricDeadLettered, "{message}", "counter"},
	{forwarder.MetricPartitions, "{partition}", "gauge"},
	{forwarder.MetricRunning, "{instance}", "gauge"},
	{forwarder.MetricOutboxPending, "{message}", "gauge"},
	{forwarder.MetricOutboxOldestPendingAge, "s", "gauge"},
	{forwarder.MetricOutboxDeadLetters, "{message}", "gauge"},
	{forwarder.MetricOutboxScheduled, "{message}", "gauge"},
	{middleware.MetricConsumedMessages, "{message}", "counter"},
	{middleware.MetricProcessDuration, "s", "histogram"},
}

// attributes are every attribute key millbox puts on a metric.
var attributes = []attribute.KeyValue{
	forwarder.AttrOutboxTable.String("t"),
	attribute.String("messaging.system", "kafka"),
	attribute.String("messaging.destination.name", "orders"),
	attribute.String("messaging.operation.name", "send"),
	attribute.String("error.type", "timeout"),
	middleware.AttrInboxConsumer.String("billing"),
	middleware.AttrInboxDuplicate.Bool(true),
}

// exported returns the Prometheus series names and label names the
// Prometheus exporter makes of the emitted metrics, and the series of each
// metric.
func exported(t *testing.T) (series, labels map[string]bool, byMetric map[string][]string) {
	t.Helper()
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		t.Fatal(err)
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	meter := mp.Meter("test")
	ctx := context.Background()
	attrs := metric.WithAttributes(attributes...)
	for _, in := range emitted {
		var err error
		switch in.kind {
		case "counter":
			var c metric.Int64Counter
			if c, err = meter.Int64Counter(in.name, metric.WithUnit(in.unit)); err == nil {
				c.Add(ctx, 1, attrs)
			}
		case "histogram":
			var h metric.Float64Histogram
			if h, err = meter.Float64Histogram(in.name, metric.WithUnit(in.unit)); err == nil {
				h.Record(ctx, 1, attrs)
			}
		case "gauge":
			var g metric.Float64Gauge
			if g, err = meter.Float64Gauge(in.name, metric.WithUnit(in.unit)); err == nil {
				g.Record(ctx, 1, attrs)
			}
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	families, err := registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	series, labels, byMetric = map[string]bool{}, map[string]bool{}, map[string][]string{}
	for _, mf := range families {
		names := []string{mf.GetName()}
		if mf.GetType() == dto.MetricType_HISTOGRAM {
			names = []string{mf.GetName() + "_bucket", mf.GetName() + "_sum", mf.GetName() + "_count"}
		}
		for _, in := range emitted {
			if strings.HasPrefix(mf.GetName(), strings.ReplaceAll(in.name, ".", "_")) {
				byMetric[in.name] = append(byMetric[in.name], names...)
			}
		}
		for _, n := range names {
			series[n] = true
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
	}
	labels["le"], labels["instance"], labels["job"] = true, true, true
	return series, labels, byMetric
}

// identifiers are the millbox and messaging names in a query.
var identifiers = regexp.MustCompile(`\b(?:millbox|messaging)_[a-z0-9_]+\b`)

// dashboardQueries returns every expr of dashboard.json, and its panel
// titles.
func dashboardQueries(t *testing.T) (exprs, titles []string) {
	t.Helper()
	raw, err := os.ReadFile("dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard.json: %v", err)
	}
	for _, p := range dash.Panels {
		titles = append(titles, p.Title)
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			exprs = append(exprs, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	return exprs, titles
}

// alertQueries returns every rule's expr of alerts.yml, by alert name.
func alertQueries(t *testing.T) map[string]string {
	t.Helper()
	raw, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var rules struct {
		Groups []struct {
			Name  string `yaml:"name"`
			Rules []struct {
				Alert string `yaml:"alert"`
				Expr  string `yaml:"expr"`
			} `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(raw, &rules); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	out := map[string]string{}
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Alert == "" || r.Expr == "" {
				t.Errorf("group %s has a rule without alert or expr", g.Name)
			}
			out[r.Alert] = r.Expr
		}
	}
	return out
}

// TestDashboardAndAlertsUseEmittedMetrics checks that every metric and
// label name dashboard.json and alerts.yml query is one millbox emits, as
// the Prometheus exporter names it, and that the dashboard shows every
// metric.
func TestDashboardAndAlertsUseEmittedMetrics(t *testing.T) {
	series, labels, byMetric := exported(t)
	exprs, titles := dashboardQueries(t)
	alerts := alertQueries(t)
	all := slices.Clone(exprs)
	for _, e := range alerts {
		all = append(all, e)
	}
	for _, e := range all {
		for _, id := range identifiers.FindAllString(e, -1) {
			if !series[id] && !labels[id] {
				t.Errorf("%q is neither a series nor a label millbox emits, in %s", id, e)
			}
		}
	}
	dashboard := strings.Join(exprs, "\n")
	for _, in := range emitted {
		names := byMetric[in.name]
		if len(names) == 0 {
			t.Fatalf("the exporter produced no series for %s", in.name)
		}
		if !slices.ContainsFunc(names, func(n string) bool { return strings.Contains(dashboard, n) }) {
			t.Errorf("no dashboard panel shows %s (%v)", in.name, names)
		}
	}
	for _, want := range []string{"Pending messages", "Oldest pending message age", "Send rate", "Commit to ack latency",
		"Publish failures", "Dead letters", "Inbox duplicates", "Partitions per instance"} {
		if !slices.Contains(titles, want) {
			t.Errorf("dashboard has no panel %q", want)
		}
	}
	for _, want := range []string{"MillboxOutboxOldestPendingAgeHigh", "MillboxDeadLettersGrowing", "MillboxNoForwarderRunning",
		"MillboxPublishFailures", "MillboxInboxErrorRate"} {
		if alerts[want] == "" {
			t.Errorf("alerts.yml has no rule %s", want)
		}
	}
}
