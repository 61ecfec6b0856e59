// Package partition lays out the partitioned topics of valkeystream: the
// partition of a key, the keys of each partition, and (to come) the
// ownership and membership that give each partition to one subscription of
// a group at a time.
package partition
