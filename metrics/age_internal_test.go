package metrics

import (
	"testing"
	"time"
)

// What the age histogram adds to each delivery: one observation through
// the Collector's DeliveryObserver, for a subscription seen before.
func BenchmarkObserveDelivery(b *testing.B) {
	o := ageObserver{ages: newAges(DefaultDeliveryAgeBuckets), subscriber: "billing"}
	o.ObserveDelivery("orders", "billing", time.Millisecond)
	b.ReportAllocs()
	for b.Loop() {
		o.ObserveDelivery("orders", "billing", 3*time.Millisecond)
	}
}

func TestObserveDeliveryAllocs(t *testing.T) {
	o := ageObserver{ages: newAges(DefaultDeliveryAgeBuckets), subscriber: "billing"}
	o.ObserveDelivery("orders", "billing", time.Millisecond)
	if n := testing.AllocsPerRun(100, func() { o.ObserveDelivery("orders", "billing", time.Second) }); n != 0 {
		t.Errorf("an observation allocates %v times, want 0", n)
	}
}
