package metrics_test

import (
	"log"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/echomq/valkeystream"
	"github.com/echomq/valkeystream/metrics"
)

// A service that consumes "orders" exports its counters, the state of its
// group on the server, and liveness and readiness probes.
func ExampleNewCollector() {
	client := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379"})
	sub, err := valkeystream.NewSubscriber(valkeystream.SubscriberConfig{
		Client: client, ConsumerGroup: "billing", Start: valkeystream.StartNew,
	}, nil)
	if err != nil {
		log.Fatal(err)
	}
	collector, err := metrics.NewCollector(metrics.Config{Client: client})
	if err != nil {
		log.Fatal(err)
	}
	if err := collector.AddSubscriber("billing", sub); err != nil {
		log.Fatal(err)
	}
	registry := prometheus.NewRegistry()
	registry.MustRegister(collector)

	health, err := valkeystream.NewHealthCheck(valkeystream.HealthConfig{Subscribers: []*valkeystream.Subscriber{sub}})
	if err != nil {
		log.Fatal(err)
	}
	http.Handle("/metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	http.Handle("/livez", health.LiveHandler())
	http.Handle("/readyz", health.ReadyHandler())
	log.Fatal(http.ListenAndServe(":9090", nil))
}
