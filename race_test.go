//go:build race

package valkeystream_test

const raceEnabled = true
