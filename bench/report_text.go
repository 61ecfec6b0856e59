package main

// The prose of the report that does not depend on the results.

// howToRun opens the report: how to run the benchmark.
const howToRun = "## How to run\n\n" +
	"```sh\n" +
	"go run -C bench . -out ../docs/benchmarks.md                      # redis-server\n" +
	"go run -C bench . -server valkey-server -out ../docs/benchmarks.md\n" +
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
	"`consume-channel`, `consume-nack`, `memory`), `-sides` (a subset of\n" +
	"`valkeystream`, `watermill-redisstream`, `go-redis`, `gochannel`), `-stall`,\n" +
	"`-cpuprofile`. To see where valkeystream spends its time:\n\n" +
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
	"- Nack: the same as the channel scenario, with both adapters' default Nack\n" +
	"  handling: watermill-redisstream sends the same message again from memory;\n" +
	"  valkeystream claims the entry again on the server (`XCLAIM`, its delivery\n" +
	"  count grows) and delivers it before newer ones.\n\n"

// bounds points to the reading of the results against the targets.
const bounds = "What bounds each figure, with profiles, and how it compares with the\n" +
	"targets: [performance.md](performance.md).\n\n"
