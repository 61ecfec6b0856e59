// Package delay moves the delayed messages of valkeystream into their
// streams once they are due, and holds the encoding of a stream entry that
// waits in a sorted set.
//
// A delayed message waits, as one encoded entry ([EncodeEntry]), in a sorted
// set beside its stream, scored by its due time in milliseconds by the
// server's clock. A [Mover] registers the streams a Subscriber subscribes to
// and, on every beat, moves each one's due entries into it with a
// server-side script that appends and removes each entry in one atomic step.
// Publishing them, and the name of the sorted set, are the business of the
// root package.
package delay
