package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// DefaultDeliveryAgeBuckets are the upper bounds, in seconds, of the
// buckets of valkeystream_delivery_age_seconds: 1 ms, then each four times
// the last, up to about 70 minutes.
var DefaultDeliveryAgeBuckets = prometheus.ExponentialBuckets(0.001, 4, 12)

// ages is the histogram of the age of entries at delivery, fed by the
// Subscribers a Collector reports, each through its own ageObserver.
type ages struct {
	vec *prometheus.HistogramVec

	mu       sync.RWMutex // guards byLabels
	byLabels map[ageLabels]prometheus.Observer
}

type ageLabels struct{ subscriber, stream, group string }

func newAges(buckets []float64) *ages {
	return &ages{
		vec: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "valkeystream_delivery_age_seconds",
			Help:    "Age of entries when they are handed to a handler, redeliveries included: this host's clock minus the time in the entry id.",
			Buckets: buckets,
		}, []string{"subscriber", "stream", "group"}),
		byLabels: map[ageLabels]prometheus.Observer{},
	}
}

// observer returns the histogram of one subscriber, stream and group,
// without allocating once it exists.
func (a *ages) observer(l ageLabels) prometheus.Observer {
	a.mu.RLock()
	o, ok := a.byLabels[l]
	a.mu.RUnlock()
	if ok {
		return o
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if o, ok = a.byLabels[l]; !ok {
		o = a.vec.WithLabelValues(l.subscriber, l.stream, l.group)
		a.byLabels[l] = o
	}
	return o
}

// ageObserver is the valkeystream.DeliveryObserver of one Subscriber.
type ageObserver struct {
	ages       *ages
	subscriber string
}

// ObserveDelivery implements valkeystream.DeliveryObserver.
func (o ageObserver) ObserveDelivery(stream, group string, age time.Duration) {
	o.ages.observer(ageLabels{o.subscriber, stream, group}).Observe(age.Seconds())
}
