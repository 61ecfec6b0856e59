package valkeystream

import (
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"time"
)

// DefaultHealthFailingFor is how long a subscription's calls to the server
// may keep failing before a [HealthCheck] reports it unhealthy.
const DefaultHealthFailingFor = 30 * time.Second

// maxEndedKept bounds how many ended subscriptions a Subscriber keeps for
// [Subscriber.Subscriptions]; the oldest go first.
const maxEndedKept = 16

// SubscriptionStatus is the state of one subscription of a [Subscriber].
type SubscriptionStatus struct {
	// Topic is the topic given to Subscribe, and Stream its stream key.
	Topic  string `json:"topic"`
	Stream string `json:"stream"`
	// Group and Consumer are empty in fan-out.
	Group    string `json:"group,omitempty"`
	Consumer string `json:"consumer,omitempty"`
	// Ready is true once the subscription has started reading: with a
	// consumer group, once the group door has passed.
	Ready bool `json:"ready"`
	// FailingSince is when the current streak of failed calls to the server
	// began; zero when the last call succeeded.
	FailingSince time.Time `json:"failing_since,omitzero"`
	// Failures counts the failed calls of the current streak, and LastError
	// is the last one's error.
	Failures  int    `json:"failures,omitempty"`
	LastError string `json:"last_error,omitempty"`
	// Partitions are the stream keys of the partitions of a partitioned
	// topic, in partition order (nil for a plain topic), and Owned the
	// partitions this subscription owns now.
	Partitions []string `json:"partitions,omitempty"`
	Owned      []int    `json:"owned,omitempty"`
	// Ended is true once the subscription's loop has returned (its context
	// was cancelled or the Subscriber was closed), which is just after its
	// message channel is closed. An ended subscription is listed until
	// another one of the same stream and group starts.
	Ended bool `json:"ended"`
}

// subscriptionHealth is the state of one subscription, updated by its loop
// (as its loop.Health) and by Subscribe. Its methods accept a nil receiver, so
// that a loop without one needs no check.
type subscriptionHealth struct {
	mu    sync.Mutex
	st    SubscriptionStatus
	owned func() []int // of a partitioned topic; nil otherwise
}

// setPartitions records the partition streams of a partitioned topic, and
// where to read which the subscription owns.
func (h *subscriptionHealth) setPartitions(streams []string, owned func() []int) {
	h.mu.Lock()
	h.st.Partitions, h.owned = streams, owned
	h.mu.Unlock()
}

func (h *subscriptionHealth) setConsumer(name string) {
	h.mu.Lock()
	h.st.Consumer = name
	h.mu.Unlock()
}

func (h *subscriptionHealth) setReady() {
	h.mu.Lock()
	h.st.Ready = true
	h.mu.Unlock()
}

func (h *subscriptionHealth) end() {
	h.mu.Lock()
	h.st.Ended = true
	h.mu.Unlock()
}

// Failed records a failed call to the server.
func (h *subscriptionHealth) Failed(err error) {
	if h == nil {
		return
	}
	h.mu.Lock()
	if h.st.Failures == 0 {
		h.st.FailingSince = time.Now()
	}
	h.st.Failures++
	h.st.LastError = err.Error()
	h.mu.Unlock()
}

// Recovered ends a streak of failed calls.
func (h *subscriptionHealth) Recovered() {
	if h == nil {
		return
	}
	h.mu.Lock()
	h.st.FailingSince, h.st.Failures, h.st.LastError = time.Time{}, 0, ""
	h.mu.Unlock()
}

func (h *subscriptionHealth) status() SubscriptionStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.st
	if h.owned != nil && !st.Ended {
		st.Owned = h.owned()
	}
	return st
}

// healthRegistry holds the state of a Subscriber's subscriptions.
type healthRegistry struct {
	mu   sync.Mutex
	subs []*subscriptionHealth
}

// add registers a subscription that is starting, dropping ended ones of the
// same stream and group, and the oldest ended ones past maxEndedKept.
func (r *healthRegistry) add(topic, stream, group string) *subscriptionHealth {
	h := &subscriptionHealth{st: SubscriptionStatus{Topic: topic, Stream: stream, Group: group}}
	r.mu.Lock()
	defer r.mu.Unlock()
	ended := 0
	r.subs = slices.DeleteFunc(r.subs, func(o *subscriptionHealth) bool {
		st := o.status()
		if !st.Ended {
			return false
		}
		ended++
		return st.Stream == stream && st.Group == group
	})
	for ended > maxEndedKept {
		i := slices.IndexFunc(r.subs, func(o *subscriptionHealth) bool { return o.status().Ended })
		r.subs = slices.Delete(r.subs, i, i+1)
		ended--
	}
	r.subs = append(r.subs, h)
	return h
}

// remove forgets a subscription that never started.
func (r *healthRegistry) remove(h *subscriptionHealth) {
	r.mu.Lock()
	r.subs = slices.DeleteFunc(r.subs, func(o *subscriptionHealth) bool { return o == h })
	r.mu.Unlock()
}

// Subscriptions returns the state of the Subscriber's subscriptions: those
// running or starting, and the last ones that ended. It is cheap enough to
// call on every probe or scrape.
func (s *Subscriber) Subscriptions() []SubscriptionStatus {
	s.health.mu.Lock()
	defer s.health.mu.Unlock()
	out := make([]SubscriptionStatus, len(s.health.subs))
	for i, h := range s.health.subs {
		out[i] = h.status()
	}
	return out
}

// HealthConfig configures a [HealthCheck].
type HealthConfig struct {
	// Subscribers are the Subscribers to check. Required, at least one.
	Subscribers []*Subscriber

	// FailingFor is how long a subscription's calls to the server may keep
	// failing (the loop backs off and retries meanwhile) before it is
	// reported unhealthy. Default: DefaultHealthFailingFor.
	FailingFor time.Duration
}

func (c *HealthConfig) setDefaults() {
	if c.FailingFor == 0 {
		c.FailingFor = DefaultHealthFailingFor
	}
}

// Validate reports the first problem with the configuration, as an error
// that wraps [ErrInvalidConfig] and names the field.
func (c HealthConfig) Validate() error {
	c.setDefaults()
	switch {
	case len(c.Subscribers) == 0:
		return fmt.Errorf("%w: HealthConfig.Subscribers is empty: pass the Subscribers to check", ErrInvalidConfig)
	case slices.Contains(c.Subscribers, nil):
		return fmt.Errorf("%w: HealthConfig.Subscribers holds a nil Subscriber", ErrInvalidConfig)
	case c.FailingFor < 0:
		return fmt.Errorf("%w: HealthConfig.FailingFor is %s: it must be positive (or 0 for the default, %s)",
			ErrInvalidConfig, c.FailingFor, DefaultHealthFailingFor)
	}
	return nil
}

// HealthCheck judges the health of Subscribers for liveness and readiness
// probes. It is safe for concurrent use.
type HealthCheck struct {
	config HealthConfig
}

// NewHealthCheck returns a HealthCheck, or an error wrapping
// ErrInvalidConfig that names the bad field.
func NewHealthCheck(config HealthConfig) (*HealthCheck, error) {
	config.setDefaults()
	if err := config.Validate(); err != nil {
		return nil, err
	}
	config.Subscribers = slices.Clone(config.Subscribers)
	return &HealthCheck{config: config}, nil
}

// HealthReport is the outcome of a [HealthCheck].
type HealthReport struct {
	// Healthy is false when a Subscriber was closed, a subscription's loop
	// has ended, or a subscription's calls to the server have been failing
	// for longer than FailingFor. Problems says which and why.
	Healthy bool `json:"healthy"`
	// Ready is true when every subscription is ready (its group door has
	// passed) and there is at least one.
	Ready bool `json:"ready"`
	// Problems lists, for people, what makes the report unhealthy or not
	// ready.
	Problems      []string             `json:"problems,omitempty"`
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
}

// Check returns the health of the Subscribers now.
func (h *HealthCheck) Check() HealthReport {
	now := time.Now()
	r := HealthReport{Healthy: true, Ready: true, Subscriptions: []SubscriptionStatus{}}
	for _, s := range h.config.Subscribers {
		if s.isClosed() {
			r.Healthy, r.Ready = false, false
			r.Problems = append(r.Problems, "a subscriber is closed")
		}
		for _, st := range s.Subscriptions() {
			r.Subscriptions = append(r.Subscriptions, st)
			name := describe(st)
			switch {
			case st.Ended:
				r.Healthy, r.Ready = false, false
				r.Problems = append(r.Problems, name+" has ended")
			case !st.FailingSince.IsZero() && now.Sub(st.FailingSince) > h.config.FailingFor:
				r.Healthy = false
				r.Problems = append(r.Problems, fmt.Sprintf("%s: calls to the server have been failing for %s (%d failures), last: %s",
					name, now.Sub(st.FailingSince).Round(time.Second), st.Failures, st.LastError))
			case !st.Ready:
				r.Ready = false
				r.Problems = append(r.Problems, name+" is not ready: its group door has not passed")
			}
		}
	}
	if len(r.Subscriptions) == 0 {
		r.Ready = false
		r.Problems = append(r.Problems, "no subscriptions yet")
	}
	return r
}

func describe(st SubscriptionStatus) string {
	if st.Group == "" {
		return fmt.Sprintf("subscription to stream %q (fan-out)", st.Stream)
	}
	return fmt.Sprintf("subscription to stream %q (group %q, consumer %q)", st.Stream, st.Group, st.Consumer)
}

// LiveHandler returns an http.Handler for a liveness probe: status 200 when
// the report is healthy, 503 when not, with the report as JSON.
func (h *HealthCheck) LiveHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r := h.Check()
		writeReport(w, r, r.Healthy)
	})
}

// ReadyHandler returns an http.Handler for a readiness probe: status 200
// when the report is ready and healthy, 503 when not, with the report as
// JSON.
func (h *HealthCheck) ReadyHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		r := h.Check()
		writeReport(w, r, r.Ready && r.Healthy)
	})
}

func writeReport(w http.ResponseWriter, r HealthReport, ok bool) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	_ = json.NewEncoder(w).Encode(r) // a probe that went away needs no answer
}
