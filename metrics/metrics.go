// Package metrics exports the counters of valkeystream Subscribers,
// Publishers, Deduplicators and dead-letter middlewares, and the state of
// their streams, delayed messages and consumer groups on the server, as
// Prometheus metrics.
//
// A [Collector] is a prometheus.Collector: register it with a registry and
// tell it what to report.
//
//	c, err := metrics.NewCollector(metrics.Config{Client: client})
//	...
//	c.AddSubscriber("billing", sub) // its counters, and its streams and groups on the server
//	c.AddPublisher("orders", pub)
//	c.AddDeduplicator("billing", dedup)
//	c.AddExactlyOnce("enrich", exactlyOnce)
//	prometheus.MustRegister(c)
//
// Counters are read when Prometheus scrapes. The server is sampled at most
// once per SampleInterval, in one pipelined round trip, however many
// subscriptions read a stream and however often it is scraped. The metrics
// are listed in docs/metrics.md.
package metrics

import (
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
)

// Defaults of [Config].
const (
	// DefaultSampleInterval is how long a sample of the server is reused.
	DefaultSampleInterval = 10 * time.Second
	// DefaultSampleTimeout bounds one sample of the server.
	DefaultSampleTimeout = 5 * time.Second
	// DefaultMaxPendingScan is how many pending entries of a group are read
	// to find the highest delivery count.
	DefaultMaxPendingScan = 100
)

// Config configures a [Collector].
type Config struct {
	// Client samples the state of streams and groups on the server. Without
	// it only the counters of Subscribers and Publishers are reported.
	// Default: none.
	Client redis.UniversalClient

	// SampleInterval is how long a sample of the server is reused: scrapes
	// within it are answered from the last sample. Default:
	// DefaultSampleInterval.
	SampleInterval time.Duration

	// SampleTimeout bounds one sample of the server; a scrape waits at most
	// this long for it. Default: DefaultSampleTimeout.
	SampleTimeout time.Duration

	// MaxPendingScan is how many pending entries of each group (the oldest)
	// XPENDING reads to find the highest delivery count. Default:
	// DefaultMaxPendingScan.
	MaxPendingScan int

	// DeadLetterSuffix names the dead-letter stream of each sampled stream,
	// whose length is reported as valkeystream_dead_letters. Default:
	// valkeystream.DefaultDeadLetterSuffix.
	DeadLetterSuffix string

	// DeliveryAgeBuckets are the upper bounds, in seconds and increasing,
	// of the buckets of valkeystream_delivery_age_seconds. Default:
	// DefaultDeliveryAgeBuckets.
	DeliveryAgeBuckets []float64
}

func (c *Config) setDefaults() {
	if c.SampleInterval == 0 {
		c.SampleInterval = DefaultSampleInterval
	}
	if c.SampleTimeout == 0 {
		c.SampleTimeout = DefaultSampleTimeout
	}
	if c.MaxPendingScan == 0 {
		c.MaxPendingScan = DefaultMaxPendingScan
	}
	if c.DeadLetterSuffix == "" {
		c.DeadLetterSuffix = valkeystream.DefaultDeadLetterSuffix
	}
	if len(c.DeliveryAgeBuckets) == 0 {
		c.DeliveryAgeBuckets = DefaultDeliveryAgeBuckets
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps valkeystream.ErrInvalidConfig and names the field.
func (c Config) Validate() error {
	c.setDefaults()
	switch {
	case c.SampleInterval < 0:
		return fmt.Errorf("%w: metrics Config.SampleInterval is %s: it must be positive (0: %s)", valkeystream.ErrInvalidConfig, c.SampleInterval, DefaultSampleInterval)
	case c.SampleTimeout < 0:
		return fmt.Errorf("%w: metrics Config.SampleTimeout is %s: it must be positive (0: %s)", valkeystream.ErrInvalidConfig, c.SampleTimeout, DefaultSampleTimeout)
	case c.MaxPendingScan < 0:
		return fmt.Errorf("%w: metrics Config.MaxPendingScan is %d: it must be positive (0: %d)", valkeystream.ErrInvalidConfig, c.MaxPendingScan, DefaultMaxPendingScan)
	}
	for i := 1; i < len(c.DeliveryAgeBuckets); i++ {
		if c.DeliveryAgeBuckets[i] <= c.DeliveryAgeBuckets[i-1] {
			return fmt.Errorf("%w: metrics Config.DeliveryAgeBuckets is %v: the bounds must increase", valkeystream.ErrInvalidConfig, c.DeliveryAgeBuckets)
		}
	}
	return nil
}

// Collector is a prometheus.Collector of valkeystream metrics. It is safe
// for concurrent use.
type Collector struct {
	config Config

	mu          sync.Mutex // guards the registrations below
	subscribers map[string]*valkeystream.Subscriber
	publishers  map[string]*valkeystream.Publisher
	dedups      map[string]*valkeystream.Deduplicator
	onces       map[string]*valkeystream.ExactlyOnce
	watched     map[target]bool

	server sampler
	ages   *ages
}

// target is a stream, and a group of it ("" for the stream alone), to
// sample on the server.
type target struct{ stream, group string }

// NewCollector returns a Collector, or an error wrapping
// valkeystream.ErrInvalidConfig that names the bad field.
func NewCollector(config Config) (*Collector, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	c := &Collector{
		config:      config,
		subscribers: map[string]*valkeystream.Subscriber{},
		publishers:  map[string]*valkeystream.Publisher{},
		dedups:      map[string]*valkeystream.Deduplicator{},
		onces:       map[string]*valkeystream.ExactlyOnce{},
		watched:     map[target]bool{},
		ages:        newAges(config.DeliveryAgeBuckets),
	}
	c.server.config = &c.config
	return c, nil
}

// AddSubscriber reports the counters of s under the label subscriber=name,
// and the state of its subscriptions; with a Client, the streams and groups
// it reads are sampled on the server. It makes the Collector the
// DeliveryObserver of s (replacing any other), to report the age of
// entries at delivery. Each name may be used once.
func (c *Collector) AddSubscriber(name string, s *valkeystream.Subscriber) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.subscribers[name]; taken {
		return fmt.Errorf("valkeystream metrics: a subscriber named %q is registered already: give each a name of its own", name)
	}
	c.subscribers[name] = s
	s.SetDeliveryObserver(ageObserver{ages: c.ages, subscriber: name})
	return nil
}

// AddPublisher reports the counters of p under the label publisher=name.
// Each name may be used once.
func (c *Collector) AddPublisher(name string, p *valkeystream.Publisher) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.publishers[name]; taken {
		return fmt.Errorf("valkeystream metrics: a publisher named %q is registered already: give each a name of its own", name)
	}
	c.publishers[name] = p
	return nil
}

// AddDeduplicator reports the counters of d (Deduplicator.Stats) under the
// label deduplicator=name. Each name may be used once.
func (c *Collector) AddDeduplicator(name string, d *valkeystream.Deduplicator) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.dedups[name]; taken {
		return fmt.Errorf("valkeystream metrics: a deduplicator named %q is registered already: give each a name of its own", name)
	}
	c.dedups[name] = d
	return nil
}

// AddExactlyOnce reports the counters of x (ExactlyOnce.Stats) under the
// label exactly_once=name. Each name may be used once.
func (c *Collector) AddExactlyOnce(name string, x *valkeystream.ExactlyOnce) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, taken := c.onces[name]; taken {
		return fmt.Errorf("valkeystream metrics: an ExactlyOnce named %q is registered already: give each a name of its own", name)
	}
	c.onces[name] = x
	return nil
}

// WatchGroup samples a stream key and one of its consumer groups on the
// server, whether or not a Subscriber of this process reads it.
func (c *Collector) WatchGroup(stream, group string) {
	c.mu.Lock()
	c.watched[target{stream, group}] = true
	c.mu.Unlock()
}

// WatchStream samples a stream key on the server: its length and that of
// its dead-letter stream.
func (c *Collector) WatchStream(stream string) {
	c.WatchGroup(stream, "")
}

var (
	labelSubscriber   = []string{"subscriber"}
	labelPublisher    = []string{"publisher"}
	labelDedup        = []string{"deduplicator"}
	labelOnce         = []string{"exactly_once"}
	labelSubscription = []string{"subscriber", "stream", "group", "consumer"}
	labelStream       = []string{"stream"}
	labelGroup        = []string{"stream", "group"}
	labelConsumer     = []string{"stream", "group", "consumer"}
)

func desc(name, help string, labels []string) *prometheus.Desc {
	return prometheus.NewDesc("valkeystream_"+name, help, labels, nil)
}

// subscriberCounters are the counters of valkeystream.Stats, in order.
var subscriberCounters = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.Stats) int64
}{
	{desc("subscriber_delivered_total", "Messages sent on subscription channels, redeliveries included.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Delivered }},
	{desc("subscriber_acked_total", "Entries acknowledged to the server: by XACK, or by the step of ExactlyOnce with their outputs.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Acked }},
	{desc("subscriber_nacked_total", "Messages Nacked by handlers.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.Nacked }},
	{desc("subscriber_nack_waits_total", "Nacks after which the message waited (the Nack backoff) before it was delivered again.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.Waits }},
	{desc("subscriber_drained_total", "Own pending entries delivered again after a start or a fault.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Drained }},
	{desc("subscriber_reclaimed_total", "Entries taken over from idle consumers (XAUTOCLAIM, or inside reads with XREADGROUP ... CLAIM).", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Reclaimed }},
	{desc("subscriber_missing_bodies_total", "Pending entries trimmed or deleted before they were handled; acknowledged, never delivered.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.MissingBodies }},
	{desc("subscriber_invalid_entries_total", "Entries that could not be decoded; dead-lettered with a group, skipped in fan-out.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.InvalidEntries }},
	{desc("subscriber_not_for_this_group_total", "Entries acknowledged without delivery because they are meant for another consumer group only (replayed dead letters).", labelSubscriber), func(s valkeystream.Stats) int64 { return s.NotForThisGroup }},
	{desc("subscriber_retries_later_total", "Nacks with RetryAfter or NackAfter deferred: the next messages were delivered while they waited.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.RetriesLater }},
	{desc("subscriber_retry_later_fallbacks_total", "RetryAfter or NackAfter Nacks that found the deferred set full (BatchSize) and waited the Nack backoff instead.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.RetryLaterFallbacks }},
	{desc("subscriber_given_up_total", "Messages given up by their handlers (GiveUp, Reject) that the subscriber dead-lettered (or logged) and acknowledged.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.GivenUp }},
	{desc("subscriber_faults_total", "Failed calls to the server: reads, claims, Acks, hold beats, lease renewals.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Faults }},
}

// subscriberGauges are the gauges of valkeystream.Stats, in order.
var subscriberGauges = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.Stats) int64
}{
	{desc("subscriber_read_ahead", "Entries fetched and waiting in the subscriptions' queues to be delivered; with a group they are pending on the server.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.ReadAhead }},
	{desc("subscriber_deferred", "Entries Nacked with RetryAfter or NackAfter waiting to come back, pending for and held by the subscriptions.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.Nacks.Deferred }},
	{desc("subscriber_in_flight", "Messages taken from the queues and not settled yet: being handed over, in a handler, or waiting to be delivered again after a Nack.", labelSubscriber), func(s valkeystream.Stats) int64 { return s.InFlight }},
}

// The counters of the dead-letter middlewares of the process, in total
// (valkeystream.DeadLetterCounts) and by the stream and group the messages
// came from (valkeystream.DeadLetterCountsBySource).
var (
	descMiddlewareDeadLettered = desc("middleware_dead_lettered_total", "Messages given up by the DeadLetter middleware (published to the dead-letter topic) or the DeliveryLimit middleware (marked for a poison queue), in this process.", []string{"middleware"})
	descMiddlewareDeadFailures = desc("middleware_dead_letter_failures_total", "Dead letters the DeadLetter middleware could not publish (the message was Nacked), in this process.", nil)

	descDeadLetteredBySource = desc("middleware_dead_lettered_by_source_total", "Messages given up by the DeadLetter or DeliveryLimit middleware in this process, by the stream and consumer group they were delivered from.", []string{"middleware", "stream", "group"})
	descDeadFailuresBySource = desc("middleware_dead_letter_failures_by_source_total", "Dead letters the DeadLetter middleware could not publish in this process, by the stream and consumer group the messages were delivered from.", []string{"stream", "group"})
)

// partitionCounters are the counters of valkeystream.PartitionStats, in
// order, and partitionsOwned its gauge.
var partitionCounters = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.PartitionStats) int64
}{
	{desc("partition_rebalances_total", "Beats whose even split gave one of the Subscriber's subscriptions other partitions than before.", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.Rebalances }},
	{desc("partition_acquired_total", "Partitions the Subscriber's subscriptions took over.", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.Acquired }},
	{desc("partition_released_total", "Partitions the Subscriber's subscriptions gave back, their in-flight messages settled first.", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.Released }},
	{desc("partition_handed_over_total", "Pending entries taken over from a partition's previous owner.", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.HandedOver }},
	{desc("partition_fenced_total", "Ownerships found lost (the server refused the subscription's calls: it was cut off or frozen past PartitionOwnerTTL while another took the partition over) or given up (no renewal reached the server for nearly PartitionOwnerTTL).", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.Fenced }},
	{desc("partition_late_hand_overs_total", "Messages a handler took after their partition's ownership may have lapsed (the process was frozen while offering them); their contexts had ended.", labelSubscriber), func(s valkeystream.PartitionStats) int64 { return s.LateHandOvers }},
}

var descPartitionsOwned = desc("partitions_owned", "Partitions the Subscriber's subscriptions own now.", labelSubscriber)

// onceCounters are the counters of valkeystream.ExactlyOnceStats, in order.
var onceCounters = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.ExactlyOnceStats) int64
}{
	{desc("exactly_once_committed_total", "Handlings whose outputs and input Ack were written in one step.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.Committed }},
	{desc("exactly_once_outputs_total", "Messages the committed steps wrote.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.Outputs }},
	{desc("exactly_once_superseded_total", "Steps that wrote nothing because the input was no longer the delivery's (acknowledged, or delivered again elsewhere).", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.Superseded }},
	{desc("exactly_once_failed_total", "Steps not committed within CommitTimeout, or refused by the server: the input was Nacked.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.Failed }},
	{desc("exactly_once_non_atomic_total", "Handlings published the usual way (NonAtomicFallback): their outputs may repeat after a crash.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.NonAtomic }},
	{desc("exactly_once_refused_total", "Handlings refused with ErrNotAtomic (keys in several slots, another client, no consumer group).", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.Refused }},
	{desc("exactly_once_not_replicated_total", "Committed steps whose outputs fewer replicas than WaitReplicas confirmed in time.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.NotReplicated }},
	{desc("exactly_once_state_writes_total", "Handlers' writes to their own keys (valkeystream.Step) applied by committed steps.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.StateWrites }},
	{desc("exactly_once_state_changed_total", "Steps that wrote nothing because a key or field did not hold what the handler expected: the input was Nacked.", labelOnce), func(s valkeystream.ExactlyOnceStats) int64 { return s.StateChanged }},
}

// dedupCounters are the counters of valkeystream.DedupStats, in order.
var dedupCounters = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.DedupStats) int64
}{
	{desc("dedup_handled_total", "Deliveries the Deduplicator let run the handler.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Handled }},
	{desc("dedup_marked_total", "Handlings that succeeded and were marked done.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Marked }},
	{desc("dedup_skipped_total", "Duplicates of a message marked done: Acked without calling the handler.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Skipped }},
	{desc("dedup_busy_total", "Deliveries Nacked because another handling of the message held its in-progress mark past BusyWait.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Busy }},
	{desc("dedup_released_total", "Handlings that failed: their in-progress mark was removed so that the redelivery runs.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Released }},
	{desc("dedup_lost_marks_total", "Successful handlings whose in-progress mark had expired or been replaced before they ended: a duplicate may have run meanwhile.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.LostMarks }},
	{desc("dedup_given_up_total", "Handlings a DeadLetter or DeliveryLimit inside the Deduplicator gave up on: Acked as dead letters, their marks removed rather than marked done, so that a replay is handled.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.GivenUp }},
	{desc("dedup_mark_failures_total", "Successful handlings whose done mark could not be written: a duplicate of the message would be handled again.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.MarkFailures }},
	{desc("dedup_faults_total", "Failed calls of the Deduplicator to the server.", labelDedup), func(s valkeystream.DedupStats) int64 { return s.Faults }},
}

var publisherCounters = []struct {
	desc *prometheus.Desc
	get  func(valkeystream.PublisherStats) int64
}{
	{desc("publisher_calls_total", "Publish calls.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.Calls }},
	{desc("publisher_failed_calls_total", "Publish calls that returned an error.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.FailedCalls }},
	{desc("publisher_messages_total", "Messages the server accepted.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.Messages }},
	{desc("publisher_failed_messages_total", "Messages of failed Publish calls that were not written.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.FailedMessages }},
	{desc("publisher_maybe_written_messages_total", "Messages of failed Publish calls that may have been written: sent on a connection that failed before the answer.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.MaybeWrittenMessages }},
	{desc("publisher_round_trips_total", "Requests sent to the server: one XADD or one pipeline of them.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.RoundTrips }},
	{desc("publisher_round_trip_messages_total", "Messages carried by round trips; divided by round trips, the messages per round trip.", labelPublisher), func(s valkeystream.PublisherStats) int64 { return s.RoundTripMessages }},
}

var (
	descPartitionOwned = desc("partition_owned", "1 for each partition of a partitioned topic the subscription owns (stream: the partition's stream key).", labelSubscription)
	descRunning        = desc("subscription_running", "1 while the subscription's loop runs, 0 once it has ended.", labelSubscription)
	descReady          = desc("subscription_ready", "1 once the subscription has started reading (its group door has passed).", labelSubscription)
	descFailing        = desc("subscription_failing_seconds", "How long the subscription's calls to the server have been failing; 0 when the last one succeeded.", labelSubscription)

	descLength         = desc("stream_length", "Entries in the stream (XLEN).", labelStream)
	descDeadLetters    = desc("dead_letters", "Entries in the stream's dead-letter stream.", labelStream)
	descDelayed        = desc("delayed_messages", "Delayed messages waiting in the sorted set beside the stream (ZCARD).", labelStream)
	descDelayedOverdue = desc("delayed_overdue_seconds", "How long the earliest delayed message of the stream has been due without being moved into it, by the server's clock; 0 when none is due.", labelStream)
	descLag            = desc("group_lag", "Entries of the stream the group has not read yet; absent when the server cannot tell.", labelGroup)
	descPending        = desc("group_pending", "Entries read by the group and not acknowledged.", labelGroup)
	descOldest         = desc("group_oldest_pending_age_seconds", "Age of the oldest pending entry, from its id to the server's clock; 0 when none is pending.", labelGroup)
	descMaxCount       = desc("group_max_deliveries", "Highest delivery count among the oldest pending entries (up to MaxPendingScan of them).", labelGroup)
	descConsumers      = desc("group_consumers", "Consumers in the group.", labelGroup)
	descCPending       = desc("consumer_pending", "Entries pending for the consumer.", labelConsumer)
	descCIdle          = desc("consumer_idle_seconds", "Time since the consumer last read or claimed.", labelConsumer)

	descSubscriberVerbs = desc("subscriber_verbs_info", "1, labelled with the stream verbs newer than Redis 6.2's the subscriptions use (docs/server-verbs.md): baseline, or a list such as claim-in-read,ackdel; absent until the first group Subscribe asked the server.", []string{"subscriber", "verbs"})
	descPublisherVerbs  = desc("publisher_verbs_info", "1, labelled with the stream verbs newer than Redis 6.2's the Publisher uses (docs/server-verbs.md); absent until a Publish needed to ask the server (IdempotentWindow, Retention).", []string{"publisher", "verbs"})
	descNackWaitSeconds = desc("subscriber_nack_wait_seconds_total", "Time Nacked messages waited (the Nack backoff) before they were delivered again.", labelSubscriber)

	descSamples      = desc("server_samples_total", "Samples of the server taken.", nil)
	descSampleErrors = desc("server_sample_errors_total", "Samples of the server that failed in part or whole; the metrics they could not read are left out.", nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range subscriberCounters {
		ch <- s.desc
	}
	for _, s := range subscriberGauges {
		ch <- s.desc
	}
	ch <- descNackWaitSeconds
	ch <- descSubscriberVerbs
	ch <- descPublisherVerbs
	for _, p := range publisherCounters {
		ch <- p.desc
	}
	for _, d := range dedupCounters {
		ch <- d.desc
	}
	for _, o := range onceCounters {
		ch <- o.desc
	}
	for _, pc := range partitionCounters {
		ch <- pc.desc
	}
	ch <- descPartitionsOwned
	ch <- descPartitionOwned
	for _, d := range []*prometheus.Desc{descRunning, descReady, descFailing, descLength, descDeadLetters, descLag,
		descPending, descOldest, descMaxCount, descConsumers, descCPending, descCIdle, descSamples, descSampleErrors,
		descMiddlewareDeadLettered, descMiddlewareDeadFailures, descDeadLetteredBySource, descDeadFailuresBySource,
		descDelayed, descDelayedOverdue} {
		ch <- d
	}
	c.ages.vec.Describe(ch)
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	subs := make(map[string]*valkeystream.Subscriber, len(c.subscribers))
	for n, s := range c.subscribers {
		subs[n] = s
	}
	pubs := make(map[string]*valkeystream.Publisher, len(c.publishers))
	for n, p := range c.publishers {
		pubs[n] = p
	}
	dedups := make(map[string]*valkeystream.Deduplicator, len(c.dedups))
	for n, d := range c.dedups {
		dedups[n] = d
	}
	onces := make(map[string]*valkeystream.ExactlyOnce, len(c.onces))
	for n, x := range c.onces {
		onces[n] = x
	}
	targets := make(map[target]bool, len(c.watched))
	for t := range c.watched {
		targets[t] = true
	}
	c.mu.Unlock()

	now := time.Now()
	for name, s := range subs {
		stats := s.Stats()
		for _, sc := range subscriberCounters {
			ch <- prometheus.MustNewConstMetric(sc.desc, prometheus.CounterValue, float64(sc.get(stats)), name)
		}
		for _, sg := range subscriberGauges {
			ch <- prometheus.MustNewConstMetric(sg.desc, prometheus.GaugeValue, float64(sg.get(stats)), name)
		}
		ch <- prometheus.MustNewConstMetric(descNackWaitSeconds, prometheus.CounterValue, stats.Nacks.WaitSeconds, name)
		if stats.Verbs != "" {
			ch <- prometheus.MustNewConstMetric(descSubscriberVerbs, prometheus.GaugeValue, 1, name, stats.Verbs)
		}
		ps := s.PartitionStats()
		for _, pc := range partitionCounters {
			ch <- prometheus.MustNewConstMetric(pc.desc, prometheus.CounterValue, float64(pc.get(ps)), name)
		}
		ch <- prometheus.MustNewConstMetric(descPartitionsOwned, prometheus.GaugeValue, float64(ps.Owned), name)
		for _, st := range s.Subscriptions() {
			labels := []string{name, st.Stream, st.Group, st.Consumer}
			if st.Partitions != nil && !st.Ended {
				// The partitions' streams are sampled, not the topic's
				// key, which holds no stream.
				for _, i := range st.Owned {
					ch <- prometheus.MustNewConstMetric(descPartitionOwned, prometheus.GaugeValue, 1, name, st.Partitions[i], st.Group, st.Consumer)
				}
				for _, p := range st.Partitions {
					targets[target{p, st.Group}] = true
				}
			}
			ch <- prometheus.MustNewConstMetric(descRunning, prometheus.GaugeValue, boolValue(!st.Ended), labels...)
			ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, boolValue(st.Ready && !st.Ended), labels...)
			failing := 0.0
			if !st.FailingSince.IsZero() {
				failing = now.Sub(st.FailingSince).Seconds()
			}
			ch <- prometheus.MustNewConstMetric(descFailing, prometheus.GaugeValue, failing, labels...)
			if !st.Ended && st.Partitions == nil {
				targets[target{st.Stream, st.Group}] = true
			}
		}
	}
	for name, p := range pubs {
		stats := p.Stats()
		for _, pc := range publisherCounters {
			ch <- prometheus.MustNewConstMetric(pc.desc, prometheus.CounterValue, float64(pc.get(stats)), name)
		}
		if stats.Verbs != "" {
			ch <- prometheus.MustNewConstMetric(descPublisherVerbs, prometheus.GaugeValue, 1, name, stats.Verbs)
		}
	}
	dead := valkeystream.DeadLetterCounts()
	ch <- prometheus.MustNewConstMetric(descMiddlewareDeadLettered, prometheus.CounterValue, float64(dead.Published), "DeadLetter")
	ch <- prometheus.MustNewConstMetric(descMiddlewareDeadLettered, prometheus.CounterValue, float64(dead.Marked), "DeliveryLimit")
	ch <- prometheus.MustNewConstMetric(descMiddlewareDeadFailures, prometheus.CounterValue, float64(dead.PublishFailures))
	for source, dead := range valkeystream.DeadLetterCountsBySource() {
		ch <- prometheus.MustNewConstMetric(descDeadLetteredBySource, prometheus.CounterValue, float64(dead.Published), "DeadLetter", source.Stream, source.Group)
		ch <- prometheus.MustNewConstMetric(descDeadLetteredBySource, prometheus.CounterValue, float64(dead.Marked), "DeliveryLimit", source.Stream, source.Group)
		ch <- prometheus.MustNewConstMetric(descDeadFailuresBySource, prometheus.CounterValue, float64(dead.PublishFailures), source.Stream, source.Group)
	}
	for name, d := range dedups {
		stats := d.Stats()
		for _, dc := range dedupCounters {
			ch <- prometheus.MustNewConstMetric(dc.desc, prometheus.CounterValue, float64(dc.get(stats)), name)
		}
	}
	for name, x := range onces {
		stats := x.Stats()
		for _, oc := range onceCounters {
			ch <- prometheus.MustNewConstMetric(oc.desc, prometheus.CounterValue, float64(oc.get(stats)), name)
		}
	}
	c.ages.vec.Collect(ch)
	if c.config.Client != nil {
		c.server.collect(ch, targets)
	}
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// sortedTargets returns the streams of targets in order, each with its
// groups in order.
func sortedTargets(targets map[target]bool) (streams []string, groups map[string][]string) {
	groups = map[string][]string{}
	for t := range targets {
		if _, seen := groups[t.stream]; !seen {
			streams = append(streams, t.stream)
			groups[t.stream] = nil
		}
		if t.group != "" && !slices.Contains(groups[t.stream], t.group) {
			groups[t.stream] = append(groups[t.stream], t.group)
		}
	}
	slices.Sort(streams)
	for _, g := range groups {
		slices.Sort(g)
	}
	return streams, groups
}
