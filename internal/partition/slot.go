package partition

import "github.com/echomq/valkeystream/internal/slot"

// Slots is the number of hash slots of a Redis (or Valkey) Cluster.
const Slots = slot.Count

// KeySlot returns the cluster hash slot of key, as CLUSTER KEYSLOT answers
// (see internal/slot).
func KeySlot(key string) int { return slot.Of(key) }
