// Package metricstest reads Prometheus collectors in tests: the sum of the
// series whose labels match, whatever their other labels.
package metricstest

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Sum collects c and adds up the series whose labels have the given
// values (name, value pairs; a label not named may have any value):
// counters and gauges by value, histograms by their count of
// observations. It is 0 when no series matches.
func Sum(tb testing.TB, c prometheus.Collector, labels ...string) float64 {
	tb.Helper()
	if len(labels)%2 != 0 {
		tb.Fatalf("metricstest.Sum: labels %q are not name, value pairs", labels)
	}
	ch := make(chan prometheus.Metric)
	go func() {
		c.Collect(ch)
		close(ch)
	}()
	sum := 0.0
	for m := range ch {
		var d dto.Metric
		if err := m.Write(&d); err != nil {
			tb.Errorf("metricstest.Sum: %v", err)
			continue
		}
		if !matches(&d, labels) {
			continue
		}
		switch {
		case d.Counter != nil:
			sum += d.Counter.GetValue()
		case d.Gauge != nil:
			sum += d.Gauge.GetValue()
		case d.Histogram != nil:
			sum += float64(d.Histogram.GetSampleCount())
		}
	}
	return sum
}

// matches reports whether d has every name, value pair of labels.
func matches(d *dto.Metric, labels []string) bool {
	for i := 0; i < len(labels); i += 2 {
		found := false
		for _, l := range d.GetLabel() {
			if l.GetName() == labels[i] {
				found = l.GetValue() == labels[i+1]
				break
			}
		}
		if !found {
			return false
		}
	}
	return true
}
