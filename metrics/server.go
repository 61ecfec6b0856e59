package metrics

import (
	"context"
	"maps"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/internal/serverinfo"
)

// sampler samples streams and groups on the server, at most once per
// SampleInterval unless the set of targets changes, and keeps the metrics of
// the last sample for the scrapes in between.
type sampler struct {
	config *Config

	mu      sync.Mutex // one sample at a time; scrapes meanwhile wait for it
	at      time.Time
	targets map[target]bool
	metrics []prometheus.Metric
	samples float64
	errors  float64

	// lagReported is whether the server's XINFO GROUPS has the groups' lag
	// (Redis 7.0 and later, every Valkey): 0 until known, 1 yes, -1 no.
	lagReported int8
}

func (s *sampler) collect(ch chan<- prometheus.Metric, targets map[target]bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(targets) > 0 && (time.Since(s.at) >= s.config.SampleInterval || !maps.Equal(targets, s.targets)) {
		s.sample(targets)
	}
	for _, m := range s.metrics {
		ch <- m
	}
	ch <- prometheus.MustNewConstMetric(descSamples, prometheus.CounterValue, s.samples)
	ch <- prometheus.MustNewConstMetric(descSampleErrors, prometheus.CounterValue, s.errors)
}

// delayedCmds are the replies about the sorted set of a stream's delayed
// messages; none for a stream that cannot have one.
type delayedCmds struct {
	count    *redis.IntCmd
	earliest *redis.ZSliceCmd
}

// groupCmds are the replies about one group.
type groupCmds struct {
	stream, group string
	consumers     *redis.XInfoConsumersCmd
	summary       *redis.XPendingCmd
	oldest        *redis.XPendingExtCmd
}

// sample reads every target in one pipelined round trip and replaces the
// kept metrics.
func (s *sampler) sample(targets map[target]bool) {
	ctx, cancel := context.WithTimeout(context.Background(), s.config.SampleTimeout)
	defer cancel()
	s.at, s.targets = time.Now(), targets
	s.samples++

	streams, groups := sortedTargets(targets)
	pipe := s.config.Client.Pipeline()
	serverTime := pipe.Time(ctx)
	var serverInfo *redis.StringCmd
	if s.lagReported == 0 {
		serverInfo = pipe.Info(ctx, "server")
	}
	lengths := make([]*redis.IntCmd, len(streams))
	deads := make([]*redis.IntCmd, len(streams))
	infos := make([]*redis.XInfoGroupsCmd, len(streams))
	delayed := make([]delayedCmds, len(streams))
	var perGroup []groupCmds
	for i, stream := range streams {
		lengths[i] = pipe.XLen(ctx, stream)
		deads[i] = pipe.XLen(ctx, stream+s.config.DeadLetterSuffix)
		infos[i] = pipe.XInfoGroups(ctx, stream)
		if key, err := valkeystream.DelayedKey(stream); err == nil {
			delayed[i] = delayedCmds{
				count:    pipe.ZCard(ctx, key),
				earliest: pipe.ZRangeWithScores(ctx, key, 0, 0),
			}
		}
		for _, g := range groups[stream] {
			perGroup = append(perGroup, groupCmds{
				stream: stream, group: g,
				consumers: pipe.XInfoConsumers(ctx, stream, g),
				summary:   pipe.XPending(ctx, stream, g),
				oldest: pipe.XPendingExt(ctx, &redis.XPendingExtArgs{
					Stream: stream, Group: g, Start: "-", End: "+", Count: int64(s.config.MaxPendingScan)}),
			})
		}
	}
	_, _ = pipe.Exec(ctx) // each command carries its own error

	var out []prometheus.Metric
	failed := false
	ok := func(err error) bool {
		if err == nil {
			return true
		}
		// A stream or group that does not exist (yet) has no metrics; it
		// is not a failed sample.
		if !redis.HasErrorPrefix(err, "no such key") && !redis.HasErrorPrefix(err, "NOGROUP") {
			failed = true
		}
		return false
	}
	now, err := serverTime.Result()
	if !ok(err) {
		now = time.Now()
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		out = append(out, prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...))
	}

	if serverInfo != nil {
		if text, err := serverInfo.Result(); err == nil {
			s.lagReported = 1
			if !serverinfo.ReportsLag(text) {
				s.lagReported = -1
			}
		}
	}

	info := map[[2]string]redis.XInfoGroup{}
	for i, stream := range streams {
		if n, err := lengths[i].Result(); ok(err) {
			gauge(descLength, float64(n), stream)
		}
		if n, err := deads[i].Result(); ok(err) {
			gauge(descDeadLetters, float64(n), stream)
		}
		if d := delayed[i]; d.count != nil {
			n, err := d.count.Result()
			earliest, errEarliest := d.earliest.Result()
			if ok(err) && ok(errEarliest) {
				gauge(descDelayed, float64(n), stream)
				overdue := 0.0
				if len(earliest) > 0 {
					overdue = max(0, now.Sub(time.UnixMilli(int64(earliest[0].Score))).Seconds())
				}
				gauge(descDelayedOverdue, overdue, stream)
			}
		}
		if gs, err := infos[i].Result(); ok(err) {
			for _, g := range gs {
				info[[2]string{stream, g.Name}] = g
			}
		}
	}
	for _, g := range perGroup {
		gi, found := info[[2]string{g.stream, g.group}]
		if !found {
			continue // no such group (yet)
		}
		labels := []string{g.stream, g.group}
		gauge(descPending, float64(gi.Pending), labels...)
		gauge(descConsumers, float64(gi.Consumers), labels...)
		// Before Redis 7.0 the reply has no lag, which go-redis reads as 0.
		if gi.Lag >= 0 && s.lagReported >= 0 {
			gauge(descLag, float64(gi.Lag), labels...)
		}
		if sum, err := g.summary.Result(); ok(err) {
			age := 0.0
			if sum.Count > 0 {
				if t, valid := idTime(sum.Lower); valid {
					age = max(0, now.Sub(t).Seconds())
				}
			}
			gauge(descOldest, age, labels...)
		}
		if pending, err := g.oldest.Result(); ok(err) {
			var highest int64
			for _, p := range pending {
				highest = max(highest, p.RetryCount)
			}
			gauge(descMaxCount, float64(highest), labels...)
		}
		if cs, err := g.consumers.Result(); ok(err) {
			for _, c := range cs {
				gauge(descCPending, float64(c.Pending), g.stream, g.group, c.Name)
				gauge(descCIdle, c.Idle.Seconds(), g.stream, g.group, c.Name)
			}
		}
	}
	if failed {
		s.errors++
	}
	s.metrics = out
}

// idTime returns the time in a stream entry id.
func idTime(id string) (time.Time, bool) {
	ms, _, _ := strings.Cut(id, "-")
	n, err := strconv.ParseInt(ms, 10, 64)
	if err != nil {
		return time.Time{}, false
	}
	return time.UnixMilli(n), true
}
