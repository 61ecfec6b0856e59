// Package compat checks valkeystream against the real watermill-redisstream
// v1.4.x on a private server: entries either library writes are read by the
// other, and a consumer group is taken over from its consumers. It also
// runs the universal suite of the newest Watermill it requires, the root
// module requiring the oldest. It is a
// module of its own so that the library never depends on
// watermill-redisstream. Run its tests from the repository root with
//
//	go test -C compat -race -count=1 ./...
package compat
