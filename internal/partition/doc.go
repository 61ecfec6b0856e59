// Package partition holds the foundations of valkeystream's partitioned
// topics: the partition of a message's key, the names of each partition's
// keys, and the ownership and membership that give each partition to one
// live subscription of a consumer group at a time, fenced on the server.
//
// # Routing
//
// A topic of n partitions puts a message with a key in partition [Of]: the
// FNV-1a 32-bit hash of the key's UTF-8 bytes, modulo n (the doc of Of has
// the algorithm, for producers in other languages). The Publisher routes a
// message without a key by its UUID, with the same hash.
//
// # Layout
//
// For topic stream key S (no '{' or '}' in it) and n partitions
// (1..[MaxPartitions]), partition i has the hash tag T(i) = S + "#" + i +
// "." + j for the first j = 0, 1, 2, ... whose CRC16 slot (the Redis
// Cluster one, [KeySlot]) lies in [SlotRange](i, n), the middle half of the
// i-th n-th of the 16384 slots. So the partitions spread evenly over the
// slots, and over the masters of a cluster with an even slot split (12
// partitions on 3 masters: 4 each). The keys, with G the group name (':'
// and '%' escaped as %3A and %25):
//
//	S + ":p" + i + "{" + T(i) + "}"    the partition's stream, e.g. orders:p3{orders#3.22} of 12
//	<stream> + ":owner:" + G           "<member>:<epoch>" of its owner in G, with a TTL
//	<stream> + ":epoch:" + G           the count of acquisitions in G (INCR), never reset
//	S + ":members:" + G                the live members of G (a sorted set), in any slot
//	S + ":partitions"                  the topic's partition count (see [Layout.Declare])
//
// Every key of a partition shares its slot, so each script below touches
// one slot. Every key begins with S.
//
// # Protocol
//
// Each subscription of a group is a member with an id of its own, which is
// also its consumer name in each partition stream's group. It beats in the
// membership ([Members.Beat], expiry times from the server's clock) and
// reads the members and the owner records ([Partition.Holder]), and from
// them computes the split with [Rebalance], which every member computes
// alike and which moves only the partitions an even split must move. It
// then, cooperatively:
//   - keeps handling the partitions it owns and is still given;
//   - stops handling a partition it owns and is no longer given, sends its
//     last Acks and releases it ([Ownership.Release]), so the next owner
//     acquires it at once;
//   - acquires each partition it is given and nobody owns
//     ([Partition.Acquire]), which grows the partition's epoch; a
//     partition of a member that died is acquired once its record lapses
//     (the owner TTL), and a member that leaves cleanly also leaves the
//     membership ([Members.Leave]);
//   - renews what it owns, a few times per TTL ([Ownership.Renew]).
//
// A new owner first hands over ([Ownership.HandOver]) every entry left
// pending in the group, whoever holds it, to its own name; then it reads
// its own pending entries (stream order, delivery counts grown by that
// read), and then new entries, one in flight at a time for per-key order.
//
// Every call of an owner on the partition (read, Ack, hand-over, hold, Nack
// claim, hand-back, renewal, release) runs in a script that first checks the
// owner record holds the caller's "<member>:<epoch>": an owner that lost its
// partition (frozen past its TTL, while another acquired it) gets
// [ErrFenced] and changes nothing, so it can neither deliver another entry
// of it nor acknowledge one the new owner holds. The epoch makes two
// ownerships of the same member differ. [Server] is the loop.Server of one
// owned partition, built on those scripts, and [Driver] runs the protocol
// for one subscription, starting a loop for each partition it owns.
//
// What the server cannot see, the owner fences itself: a [Fence] per
// ownership is valid by the process's monotonic clock until two beats
// before the record may lapse with no renewal since, and [HandOver] gives
// the loop's messages to the handlers only while it is, with message
// contexts that end when it is not (checked by the clock at every Err, so
// that a process frozen and thawed learns it before its driver's beat).
package partition
