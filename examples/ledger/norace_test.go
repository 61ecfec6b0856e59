//go:build !race

package main

// raceEnabled is true in a build with the race detector.
const raceEnabled = false
