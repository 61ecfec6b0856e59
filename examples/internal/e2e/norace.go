//go:build !race

package e2e

// RaceEnabled is true in a build with the race detector.
const RaceEnabled = false
