// Package testserver provides a Redis-protocol server (Redis or Valkey) for
// the tests of the valkeystream library.
//
// Start picks, in order: an already running server named by the
// VALKEYSTREAM_TEST_ADDR environment variable; a private server process
// started from a redis-server or valkey-server binary (or the binary named by
// VALKEYSTREAM_TEST_SERVER); a "redis:7.2" container when a Docker engine is
// reachable. Private processes and containers run with an append-only file
// fsynced on every write, so acknowledged writes survive Kill, Restart and
// the command returned by RestartCommand.
//
// A private process that stops without being asked (SIGKILL from outside,
// as RestartCommand and the OOM killer do) is started again on the same port
// and directory. One that crashed by itself (a server bug report in its log,
// or any other signal or exit) is started again too, and fails the test,
// with the report: what the test sent may have crashed it.
//
// StartCluster and StartSentinel start, from the same binary, a Redis
// Cluster (three masters, three replicas) and a Sentinel group (a master, a
// replica, three sentinels) whose nodes can be killed, frozen and failed
// over.
//
// NewProxy puts a TCP proxy between a client and a server to play network
// faults: Cut holds every byte both ways (a silent partition) until Heal
// delivers them, Reset ends every connection with a reset, and ResetEvery
// runs a bounded storm of resets.
package testserver
