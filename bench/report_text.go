package main

// The prose of the report that does not depend on the results.

// howToRun opens the report: how to run the benchmark.
const howToRun = "## How to run\n\n" +
	"```sh\n" +
	"go run -C bench . -out ../docs/benchmarks.md                      # redis-server\n" +
	"go run -C bench . -server valkey-server -out ../docs/benchmarks.md\n" +
	"go run -C bench . -delays 0,1ms,2ms -distance-sizes 64 -distance-messages 10000 \\\n" +
	"  -out ../docs/benchmarks.md                                       # at three distances\n" +
	"```\n\n" +
	"The program starts its own `redis-server` (or `-server valkey-server`) on a\n" +
	"free loopback port without persistence, runs every scenario for every side,\n" +
	"writes this file and `benchmarks.svg`, and stops the server. `-addr host:port`\n" +
	"uses a running server instead (its keys are deleted after each run; it is\n" +
	"flushed only with `-flush`). A quick check of the harness:\n\n" +
	"```sh\n" +
	"go run -C bench . -reps 1 -sizes 64 -publish-messages 2000 -consume-messages 2000 -memory-entries ''\n" +
	"```\n\n" +
	"Other flags (`go run -C bench . -h`): `-reps`, `-sizes`, `-publish-messages`,\n" +
	"`-consume-messages`, `-memory-entries`, `-scenarios` (a comma-separated subset\n" +
	"of " + "`publish-concurrent`, `publish-single`, `publish-batch`, `consume-router`,\n" +
	"`consume-channel`, `consume-nack`, `transform-router`, `latency`,\n" +
	"`consume-large`, `many-topics`, `partition-cost`, `partition-scale-router`,\n" +
	"`partition-scale-channel`, `memory`), `-sides` (a subset of\n" +
	"`valkeystream`, `watermill-redisstream`, `go-redis`, `gochannel`,\n" +
	"`valkeystream+exactly-once`, `valkeystream+1-partition`,\n" +
	"`valkeystream+8-partitions`), `-stall`, `-cpuprofile`, `-memprofile`, and:\n\n" +
	"- `-delays 0,1ms,2ms`: run every scenario at each network distance. A\n" +
	"  delay above 0 starts a proxy (a child process) in front of the server\n" +
	"  that holds each of the server's replies for that long; requests pass at\n" +
	"  once. Timers here fire about 1 ms late at the earliest, so the delay is\n" +
	"  on one direction only, and the round trip it really gives (the median\n" +
	"  of 101 PINGs through it) is measured and printed next to every figure;\n" +
	"  waits here come out rounded up to whole milliseconds: 1ms gives\n" +
	"  about 1.3 ms and 2ms about 2.6 ms on a 2-core Linux machine.\n" +
	"- `-distance-sizes 64`, `-distance-messages 10000`: at delays above 0, the\n" +
	"  publish and consume scenarios' payload sizes and the most messages per\n" +
	"  run (watermill-redisstream pays a round trip per message: 50,000 of them\n" +
	"  take minutes at a few milliseconds).\n" +
	"- `-latency-rates 1000,10000`, `-latency-duration 5s`: the latency\n" +
	"  scenario's publish rates and how long each lasts.\n" +
	"- `-large-sizes 65536,1048576`, `-large-mib 256`: the consume-large\n" +
	"  scenario's payload sizes and the payload volume of each run.\n" +
	"- `-topics 100` (e.g. `100,1000`), `-topics-period 1s`, `-topics-rounds 5`,\n" +
	"  `-topics-start 30s`: the many-topics scenario's topic counts, one message\n" +
	"  per topic per period for that many periods, and how long to wait for\n" +
	"  every subscription to start before reporting how many did not.\n" +
	"- `-partition-subscriptions 1,2,4,8`, `-partition-messages 20000`: the\n" +
	"  partition-scale scenarios' counts of subscriptions (each on a Subscriber\n" +
	"  and a client of its own, in this process) and messages per run. They run\n" +
	"  a topic of 16 partitions whose messages each carry a partition key of\n" +
	"  their own, with a handler that sleeps 1 ms: through a router per\n" +
	"  subscription (`partition-scale-router`), or read from the channel one at\n" +
	"  a time (`partition-scale-channel`). The clock starts once the\n" +
	"  subscriptions split the partitions evenly, with the first `Publish`.\n" +
	"  `partition-cost` consumes the consume-router corpus on a plain topic and\n" +
	"  on a topic of 1 and of 8 partitions (unkeyed messages), one\n" +
	"  subscription through a router: rate and allocations per message.\n\n" +
	"A quick check of the newer scenarios at two distances:\n\n" +
	"```sh\n" +
	"go run -C bench . -reps 1 -scenarios latency,consume-large,many-topics -delays 0,1ms \\\n" +
	"  -latency-duration 1s -large-mib 16 -topics 20 -topics-rounds 2\n" +
	"```\n\n" +
	"To see where valkeystream spends its time:\n\n" +
	"```sh\n" +
	"go run -C bench . -reps 1 -sizes 64 -scenarios consume-channel -sides valkeystream \\\n" +
	"  -consume-messages 400000 -cpuprofile /tmp/cpu.out > /dev/null\n" +
	"go tool pprof -top -cum -focus valkeystream /tmp/cpu.out\n" +
	"```\n\n"

// method closes the report: how the sides are set up and what is timed.
const method = "## Method\n\n" +
	"- One server serves every side; each side gets its own go-redis client\n" +
	"  (`PoolSize` 128, its connections opened before the clock starts) and its\n" +
	"  own stream per run. The private server is flushed between runs. The\n" +
	"  sides of a scenario run one after another, and their order rotates with\n" +
	"  each repetition.\n" +
	"- Every message carries one metadata entry (`correlation_id`), as in\n" +
	"  ThreeDotsLabs' watermill-benchmark. Messages are made before the clock\n" +
	"  starts; the same UUIDs and payloads go to every side.\n" +
	"- valkeystream: `PublisherConfig{Client}` and\n" +
	"  `SubscriberConfig{Client, ConsumerGroup, Start: StartHead}`, defaults\n" +
	"  otherwise. watermill-redisstream v1.4.5: `PublisherConfig{Client}` and\n" +
	"  `SubscriberConfig{Client, ConsumerGroup, OldestId: \"0\"}` (its default\n" +
	"  start, the head of the stream), its default marshaller, defaults\n" +
	"  otherwise: it reads one entry per `XREADGROUP` and sends one `XACK` per\n" +
	"  message, and its Publish sends one `XADD` round trip per message.\n" +
	"- Publish: the clock runs from the first call to the last return.\n" +
	"- Consume: the topic is pre-filled untimed (each side's own encoding;\n" +
	"  watermill-redisstream's entries are pipelined with its own marshaller),\n" +
	"  then the clock runs from `Subscribe` (or `Router.Run`) to the moment the\n" +
	"  last message was handled. The router runs with no middleware and a\n" +
	"  handler that returns nil. The channel scenarios Ack each message as it\n" +
	"  arrives. gochannel runs in persistent mode, so that `Subscribe` replays\n" +
	"  the pre-filled messages; it starts one goroutine per stored message, and\n" +
	"  on a loaded machine that can leave it behind an adapter.\n" +
	"- The memory scenario runs first, before the others have left anything in\n" +
	"  the heap (the Go runtime keeps the descriptor of every goroutine that\n" +
	"  ever ran).\n" +
	"- Network distance: with `-delays`, a proxy in a child process forwards\n" +
	"  each connection to the server and releases each chunk of the server's\n" +
	"  replies at its arrival plus the delay (a queue per connection, not a\n" +
	"  sleep per chunk, so chunks in flight overlap as on a real link). The\n" +
	"  round trip in every table is the median of 101 PINGs through it at the\n" +
	"  start of that distance's runs. The admin client that checks and cleans\n" +
	"  up after each run goes straight to the server.\n" +
	"- Latency: one handler on a router; the side's own publisher (gochannel:\n" +
	"  not persistent) publishes on a fixed schedule from 64 goroutines, one\n" +
	"  message per call. Percentiles are by nearest rank.\n" +
	"- Large payloads: the parent pre-fills the stream; a child process (this\n" +
	"  program again) makes its own client and subscriber and consumes through\n" +
	"  a router; its peak RSS is the kernel's figure for that process.\n" +
	"- Many topics: the subscriber's client has go-redis' default options\n" +
	"  (pool of 10 per CPU); the publisher has its own client. A router that\n" +
	"  could not start every handler cannot close cleanly (Watermill counts a\n" +
	"  handler that never subscribed as running), so such a run may leave two\n" +
	"  of the router's goroutines behind.\n" +
	"- Transform (`transform-router`): a router handler on the side's\n" +
	"  Subscriber returns one output per input (the input's UUID, payload and\n" +
	"  correlation metadata), which the router publishes to an output topic\n" +
	"  through the side's Publisher, then Acks the input: the plain\n" +
	"  at-least-once path. `valkeystream+exactly-once` is the same handler\n" +
	"  under `ExactlyOnce` (`ExactlyOnceConfig{Publisher}`), which writes the\n" +
	"  output and the input's `XACK` in one script, one round trip per input.\n" +
	"  valkeystream's Subscriber and Publisher share one client (ExactlyOnce\n" +
	"  needs it; the plain side does the same); watermill-redisstream's each\n" +
	"  have their own. A message counts as handled once its output is written:\n" +
	"  when `Publish` returned, or when the exactly-once step committed. After\n" +
	"  the run the output topic must hold one entry per input. Allocations\n" +
	"  per message are the whole process' heap allocations\n" +
	"  (`runtime.MemStats`) in the timed part, over the messages.\n" +
	"- Nack: the same as the channel scenario, with both adapters' default Nack\n" +
	"  handling: watermill-redisstream sends the same message again from memory;\n" +
	"  valkeystream claims the entry again on the server (`XCLAIM`, its delivery\n" +
	"  count grows) and delivers it before newer ones.\n\n"

// bounds points to the reading of the results against the targets.
const bounds = "What bounds each figure, with profiles, and how it compares with the\n" +
	"targets: [performance.md](performance.md).\n\n"
